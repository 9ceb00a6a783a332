//! Upstream's emptyDir specs (`test/e2e/common/storage/empty_dir.go`) on one
//! joined kubelet. Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// e2epod.InfiniteSleepCommand.
const INFINITE_SLEEP: &str = "trap exit TERM; while true; do sleep 1; done";

/// `testPodWithVolume`: "test-container" with emptyDir "test-volume" at
/// /test-volume, SELinux level s0, runAsUser when uid is not 0.
fn test_pod(uid: i64, memory: bool, args: &[&str]) -> Value {
    let mut p = json!({"spec": {
        "containers": [mounttest("test-container", args, json!([mount("test-volume", "/test-volume", false)]))],
        "securityContext": {"seLinuxOptions": {"level": "s0"}},
        "restartPolicy": "Never",
        "volumes": [{"name": "test-volume", "emptyDir": if memory { json!({"medium": "Memory"}) } else { json!({}) }}],
    }});
    if uid != 0 {
        p["spec"]["securityContext"]["runAsUser"] = json!(uid);
    }
    p
}

struct Case {
    spec: String,
    short: String,
    pod: Value,
    wants: Vec<String>,
}

fn tmpfs_line(memory: bool, out: &mut Vec<String>) {
    if memory {
        out.push("mount type of \"/test-volume\": tmpfs".into());
    }
}

/// doTestSetgidFSGroup.
fn setgid_fs_group(spec: &str, short: &str, uid: i64, memory: bool) -> Case {
    let f = "/test-volume/test-file";
    let mut pod = test_pod(
        uid,
        memory,
        &[
            "--fs_type=/test-volume",
            &format!("--new_file_0660={f}"),
            &format!("--file_perm={f}"),
            &format!("--file_owner={f}"),
        ],
    );
    pod["spec"]["securityContext"]["fsGroup"] = json!(123);
    let mut wants = vec![
        format!("perms of file \"{f}\": -rw-rw----"),
        format!("content of file \"{f}\": mount-tester new file"),
        format!("owner GID of \"{f}\": 123"),
    ];
    tmpfs_line(memory, &mut wants);
    Case {
        spec: spec.into(),
        short: short.into(),
        pod,
        wants,
    }
}

