//! Upstream's hostPath specs (`test/e2e/common/storage/host_path.go`) on one
//! joined kubelet. Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).
//! The volumes are the host's /tmp, as upstream's; the files the specs write
//! there are removed before and after, while the test holds the host's /tmp
//! lock and the kubelet lock.

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// `testPodWithHostVol`: two containers mounting hostPath `/tmp` at /test-volume.
fn host_vol_pod(privileged: bool, args1: &[&str], args2: &[&str]) -> Value {
    let c = |name: &str, args: &[&str]| {
        let mut c = mounttest(
            name,
            args,
            json!([mount("test-volume", "/test-volume", false)]),
        );
        c["volumeMounts"][0]
            .as_object_mut()
            .expect("mount")
            .remove("readOnly");
        c["securityContext"] = json!({"privileged": privileged});
        c
    };
    json!({"spec": {
        "containers": [c("test-container-1", args1), c("test-container-2", args2)],
        "restartPolicy": "Never",
        "volumes": [{"name": "test-volume", "hostPath": {"path": "/tmp"}}],
    }})
}

const MODE: &str = "should give a volume the correct mode [LinuxOnly]";
const RW: &str = "should support r/w";
const SUB_PATH: &str = "should support subPath";

fn clean_host() {
    let _ = std::fs::remove_file("/tmp/test-file");
    let _ = std::fs::remove_dir_all("/tmp/sub-path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_path_specs() {
    // The host's /tmp is shared with the other test lane (tests/lane.rs):
    // its lock first, then the lane's kubelet lock (taken by the suite).
    let _tmp = kubelet_rs_integration::lane::host_lock("tmp").await;
    let s = Suite::start().await;
    // Only while this test holds the locks: another test process may be
    // running these specs on the same /tmp.
    clean_host();
    // The first container checks the mode; the second runs `mounttest` without flags.
    s.pod(
        MODE,
        "hp-mode",
        host_vol_pod(
            false,
            &["--fs_type=/test-volume", "--file_mode=/test-volume"],
            &[],
        ),
    )
    .await;
    let f = "/test-volume/test-file";
    s.pod(
        RW,
        "hp-rw",
        host_vol_pod(
            true,
            &[&format!("--new_file_0644={f}"), &format!("--file_mode={f}")],
            &[&format!("--file_content_in_loop={f}"), "--retry_time=180"],
        ),
    )
    .await;
    let mut sub = host_vol_pod(
        true,
        &[&format!("--new_file_0644={f}"), &format!("--file_mode={f}")],
        &[
            "--file_content_in_loop=/test-volume/sub-path/test-file",
            "--retry_time=180",
        ],
    );
    sub["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("sub-path");
    s.pod(SUB_PATH, "hp-subpath", sub).await;

    s.wait_all(&["hp-mode", "hp-rw", "hp-subpath"], POD_TIMEOUT, terminal)
        .await;
    // Upstream's regexp `mode of file "/test-volume": dg?trwxrwx`.
    s.expect_output(
        MODE,
        "hp-mode",
        "test-container-1",
        &[Want::Line(
            "mode of file \"/test-volume\": dg?trwxrwx".into(),
            |l| {
                l.strip_prefix("mode of file \"/test-volume\": ")
                    .is_some_and(|m| m.starts_with("dtrwxrwx") || m.starts_with("dgtrwxrwx"))
            },
        )],
    );
    s.expect_output(
        RW,
        "hp-rw",
        "test-container-2",
        &[Want::has(
            "content of file \"/test-volume/test-file\": mount-tester new file",
        )],
    );
    s.expect_output(
        SUB_PATH,
        "hp-subpath",
        "test-container-2",
        &[Want::has(
            "content of file \"/test-volume/sub-path/test-file\": mount-tester new file",
        )],
    );
    clean_host();
    s.finish("volumes_hostpath").await;
}
