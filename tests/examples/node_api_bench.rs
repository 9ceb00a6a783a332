//! Node API load generator for `hack/bench-node-api.sh`: latency and
//! throughput of read endpoints, and open/close cycles of log follows, over
//! HTTPS as the apiserver's proxy and metrics-server call them.
//!
//! Usage:
//!   node_api_bench http ADDR CA NAME PATH REQUESTS CONCURRENCY
//!       prints `p50_ms p99_ms req_per_s`
//!   node_api_bench follow-cycles ADDR CA NAME PATH N
//!       opens PATH (a `follow=true` log), reads its first bytes, drops it; N times

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("http") => http(&args).await,
        Some("follow-cycles") => follow_cycles(&args).await,
        _ => bail!("usage: node_api_bench http|follow-cycles ADDR CA NAME PATH ..."),
    }
}