/// doTestSubPathFSGroup.
fn sub_path_fs_group(spec: &str, short: &str, uid: i64, memory: bool) -> Case {
    let v = "/test-volume";
    let mut pod = test_pod(
        uid,
        memory,
        &[
            &format!("--fs_type={v}"),
            &format!("--file_perm={v}"),
            &format!("--file_owner={v}"),
            &format!("--file_mode={v}"),
        ],
    );
    pod["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("test-sub");
    pod["spec"]["securityContext"]["fsGroup"] = json!(123);
    let mut wants = vec![
        format!("perms of file \"{v}\": -rwxrwxrwx"),
        format!("owner UID of \"{v}\": 0"),
        format!("owner GID of \"{v}\": 123"),
        format!("mode of file \"{v}\": dgtrwxrwxrwx"),
    ];
    tmpfs_line(memory, &mut wants);
    Case {
        spec: spec.into(),
        short: short.into(),
        pod,
        wants,
    }
}

/// doTestVolumeModeFSGroup (fsGroup 1001) and doTestVolumeMode.
fn volume_mode(spec: &str, short: &str, uid: i64, memory: bool, fs_group: bool) -> Case {
    let mut pod = test_pod(
        uid,
        memory,
        &["--fs_type=/test-volume", "--file_perm=/test-volume"],
    );
    if fs_group {
        pod["spec"]["securityContext"]["fsGroup"] = json!(1001);
    }
    let mut wants = vec!["perms of file \"/test-volume\": -rwxrwxrwx".to_string()];
    tmpfs_line(memory, &mut wants);
    Case {
        spec: spec.into(),
        short: short.into(),
        pod,
        wants,
    }
}

/// doTest0644FSGroup (fsGroup 123) and doTest0644/0666/0777.
fn new_file(spec: &str, short: &str, uid: i64, memory: bool, perm: &str, fs_group: bool) -> Case {
    let f = "/test-volume/test-file";
    let mut pod = test_pod(
        uid,
        memory,
        &[
            "--fs_type=/test-volume",
            &format!("--new_file_0{perm}={f}"),
            &format!("--file_perm={f}"),
        ],
    );
    if fs_group {
        pod["spec"]["securityContext"]["fsGroup"] = json!(123);
    }
    let mode = match perm {
        "644" => "-rw-r--r--",
        "666" => "-rw-rw-rw-",
        _ => "-rwxrwxrwx",
    };
    let mut wants = vec![
        format!("perms of file \"{f}\": {mode}"),
        format!("content of file \"{f}\": mount-tester new file"),
    ];
    tmpfs_line(memory, &mut wants);
    Case {
        spec: spec.into(),
        short: short.into(),
        pod,
        wants,
    }
}

async fn mounttest_specs(s: &Suite) {
    let g = "when FSGroup is specified [LinuxOnly] ";
    let mut cases = vec![
        setgid_fs_group(
            &format!(
                "{g}new files should be created with FSGroup ownership when container is root"
            ),
            "ed-setgid-root",
            0,
            true,
        ),
        setgid_fs_group(
            &format!(
                "{g}new files should be created with FSGroup ownership when container is non-root"
            ),
            "ed-setgid-nonroot",
            1001,
            true,
        ),
        sub_path_fs_group(
            &format!(
                "{g}nonexistent volume subPath should have the correct mode and owner using FSGroup"
            ),
            "ed-subpath",
            1001,
            true,
        ),
        new_file(
            &format!("{g}files with FSGroup ownership should support (root,0644,tmpfs)"),
            "ed-fsg-0644",
            0,
            true,
            "644",
            true,
        ),
        volume_mode(
            &format!("{g}volume on default medium should have the correct mode using FSGroup"),
            "ed-fsg-mode-default",
            0,
            false,
            true,
        ),
        volume_mode(
            &format!("{g}volume on tmpfs should have the correct mode using FSGroup"),
            "ed-fsg-mode-tmpfs",
            0,
            true,
            true,
        ),
        volume_mode(
            "volume on tmpfs should have the correct mode [LinuxOnly]",
            "ed-mode-tmpfs",
            0,
            true,
            false,
        ),
        volume_mode(
            "volume on default medium should have the correct mode [LinuxOnly]",
            "ed-mode-default",
            0,
            false,
            false,
        ),
    ];
    for (medium, memory) in [("tmpfs", true), ("default", false)] {
        for (who, uid) in [("root", 0), ("non-root", 1001)] {
            for perm in ["644", "666", "777"] {
                cases.push(new_file(
                    &format!("should support ({who},0{perm},{medium}) [LinuxOnly]"),
                    &format!("ed-{who}-{perm}-{medium}"),
                    uid,
                    memory,
                    perm,
                    false,
                ));
            }
        }
    }
    for c in &cases {
        s.pod(&c.spec, &c.short, c.pod.clone()).await;
    }
    let names: Vec<&str> = cases.iter().map(|c| c.short.as_str()).collect();
    s.wait_all(&names, POD_TIMEOUT, terminal).await;
    for c in &cases {
        let wants: Vec<Want> = c.wants.iter().map(|w| Want::has(w.clone())).collect();
        s.expect_output(&c.spec, &c.short, "test-container", &wants);
    }
}

const SHARED: &str = "pod should support shared volumes between containers";

async fn shared_volumes(s: &Suite) {
    let mut main = busybox("busybox-main-container", &["/bin/sh"]);
    main["args"] = json!(["-c", INFINITE_SLEEP]);
    main["volumeMounts"] = json!([mount("shared-data", "/usr/share/volumeshare", false)]);
    let mut sub = busybox("busybox-sub-container", &["/bin/sh"]);
    sub["args"] = json!([
        "-c",
        "echo Hello from the busy-box sub-container > /pod-data/shareddata.txt"
    ]);
    sub["volumeMounts"] = json!([mount("shared-data", "/pod-data", false)]);
    let pod = json!({"spec": {
        "volumes": [{"name": "shared-data", "emptyDir": {}}],
        "containers": [main, sub],
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    }});
    if !s.pod(SHARED, "ed-sharedvolume", pod).await
        || !s.wait_running(SHARED, "ed-sharedvolume", POD_TIMEOUT).await
    {
        return;
    }
    // The sub container may still be writing when the pod turns Running.
    let deadline = tokio::time::Instant::now() + UPDATE_TIMEOUT;
    loop {
        let r = s
            .exec(
                "ed-sharedvolume",
                "busybox-main-container",
                &["/bin/sh", "-c", "cat /usr/share/volumeshare/shareddata.txt"],
            )
            .await;
        match r {
            Ok((0, out, _)) if out.trim() == "Hello from the busy-box sub-container" => return,
            other if tokio::time::Instant::now() >= deadline => {
                s.fail(
                    SHARED,
                    format!("reading the shared file from the main container: {other:?}"),
                );
                return;
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    }
}

const SIZED: &str = "pod should support memory backed volumes of specified size";

async fn sized_memory_volume(s: &Suite) {
    let mut main = busybox("busybox-main-container", &["/bin/sh"]);
    main["args"] = json!(["-c", INFINITE_SLEEP]);
    main["volumeMounts"] = json!([mount("shared-data", "/usr/share/volumeshare", false)]);
    let pod = json!({"spec": {
        "volumes": [{"name": "shared-data", "emptyDir": {"medium": "Memory", "sizeLimit": "10Mi"}}],
        "containers": [main],
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    }});
    if !s.pod(SIZED, "ed-size-memory-volume", pod).await
        || !s
            .wait_running(SIZED, "ed-size-memory-volume", POD_TIMEOUT)
            .await
    {
        return;
    }
    match s
        .exec(
            "ed-size-memory-volume",
            "busybox-main-container",
            &[
                "/bin/sh",
                "-c",
                "df | grep /usr/share/volumeshare | awk '{print $2}'",
            ],
        )
        .await
    {
        Ok((_, out, _)) if out.trim() == "10240" => {}
        other => s.fail(
            SIZED,
            format!("df of the volume: expected \"10240\", got {other:?}"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_dir_specs() {
    let s = Suite::start().await;
    tokio::join!(
        mounttest_specs(&s),
        shared_volumes(&s),
        sized_memory_volume(&s)
    );
    s.finish("volumes_emptydir").await;
}
