//! Volumes of API pods on real containerd through the apiserver double,
//! beyond upstream's conformance specs: a Secret volume is a tmpfs and
//! never touches the disk, a subPath symlink pointing out of its volume is
//! refused, a ConfigMap update reaches the mounted file through the
//! per-object watch, the `kube-api-access-*` volume of 1.21+ clusters, and
//! a pod deleted with its Secret while the kubelet is down, whose volume is
//! torn down after the restart without the Secret.

use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubelet_rs_integration::cluster::{Joined, phase};
use kubelet_rs_integration::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

fn waiting(p: Option<&Value>) -> Option<(String, String)> {
    let w = &p?["status"]["containerStatuses"][0]["state"]["waiting"];
    Some((
        w["reason"].as_str()?.to_string(),
        w["message"].as_str().unwrap_or("").to_string(),
    ))
}

fn uid(p: &Option<Value>) -> String {
    p.as_ref()
        .and_then(|p| p["metadata"]["uid"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_tmpfs_subpath_escapes_are_refused_and_config_map_updates_arrive() {
    let j = Joined::start(Options::default()).await;
    let ns = "default";
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(j.admin.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "conf"}, "data": {"key": "one"}
    }))
    .expect("cm");
    let cms = Api::<ConfigMap>::namespaced(j.admin.clone(), ns);
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create cm");

    j.create_pod(
        "vols",
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["sh", "-c", "while true; do sleep 1; done"],
                "volumeMounts": [
                    {"name": "s", "mountPath": "/etc/secret"},
                    {"name": "c", "mountPath": "/etc/conf"}]}],
            "volumes": [
                {"name": "s", "secret": {"secretName": "creds"}},
                {"name": "c", "configMap": {"name": "conf"}}]
        }),
    )
    .await;
    // The init container plants a symlink to the host's /etc in the emptyDir;
    // the app container asks for it as its subPath.
    j.create_pod(
        "escape",
        json!({
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{"name": "plant", "image": BUSYBOX,
                "command": ["sh", "-c", "ln -s /etc /data/escape"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/host-etc", "subPath": "escape"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }),
    )
    .await;

    // A key the ConfigMap lacks: this pod waits with upstream's message,
    // and nothing else on the node notices.
    j.create_pod(
        "missing-key",
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "nope"}}}]}]
        }),
    )
    .await;

    let p = j
        .wait_api("vols", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dir = j.node.root_dir().join("pods").join(uid(&p)).join("volumes");
    let secret_dir = dir.join("kubernetes.io~secret/s");
    let fs = kubelet_volume::mount::fs_type(&secret_dir)
        .await
        .expect("mountinfo");
    assert_eq!(fs.as_deref(), Some("tmpfs"), "the Secret volume is a tmpfs");
    assert_eq!(
        std::fs::read_to_string(secret_dir.join("password")).expect("secret file"),
        "hunter2"
    );
    let conf = dir.join("kubernetes.io~configmap/c/key");
    assert_eq!(std::fs::read_to_string(&conf).expect("cm file"), "one");

    // An update reaches the file through the ConfigMap's own watch.
    let changed = tokio::time::Instant::now();
    cms.patch(
        "conf",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"key": "two"}})),
    )
    .await
    .expect("patch");
    let deadline = changed + Duration::from_secs(30);
    while std::fs::read_to_string(&conf).ok().as_deref() != Some("two") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the update never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "configMap update reached the mounted file after {:?}",
        changed.elapsed()
    );

    let p = j
        .wait_api("escape", T, "refused", |p| {
            waiting(p).is_some_and(|(r, _)| r == "CreateContainerConfigError")
        })
        .await;
    let (_, message) = waiting(p.as_ref()).expect("waiting");
    assert_eq!(
        message,
        "failed to prepare subPath for volumeMount \"data\" of container \"main\""
    );
    assert_eq!(phase(p.as_ref()), Some("Pending"));

    let p = j
        .wait_api("missing-key", T, "refused", |p| {
            waiting(p).is_some_and(|(r, _)| r == "CreateContainerConfigError")
        })
        .await;
    assert_eq!(
        waiting(p.as_ref()).map(|(_, m)| m),
        Some("couldn't find key nope in ConfigMap default/conf".to_string())
    );
    assert_eq!(phase(j.api_pod("vols").as_ref()), Some("Running"));

    // Deleting the pod unmounts the tmpfs and removes the pod's directory.
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(j.admin.clone(), ns);
    pods.delete(&j.pod_name("vols"), &Default::default())
        .await
        .expect("delete");
    let deadline = tokio::time::Instant::now() + T;
    while dir.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod directory stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    j.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_api_access_volume_has_a_bound_token_the_ca_and_the_namespace() {
    let j = Joined::start(Options {
        service_account_admission: true,
        ..Options::default()
    })
    .await;
    j.create_pod(
        "sa",
        json!({
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c",
                "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; \
                 head -c 20 /var/run/secrets/kubernetes.io/serviceaccount/ca.crt; echo; \
                 cut -c1-3 /var/run/secrets/kubernetes.io/serviceaccount/token; \
                 echo host=$KUBERNETES_SERVICE_HOST port=$KUBERNETES_SERVICE_PORT"]}]
        }),
    )
    .await;
    let p = j
        .wait_api("sa", T, "Succeeded", |p| phase(p) == Some("Succeeded"))
        .await;
    let uid = uid(&p);
    let logs = std::fs::read_to_string(
        kubelet_rs_integration::pod_logs_dir()
            .join(format!("default_{}_{uid}", j.pod_name("sa")))
            .join("main/0.log"),
    )
    .expect("log");
    let out: String = logs
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(out.contains("default\n-----BEGIN CERTIFICA\n"), "{out}");
    assert!(out.contains("\neyJ\n"), "a JWT: {out}");
    assert!(out.contains("host=10.96.0.1 port=443"), "{out}");
    j.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_bound_to_a_local_volume_is_mounted_only_where_its_affinity_allows() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let j = Joined::start(Options::default()).await;
    let disk = tempfile::tempdir().expect("disk");
    std::fs::write(disk.path().join("existing"), "on the disk").expect("write");
    let pv = |name: &str, claim: &str, claim_uid: &str, node: &str| -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local",
                "local": {"path": disk.path()},
                "claimRef": {"namespace": "default", "name": claim, "uid": claim_uid},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}
        }))
        .expect("pv")
    };
    let pvc = |name: &str, volume: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("pvc")
    };
    let node = j.node.name.clone();
    let pvs = Api::<PersistentVolume>::all(j.admin.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(j.admin.clone(), "default");
    for (v, c, n) in [
        ("pv-here", "claim-here", node.as_str()),
        ("pv-there", "claim-there", "another-node"),
    ] {
        let claim = claims
            .create(&PostParams::default(), &pvc(c, v))
            .await
            .expect("pvc");
        let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
        pvs.create(&PostParams::default(), &pv(v, c, &claim_uid, n))
            .await
            .expect("pv");
        // The double has no binder: mark the claim Bound as the controller would.
        claims
            .patch_status(
                c,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})),
            )
            .await
            .expect("bind");
    }
    let pod = |claim: &str| {
        json!({
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", "cat /data/existing && echo written > /data/new"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        })
    };
    j.create_pod("here", pod("claim-here")).await;
    j.create_pod("there", pod("claim-there")).await;
    j.wait_api("here", T, "Succeeded", |p| phase(p) == Some("Succeeded"))
        .await;
    assert_eq!(
        std::fs::read_to_string(disk.path().join("new")).expect("written through the mount"),
        "written\n"
    );
    let p = j
        .wait_api("there", T, "waiting", |p| waiting(p).is_some())
        .await;
    assert_eq!(
        phase(p.as_ref()),
        Some("Pending"),
        "never started on the wrong node"
    );
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.api.list("events");
        let found = events.iter().any(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == j.pod_name("there")
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("MountVolume.NodeAffinity check failed"))
        });
        if found {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no FailedMount event: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    j.cleanup().await;
}

