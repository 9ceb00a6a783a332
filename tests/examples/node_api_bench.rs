//! Node API load generator for `hack/bench-node-api.sh`: latency and
//! throughput of read endpoints, and open/close cycles of log follows, over
//! HTTPS as the apiserver's proxy and metrics-server call them.
//!
//! Usage:
//!   node_api_bench http ADDR CA NAME PATH REQUESTS CONCURRENCY
//!       prints `p50_ms p99_ms req_per_s`
//!   node_api_bench follow-cycles ADDR CA NAME PATH N
//!       opens PATH (a `follow=true` log), reads its first bytes, drops it; N times
//!   node_api_bench exec-cycles ADDR CA NAME NAMESPACE POD CONTAINER N
//!       N execs of `echo ok` through the kubelet (WebSocket v4.channel.k8s.io);
//!       prints the median round trip in ms
//!   node_api_bench exec-floor POD CONTAINER N
//!       the same N execs straight to containerd's streaming server (CRI Exec)

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};

fn client(args: &[String]) -> anyhow::Result<NodeApiClient> {
    let addr: SocketAddr = args.get(2).context("ADDR")?.parse()?;
    let ca = PathBuf::from(args.get(3).context("CA")?);
    let name = args.get(4).context("NAME")?;
    NodeApiClient::new(addr, &ca, name, Credentials::None)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn http(args: &[String]) -> anyhow::Result<()> {
    let c = client(args)?;
    let path = args.get(5).context("PATH")?.clone();
    let n: usize = args.get(6).context("REQUESTS")?.parse()?;
    let conc: usize = args.get(7).context("CONCURRENCY")?.parse()?;
    // Warm up once; fail loudly on a bad status.
    let a = c.get(&path).await?;
    if a.status != StatusCode::OK {
        bail!("{path}: {} {}", a.status, a.text());
    }
    let start = Instant::now();
    let per = n.div_ceil(conc);
    let mut tasks = vec![];
    for _ in 0..conc {
        let c = c.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                let a = c.get(&path).await?;
                if a.status != StatusCode::OK {
                    bail!("{path}: {}", a.status);
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    println!(
        "{:.2} {:.2} {:.0}",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.len() as f64 / secs
    );
    Ok(())
}

async fn follow_cycles(args: &[String]) -> anyhow::Result<()> {
    let c = client(args)?;
    let path = args.get(5).context("PATH")?.clone();
    let n: usize = args.get(6).context("N")?.parse()?;
    for i in 0..n {
        let resp = c.send(Method::GET, &path, &[], Bytes::new()).await?;
        if resp.status() != StatusCode::OK {
            bail!("cycle {i}: {}", resp.status());
        }
        let mut body = resp.into_body();
        // The first frame of the log, then hang up mid-follow.
        let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .context("no log bytes within 10s")?;
        if first.is_none() {
            bail!("cycle {i}: the follow ended");
        }
        drop(body);
    }
    println!("{n}");
    Ok(())
}

/// One `echo ok` over WebSocket v4 on an already connected stream to `url`.
async fn ws_echo<S>(io: S, url: &str) -> anyhow::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "v4.channel.k8s.io".parse()?);
    let (mut ws, _) = tokio_tungstenite::client_async(req, io).await?;
    let mut out = Vec::new();
    while let Some(msg) = ws.next().await {
        match msg? {
            Message::Binary(b) if b.first() == Some(&1) => out.extend_from_slice(&b[1..]),
            Message::Close(_) => break,
            _ => {}
        }
    }
    if out != b"ok\n" {
        bail!("exec printed {:?}", String::from_utf8_lossy(&out));
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

async fn exec_cycles(args: &[String]) -> anyhow::Result<()> {
    let c = client(args)?;
    let (ns, pod, ctr) = (
        args.get(5).context("NAMESPACE")?,
        args.get(6).context("POD")?,
        args.get(7).context("CONTAINER")?,
    );
    let n: usize = args.get(8).context("N")?.parse()?;
    let url = format!(
        "wss://{}/exec/{ns}/{pod}/{ctr}?command=echo&command=ok&output=1",
        c.authority()
    );
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let tls = c.connect().await?;
        tokio::time::timeout(Duration::from_secs(30), ws_echo(tls, &url))
            .await
            .context("exec timed out")??;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("{:.2}", median(lat));
    Ok(())
}

async fn exec_floor(args: &[String]) -> anyhow::Result<()> {
    use cri::RuntimeService;
    let pod = args.get(2).context("POD")?;
    let ctr = args.get(3).context("CONTAINER")?;
    let n: usize = args.get(4).context("N")?.parse()?;
    let rt = cri::RemoteRuntime::new(
        "unix:///run/containerd/containerd.sock",
        None,
        Duration::from_secs(30),
    )?;
    let id = rt
        .list_containers(None)
        .await?
        .into_iter()
        .find(|c| {
            c.labels.get("io.kubernetes.pod.name") == Some(pod)
                && c.labels.get("io.kubernetes.container.name") == Some(ctr)
                && c.state == cri::pb::ContainerState::ContainerRunning as i32
        })
        .context("no running container")?
        .id;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let resp = rt
            .exec(cri::pb::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["echo".into(), "ok".into()],
                stdout: true,
                ..Default::default()
            })
            .await?;
        let url = resp.url.replacen("http://", "ws://", 1);
        let authority = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .context("streaming URL")?
            .to_string();
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        tokio::time::timeout(Duration::from_secs(30), ws_echo(tcp, &url))
            .await
            .context("exec timed out")??;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("{:.2}", median(lat));
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("http") => http(&args).await,
        Some("follow-cycles") => follow_cycles(&args).await,
        Some("exec-cycles") => exec_cycles(&args).await,
        Some("exec-floor") => exec_floor(&args).await,
        _ => bail!("usage: node_api_bench http|follow-cycles|exec-cycles|exec-floor ..."),
    }
}
