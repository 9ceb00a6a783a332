//! The Services watch against apiservers of each supported release: the
//! `spec.clusterIP` field selector only where it exists (1.31+), every
//! Service with headless ones dropped by the kubelet elsewhere.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use kubelet_client::discovery::{Discovery, ServerInfo};
use kubelet_metrics::KubeletMetrics;
use kubelet_test_util::{Cluster, Profile};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::services::{Compat, ServiceLister};

const WAIT: Duration = Duration::from_secs(10);

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let ok = tokio::time::timeout(WAIT, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "{what}");
}

fn names(l: &ServiceLister) -> Vec<String> {
    l.services()
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or(""),
                s.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

async fn service(c: &Cluster, name: &str, cluster_ip: Option<&str>) {
    let mut spec = serde_json::json!({"ports": [{"port": 80}]});
    if let Some(ip) = cluster_ip {
        spec["clusterIP"] = ip.into();
    }
    let s: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .expect("service");
    Api::<Service>::namespaced(c.admin().await, "default")
        .create(&PostParams::default(), &s)
        .await
        .expect("create service");
}

/// The queries of the kubelet's Services lists and watches.
fn service_queries(c: &Cluster) -> Vec<String> {
    c.api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/services")
        .map(|r| r.query.clone())
        .collect()
}

/// Starts a lister with `discovery` made from the node client by `make`.
async fn lister(
    c: &Cluster,
    make: impl FnOnce(kube::Client) -> Discovery,
    metrics: Arc<KubeletMetrics>,
    stop: &CancellationToken,
) -> ServiceLister {
    let client = c.node_client("n1").await;
    let compat = Compat {
        discovery: make(client.clone()),
        metrics: Some(metrics),
        events: None,
    };
    ServiceLister::new(Some((client, compat)), &TaskTracker::new(), stop)
}

/// Checks what a lister on a 1.19 apiserver holds: the ClusterIP services,
/// not the headless one.
async fn holds_cluster_ip_services_only(c: &Cluster, l: &ServiceLister) {
    eventually("the lister syncs", || l.has_synced()).await;
    service(c, "headless", Some("None")).await;
    service(c, "web", None).await;
    eventually("the new service is seen", || {
        names(l).contains(&"default/web".to_string())
    })
    .await;
    let n = names(l);
    assert!(n.contains(&"default/kubernetes".to_string()), "{n:?}");
    assert!(
        !n.contains(&"default/headless".to_string()),
        "headless services make no env vars: {n:?}"
    );
}

#[tokio::test]
async fn on_a_1_19_apiserver_services_are_watched_without_the_field_selector() {
    let c = Cluster::start_profile(Profile::V1_19, Default::default()).await;
    let stop = CancellationToken::new();
    let metrics = Arc::new(KubeletMetrics::new());
    let l = lister(&c, Discovery::new, metrics.clone(), &stop).await;
    holds_cluster_ip_services_only(&c, &l).await;
    // The version said 1.19: the selector was never sent.
    let queries = service_queries(&c);
    assert!(
        !queries.is_empty() && queries.iter().all(|q| !q.contains("fieldSelector")),
        "{queries:?}"
    );
    let text = metrics.render();
    assert!(
        text.contains(r#"kubelet_apiserver_fallback_info{request="services_list_watch",choice="all_services_headless_dropped_by_kubelet",server_version="v1.19"#),
        "{text}"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_refused_field_selector_falls_back_whatever_the_version_said() {
    let c = Cluster::start_profile(Profile::V1_19, Default::default()).await;
    let stop = CancellationToken::new();
    let metrics = Arc::new(KubeletMetrics::new());
    // A server that claims 1.35 (a backport, a proxy, a wrong guess) but
    // refuses the selector as 1.19 does.
    let claims_new = |client| {
        Discovery::with_info(
            client,
            ServerInfo {
                git_version: "v1.35.0".into(),
                major: 1,
                minor: 35,
                group_versions: ["v1".to_string()].into(),
            },
        )
    };
    let l = lister(&c, claims_new, metrics, &stop).await;
    holds_cluster_ip_services_only(&c, &l).await;
    let queries = service_queries(&c);
    assert!(
        queries[0].contains("fieldSelector=spec.clusterIP%21%3DNone"),
        "first tried with the selector: {queries:?}"
    );
    assert!(
        queries.iter().skip(1).all(|q| !q.contains("fieldSelector")),
        "then without: {queries:?}"
    );
    stop.cancel();
}

#[tokio::test]
async fn on_a_1_35_apiserver_the_field_selector_is_used() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    let stop = CancellationToken::new();
    let metrics = Arc::new(KubeletMetrics::new());
    let l = lister(&c, Discovery::new, metrics.clone(), &stop).await;
    eventually("the lister syncs", || l.has_synced()).await;
    let queries = service_queries(&c);
    assert!(
        queries
            .iter()
            .all(|q| q.contains("fieldSelector=spec.clusterIP%21%3DNone")),
        "{queries:?}"
    );
    assert!(
        metrics
            .render()
            .contains(r#"choice="field_selector_spec_cluster_ip""#)
    );
    stop.cancel();
}

#[tokio::test]
async fn an_apiserver_upgraded_during_an_outage_gets_the_selector_again() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    let stop = CancellationToken::new();
    let metrics = Arc::new(KubeletMetrics::new());
    // It was a 1.30 apiserver when the kubelet started.
    let discovery = Discovery::with_info(
        c.node_client("n1").await,
        ServerInfo {
            git_version: "v1.30.9".into(),
            major: 1,
            minor: 30,
            group_versions: ["v1".to_string()].into(),
        },
    );
    let shared = discovery.clone();
    let l = lister(&c, move |_| shared, metrics.clone(), &stop).await;
    eventually("the lister syncs", || l.has_synced()).await;
    assert!(
        service_queries(&c)
            .iter()
            .all(|q| !q.contains("fieldSelector")),
        "no selector for a 1.30 apiserver"
    );
    // An outage; it comes back as 1.35 (the double's release), which the
    // next discovery read (after the outage, or the periodic one) finds.
    c.api.set_up(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.api.set_up(true);
    discovery.refresh().await.expect("discovery");
    let selected = || {
        service_queries(&c)
            .iter()
            .any(|q| q.contains("fieldSelector=spec.clusterIP%21%3DNone"))
    };
    let ok = tokio::time::timeout(Duration::from_secs(60), async {
        while !selected() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "the selector is used again: {:?}",
        service_queries(&c)
    );
    assert!(
        metrics
            .render()
            .contains(r#"choice="field_selector_spec_cluster_ip",server_version="v1.35"#)
    );
    stop.cancel();
}

#[tokio::test]
async fn a_services_list_the_apiserver_refuses_is_an_event_on_the_node() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    // An identity outside system:nodes: RBAC refuses it the Services (403).
    let path = c.dir.path().join("stranger.conf");
    c.api
        .write_cert_kubeconfig(&path, "system:node:n1", &[])
        .expect("kubeconfig");
    let client = kubelet_test_util::client_for(&path).await;
    let recorder = Arc::new(kubelet_test_util::RecordingRecorder::default());
    let compat = Compat {
        discovery: Discovery::new(client.clone()),
        metrics: None,
        events: Some((recorder.clone(), "n1".into())),
    };
    let stop = CancellationToken::new();
    let l = ServiceLister::new(Some((client, compat)), &TaskTracker::new(), &stop);
    eventually("the refusal is an event", || {
        recorder
            .reasons()
            .contains(&super::services::FAILED_TO_LIST_SERVICES.to_string())
    })
    .await;
    assert!(!l.has_synced());
    let events = recorder.events.lock().clone();
    assert!(
        events.iter().any(|(_, m)| m.contains("(403)")),
        "{events:?}"
    );
    stop.cancel();
}
