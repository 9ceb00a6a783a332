//! The stub plugin across a kubelet restart: the new kubelet removes plugin
//! sockets on start, the stub serves again and registers again (as
//! upstream's sample device plugin does), keeping its devices and calls.

use crate::DeviceManager;
use crate::stub::{Stub, StubConfig, device};

use super::manager_tests::{FakePods, RES, container, pod, started, wait_capacity};

#[tokio::test]
async fn the_stub_serves_again_and_registers_with_a_restarted_kubelet() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&["p1", "p2"])).await;
    let socket = dir.path().join("device-plugins/stub.sock");
    let mut p = Stub::start(
        &socket,
        vec![device("dev-a", true), device("dev-b", true)],
        StubConfig::default(),
    )
    .expect("stub");
    p.register(&m.socket_path(), RES, "v1beta1")
        .await
        .expect("register");
    wait_capacity(&m, 2, 2).await;
    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.allocate(&p1, &container("c", 1)).await.expect("allocate");
    m.stop();

    let (m2, _): (DeviceManager, _) =
        started(dir.path(), FakePods::ready_with(&["p1", "p2"])).await;
    assert!(
        !socket.exists(),
        "the restarted kubelet removed the plugin socket"
    );
    p.serve_again().await.expect("serve again");
    assert!(socket.exists(), "the stub's socket is back");
    p.register(&m2.socket_path(), RES, "v1beta1")
        .await
        .expect("register again");
    wait_capacity(&m2, 2, 2).await;
    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    m2.allocate(&p2, &container("c", 1))
        .await
        .expect("allocate");
    let calls = p.calls().allocate;
    assert_eq!(calls.len(), 2, "calls are kept across serving: {calls:?}");
    assert_ne!(calls[0], calls[1], "the checkpoint kept the first device");
    m2.stop();
    p.stop().await;
}
