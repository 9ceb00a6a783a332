//! Repeated node status failures close the client's connections (upstream
//! `updateNodeStatus` calling `onRepeatedHeartbeatFailure` from the second
//! failed try).

use super::*;
use kubelet_client::{ClientOptions, Connections};

#[tokio::test(start_paused = true)]
async fn failed_retries_close_every_connection_the_first_try_does_not() {
    use apiserver_double::Fault;
    let c = Cluster::start(Default::default()).await;
    let path = c.dir.path().join("n1-kubelet.conf");
    c.api
        .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
        .expect("kubeconfig");
    let connections = Arc::new(Connections::new());
    let options = ClientOptions::new(50.0, 100).with_connections(connections.clone());
    let (client, _) = kubelet_client::from_kubeconfig_with(&path, options)
        .await
        .expect("client");
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(client, &fake, cfg(), vec![]);
    m.connections = Some(connections.clone());
    let stop = CancellationToken::new();
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(connections.generation(), 0, "nothing failed yet");
    c.api.set_fault(Fault::ServerError);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        connections.generation(),
        u64::try_from(NODE_STATUS_UPDATE_RETRY - 1).expect("small"),
        "one interval: every failed try but the first closed the connections"
    );
    c.api.set_fault(Fault::None);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        connections.generation(),
        u64::try_from(NODE_STATUS_UPDATE_RETRY - 1).expect("small"),
        "a healthy interval closes nothing"
    );
    stop.cancel();
}
