//! The watch-based managers against the apiserver double.

use std::collections::BTreeMap;

use kube::api::PostParams;
use kubelet_test_util::Cluster;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

fn pod(uid: &str, config_maps: &[&str]) -> Pod {
    let volumes: Vec<serde_json::Value> = config_maps
        .iter()
        .enumerate()
        .map(|(i, cm)| serde_json::json!({"name": format!("v{i}"), "configMap": {"name": cm}}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("pod-{uid}"), "namespace": "default", "uid": uid},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}], "volumes": volumes}
    }))
    .unwrap()
}

fn config_map(name: &str, value: &str, immutable: bool) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
        immutable: immutable.then_some(true),
        ..Default::default()
    }
}

fn value(cm: &ConfigMap) -> &str {
    cm.data
        .as_ref()
        .and_then(|d| d.get("k"))
        .map(String::as_str)
        .unwrap_or("")
}

struct Env {
    cluster: Cluster,
    admin: Api<ConfigMap>,
    manager: ConfigMapManager,
    tasks: TaskTracker,
    stop: CancellationToken,
}

async fn env() -> Env {
    let cluster = Cluster::start(Default::default()).await;
    let admin = Api::namespaced(cluster.admin().await, "default");
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let manager = ConfigMapManager::new(Some(cluster.node_client("n1").await), &tasks, &stop);
    Env {
        cluster,
        admin,
        manager,
        tasks,
        stop,
    }
}

impl Env {
    /// Creates `pod` (bound to n1, so the Node authorizer lets n1 read what
    /// it references) and registers it.
    async fn bind(&self, pod: &Pod) -> Pod {
        let pods: Api<Pod> = Api::namespaced(self.cluster.admin().await, "default");
        let created = pods
            .create(&PostParams::default(), pod)
            .await
            .expect("create pod");
        self.manager.register_pod(&created);
        created
    }

    async fn create(&self, cm: &ConfigMap) {
        self.admin
            .create(&PostParams::default(), cm)
            .await
            .expect("create configmap");
    }

    async fn update(&self, name: &str, v: &str) {
        let mut cm = self.admin.get(name).await.expect("get configmap");
        cm.data = Some(BTreeMap::from([("k".to_string(), v.to_string())]));
        self.admin
            .replace(name, &PostParams::default(), &cm)
            .await
            .expect("replace configmap");
    }

    /// Waits until no watch task runs.
    async fn watches_stopped(&self) {
        self.watches_running(0).await;
    }

