//! `kubectl logs` through kubelet-rs on real containerd: `/containerLogs`
//! over the node API's TLS port with tail, since, limitBytes, timestamps,
//! previous, and follow, including across a log rotation.

use std::time::Duration;

use bytes::Bytes;
use cri::RuntimeService;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

fn client(node: &Node) -> anyhow::Result<NodeApiClient> {
    let addr = node.handle().server_addr.ctx("server port")?;
    NodeApiClient::new(addr, &node.serving_ca(), &node.name, Credentials::None)
}

/// Reads a streaming body until `done` holds for what arrived.
async fn read_until(
    body: &mut hyper::body::Incoming,
    got: &mut String,
    done: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + T;
    while !done(got) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .map_err(|_| anyhow::anyhow!("timed out; got {got:?}"))?
            .ctx("the stream ended")??;
        if let Ok(d) = frame.into_data() {
            got.push_str(&String::from_utf8_lossy(&d));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_logs_with_tail_since_limit_timestamps_and_follow_across_rotation()
-> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "lg.yaml",
        &pod_yaml(
            "lg",
            "Always",
            BUSYBOX,
            // stdout and stderr are separate pipes: the pause keeps their
            // lines in this order in the log file.
            "echo one; echo two; echo three; sleep 0.5; echo oops >&2; sleep 3600",
        ),
    );
    let s = node
        .wait_status("lg", T, "running", |s| is_running(s, "c"))
        .await?;
    let c = client(&node)?;
    let base = format!("/containerLogs/default/{}/c", node.pod_name("lg"));
    // The lines land in the file a moment after the container starts.
    let deadline = tokio::time::Instant::now() + T;
    let all = loop {
        let a = c.get(&base).await?;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        if a.text().contains("oops") || tokio::time::Instant::now() > deadline {
            break a.text();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(all.starts_with("one\ntwo\nthree\n"), "{all:?}");
    assert!(all.contains("oops\n"), "stderr is served too: {all:?}");

    let a = c.get(&format!("{base}?tailLines=2")).await?;
    assert_eq!(a.text().lines().count(), 2, "{}", a.text());
    let a = c.get(&format!("{base}?limitBytes=6")).await?;
    assert_eq!(a.text(), "one\ntw");

    // Timestamps, and sinceTime from the second line's.
    let a = c.get(&format!("{base}?timestamps=true")).await?;
    let stamped: Vec<String> = a.text().lines().map(String::from).collect();
    let (ts, rest) = stamped[1].split_once(' ').ctx("a timestamp")?;
    assert_eq!(rest, "two");
    assert_eq!(ts.len(), "2006-01-02T15:04:05.000000000Z".len(), "{ts}");
    let a = c.get(&format!("{base}?sinceTime={ts}")).await?;
    assert!(a.text().starts_with("two\nthree\n"), "{}", a.text());
    let a = c.get(&format!("{base}?sinceSeconds=3600")).await?;
    assert!(a.text().starts_with("one\n"), "{}", a.text());

    // Upstream's refusals.
    let a = c.get(&format!("{base}?tailLines=-1")).await?;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let a = c.get(&format!("{base}?previous=true")).await?;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.text(),
        format!(
            "previous terminated container \"c\" in pod \"{}\" not found",
            node.pod_name("lg")
        )
    );

    // Follow: what the container writes later arrives on the open stream.
    let id = container_id(&s, "c")
        .ctx("container id")?
        .trim_start_matches("containerd://")
        .to_string();
    let resp = c
        .send(
            Method::GET,
            &format!("{base}?follow=true&tailLines=1"),
            &[],
            Bytes::new(),
        )
        .await?;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut got = String::new();
    read_until(&mut body, &mut got, |g| g.contains("oops")).await?;
    let say = |text: &'static str| {
        let rt = node.runtime.clone();
        let id = id.clone();
        async move {
            rt.exec_sync(
                &id,
                vec![
                    "sh".into(),
                    "-c".into(),
                    format!("echo {text} > /proc/1/fd/1"),
                ],
                Duration::from_secs(10),
            )
            .await
        }
    };
    say("later").await?;
    read_until(&mut body, &mut got, |g| g.contains("later\n")).await?;

    // Rotation as the kubelet's log manager does it: rename, then
    // ReopenContainerLog; the follow goes on in the new file.
    let path = node.runtime.container_status(&id).await?.log_path;
    std::fs::rename(&path, format!("{path}.20240101-000000"))?;
    node.runtime
        .runtime_client()
        .reopen_container_log(cri::pb::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await?;
    say("after-rotation").await?;
    read_until(&mut body, &mut got, |g| g.contains("after-rotation\n")).await?;
    assert!(std::fs::read_to_string(&path)?.contains("after-rotation"));
    drop(body);
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_serves_the_last_terminated_instance() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "pv.yaml",
        &pod_yaml(
            "pv",
            "Always",
            BUSYBOX,
            "echo run-$(date +%s%N); sleep 1; exit 1",
        ),
    );
    node.wait_status(
        "pv",
        Duration::from_secs(90),
        "restarted and running",
        |s| container(s, "c").is_some_and(|c| c.restart_count >= 1) && is_running(s, "c"),
    )
    .await?;
    let c = client(&node)?;
    let base = format!("/containerLogs/default/{}/c", node.pod_name("pv"));
    let deadline = tokio::time::Instant::now() + T;
    let (prev, now) = loop {
        let prev = c.get(&format!("{base}?previous=true")).await?;
        let now = c.get(&base).await?;
        if (prev.status, now.status) == (StatusCode::OK, StatusCode::OK)
            && now.text().starts_with("run-")
        {
            break (prev.text(), now.text());
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no logs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(prev.starts_with("run-"), "{prev:?}");
    assert_ne!(prev, now, "previous is the earlier instance");
    node.cleanup().await;
    Ok(())
}