/// Issue 16 point 7: a pod and its Secret are deleted while the kubelet is
/// down (a namespace deletion does that). After the restart the Secret
/// volume found on disk is torn down without its Secret, the kill
/// completes, the pod is gone from the apiserver within a minute, and
/// nothing of it stays mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_with_its_secret_while_the_kubelet_is_down_is_gone_after_the_restart() {
    let mut j = Joined::start(Options::default()).await;
    let ns = "default";
    let secrets = Api::<Secret>::namespaced(j.admin.clone(), ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "token"}, "stringData": {"token": "t0ken"}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    j.create_pod(
        "gone",
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "tok", "mountPath": "/var/run/tok"}]}],
            "volumes": [{"name": "tok", "secret": {"secretName": "token"}}]
        }),
    )
    .await;
    let p = j
        .wait_api("gone", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let pod_dir = j.node.root_dir().join("pods").join(uid(&p));
    let secret_dir = pod_dir.join("volumes/kubernetes.io~secret/tok");
    assert_eq!(
        kubelet_volume::mount::fs_type(&secret_dir)
            .await
            .expect("mountinfo")
            .as_deref(),
        Some("tmpfs")
    );

    j.node.stop().await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(j.admin.clone(), ns);
    pods.delete(&j.pod_name("gone"), &Default::default())
        .await
        .expect("delete pod");
    secrets
        .delete("token", &Default::default())
        .await
        .expect("delete secret");
    assert!(
        j.api_pod("gone")
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "the pod waits for the kubelet"
    );
    j.node.start_again().await;

    j.wait_api("gone", Duration::from_secs(60), "deleted", |p| p.is_none())
        .await;
    let mounted = kubelet_volume::mount::mounts_under_blocking(&pod_dir).expect("mountinfo");
    assert!(mounted.is_empty(), "still mounted: {mounted:?}");
    let deadline = tokio::time::Instant::now() + T;
    while pod_dir.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod directory stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    j.cleanup().await;
}