    /// Waits until `n` watch tasks run.
    async fn watches_running(&self, n: usize) {
        tokio::time::timeout(WAIT, async {
            while self.tasks.len() != n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the watch tasks start or end");
    }

    /// Configmap requests that were not by name.
    fn unselected_configmap_reads(&self) -> Vec<String> {
        self.cluster
            .api
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/configmaps"))
            .filter(|r| !r.query.contains("fieldSelector=metadata.name"))
            .map(|r| format!("{}?{}", r.path, r.query))
            .collect()
    }
}

async fn next_change(rx: &mut broadcast::Receiver<ObjectKey>) -> ObjectKey {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a change notification in time")
        .expect("channel open")
}

#[tokio::test]
async fn an_update_is_announced_and_read_from_the_watch() {
    let e = env().await;
    e.create(&config_map("cm", "v1", false)).await;
    e.bind(&pod("u1", &["cm"])).await;
    assert_eq!(e.manager.watched(), [ObjectKey::new("default", "cm")]);
    let cm = e.manager.get_object("default", "cm").await.unwrap();
    assert_eq!(value(&cm), "v1");

    let mut rx = e.manager.subscribe();
    e.update("cm", "v2").await;
    assert_eq!(next_change(&mut rx).await, ObjectKey::new("default", "cm"));
    let cm = e.manager.get_object("default", "cm").await.unwrap();
    assert_eq!(value(&cm), "v2");

    e.admin
        .delete("cm", &Default::default())
        .await
        .expect("delete");
    assert_eq!(next_change(&mut rx).await, ObjectKey::new("default", "cm"));
    let err = e.manager.get_object("default", "cm").await.unwrap_err();
    assert!(
        matches!(&err, ObjectError::NotFound { resource: "configmap", name } if name == "cm"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "configmap \"cm\" not found");
    assert_eq!(e.unselected_configmap_reads(), Vec::<String>::new());
    e.stop.cancel();
}

#[tokio::test]
async fn a_missing_object_is_not_found_until_it_is_created() {
    let e = env().await;
    e.bind(&pod("u1", &["later"])).await;
    let err = e.manager.get_object("default", "later").await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    let mut rx = e.manager.subscribe();
    e.create(&config_map("later", "v1", false)).await;
    assert_eq!(
        next_change(&mut rx).await,
        ObjectKey::new("default", "later")
    );
    let cm = e.manager.get_object("default", "later").await.unwrap();
    assert_eq!(value(&cm), "v1");
    e.stop.cancel();
}

#[tokio::test]
async fn the_watch_stops_with_the_last_reference() {
    let e = env().await;
    e.create(&config_map("shared", "v1", false)).await;
    e.create(&config_map("own", "v1", false)).await;
    let a = e.bind(&pod("a", &["shared", "own", "nope"])).await;
    let b = e.bind(&pod("b", &["shared"])).await;
    // Registering again changes nothing.
    e.manager.register_pod(&b);
    assert_eq!(e.tasks.len(), 3, "one watch per object");

    e.manager.unregister_pod(&a);
    assert_eq!(e.manager.watched(), [ObjectKey::new("default", "shared")]);
    e.manager.unregister_pod(&b);
    assert!(e.manager.watched().is_empty());
    e.watches_stopped().await;

    // Unreferenced objects are still read, by one GET each.
    let cm = e.manager.get_object("default", "own").await.unwrap();
    assert_eq!(value(&cm), "v1");
    let err = e.manager.get_object("default", "nope").await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(e.tasks.is_empty(), "reads start no watch");
    e.stop.cancel();
}

#[tokio::test]
async fn a_pod_update_moves_its_references() {
    let e = env().await;
    e.manager.register_pod(&pod("a", &["old"]));
    e.manager.register_pod(&pod("a", &["new"]));
    assert_eq!(e.manager.watched(), [ObjectKey::new("default", "new")]);
    e.watches_running(1).await;
    e.manager.unregister_pod(&pod("a", &[]));
    assert!(e.manager.watched().is_empty());
    e.watches_stopped().await;
    e.stop.cancel();
}

#[tokio::test]
async fn an_immutable_objects_watch_stops_after_a_read() {
    let e = env().await;
    e.create(&config_map("frozen", "v1", true)).await;
    e.bind(&pod("a", &["frozen"])).await;
    let cm = e.manager.get_object("default", "frozen").await.unwrap();
    assert_eq!(value(&cm), "v1");
    e.watches_stopped().await;
    assert_eq!(e.manager.watched(), [ObjectKey::new("default", "frozen")]);
    let cm = e.manager.get_object("default", "frozen").await.unwrap();
    assert_eq!(value(&cm), "v1", "the cached copy stays");
    e.stop.cancel();
}

fn versioned(v: &str, rv: &str) -> ConfigMap {
    let mut cm = config_map("cm", v, false);
    cm.metadata.resource_version = Some(rv.into());
    cm
}

#[test]
fn only_changes_after_the_first_list_are_announced() {
    let c: Cache<ConfigMap> = Cache::new();
    assert!(
        !c.store(Some(versioned("v1", "1"))),
        "the first list is no change"
    );
    c.synced.send_replace(true);
    assert!(
        !c.store(Some(versioned("v1", "1"))),
        "a relist of the same version"
    );
    assert!(c.store(Some(versioned("v2", "2"))), "a new version");
    assert!(c.store(None), "deleted");
    assert!(!c.store(None), "still deleted");
    assert!(c.store(Some(versioned("v3", "3"))), "created again");
}

#[tokio::test]
async fn stop_ends_every_watch() {
    let e = env().await;
    e.manager.register_pod(&pod("a", &["x", "y"]));
    assert_eq!(e.tasks.len(), 2);
    e.stop.cancel();
    e.watches_stopped().await;
}

#[tokio::test]
async fn standalone_reads_fail_with_no_client() {
    let tasks = TaskTracker::new();
    let m = SecretManager::new(None, &tasks, &CancellationToken::new());
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "c"}], "imagePullSecrets": [{"name": "pull"}]}
    }))
    .unwrap();
    m.register_pod(&p);
    assert!(tasks.is_empty(), "no watch without an apiserver");
    let err = m.get_object("ns", "pull").await.unwrap_err();
    assert!(
        matches!(&err, ObjectError::NoClient { resource: "secret", namespace, name } if namespace == "ns" && name == "pull"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_watch_that_cannot_list_fails_reads_after_the_sync_timeout() {
    let e = env().await;
    // Not bound to n1: the Node authorizer refuses the watch.
    let m = e
        .manager
        .clone()
        .with_sync_timeout(Duration::from_millis(300));
    m.register_pod(&pod("stray", &["cm"]));
    let err = m.get_object("default", "cm").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to sync configmaps cache: timed out waiting for the condition"
    );
    e.stop.cancel();
}

#[tokio::test]
async fn pull_secrets_are_watched_by_the_secret_manager() {
    let e = env().await;
    let admin: Api<Secret> = Api::namespaced(e.cluster.admin().await, "default");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pull", "namespace": "default"},
        "stringData": {".dockerconfigjson": "{}"},
        "type": "kubernetes.io/dockerconfigjson"
    }))
    .unwrap();
    admin
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let pods: Api<Pod> = Api::namespaced(e.cluster.admin().await, "default");
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
            "imagePullSecrets": [{"name": "pull"}]}
    }))
    .unwrap();
    let p = pods.create(&PostParams::default(), &p).await.expect("pod");
    let secrets = SecretManager::new(Some(e.cluster.node_client("n1").await), &e.tasks, &e.stop);
    secrets.register_pod(&p);
    assert_eq!(secrets.watched(), [ObjectKey::new("default", "pull")]);
    let s = secrets.get_object("default", "pull").await.unwrap();
    let data = s.data.unwrap_or_default();
    assert_eq!(
        data.get(".dockerconfigjson").map(|b| b.0.as_slice()),
        Some(&b"{}"[..])
    );
    e.stop.cancel();
}
