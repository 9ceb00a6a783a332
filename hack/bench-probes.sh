#!/usr/bin/env bash
# Probe benchmark: N pods (default 100) bound at once through the apiserver
# double, each with a 1-second exec readiness probe and a 1-second HTTP
# liveness probe. Once all are Ready, kubelet-rs's CPU (cores) and RSS are
# sampled over WINDOW seconds (default 60), containerd's CPU over the same
# kind of window for context, and the probe latencies (p50/p99 from the
# kubelet's own prober_probe_duration_seconds histogram on /metrics/probes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-100}
WINDOW=${WINDOW:-60}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-probes.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example api_bench
ctr_ticks() { awk '{print $14+$15}' "/proc/$(pgrep -xo containerd)/stat"; }
t0=$(ctr_ticks)
out=$(API_BENCH_PROBES=1 API_BENCH_WINDOW="$WINDOW" target/release/examples/api_bench target/release/kubelet-rs "$N")
read -r ms _ cpu rss rn r50 r99 ln l50 l99 <<<"$out"
echo "pods=$N window=${WINDOW}s"
echo "bound -> all Ready:                  $ms ms"
echo "kubelet-rs CPU (cores, avg):         $cpu"
echo "kubelet-rs RSS (KiB):                $rss"
echo "readiness (exec) probes in window:   $rn   p50 ${r50} ms   p99 ${r99} ms"
echo "liveness (http) probes in window:    $ln   p50 ${l50} ms   p99 ${l99} ms"
echo "containerd CPU ticks during the run: $(( $(ctr_ticks) - t0 )) (USER_HZ=100)"
