#!/usr/bin/env bash
# Node API benchmark (issue 8), on real containerd with N (30) running pods:
#   1. latency (p50/p99) and throughput of /healthz, /pods, /stats/summary,
#      /metrics over HTTPS, REQUESTS requests at CONCURRENCY;
#   2. kubelet-rs RSS before and after FOLLOWS log-follow open/close cycles
#      and EXECS exec sessions (a leak shows as growth);
#   3. exec round trip through kubelet-rs against the CRI floor (the
#      runtime's streaming URL from CRI Exec, straight to containerd).
# Results go to stdout; docs/perf.md records a run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-30}
REQUESTS=${REQUESTS:-2000}
CONCURRENCY=${CONCURRENCY:-8}
FOLLOWS=${FOLLOWS:-1000}
EXECS=${EXECS:-200}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-node-api.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example cri_bench --example node_api_bench
CRI=target/release/examples/cri_bench
API=target/release/examples/node_api_bench
KUBELET=target/release/kubelet-rs
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

work=$(mktemp -d); mkdir -p "$work/manifests"
node="apibench-$$"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$KUBELET --pod-manifest-path "$work/manifests" --hostname-override "$node" --root-dir "$work/root" \
  --healthz-port 0 --read-only-port 0 --address 127.0.0.1 --port "$port" >"$work/log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for i in $(seq "$N"); do
  cat >"$work/manifests/p$i.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: p$i}
spec:
  terminationGracePeriodSeconds: 2
  containers: [{name: c, image: "localhost:5000/busybox:1.35", command: [sh, -c, "while true; do echo tick; sleep 1; done"]}]
YAML
done
$CRI wait-running "$N" "-$node" >/dev/null
addr="127.0.0.1:$port"; ca="$work/root/pki/kubelet.crt"
sleep 3
echo "pods: $N; requests: $REQUESTS at concurrency $CONCURRENCY"
echo "endpoint            p50_ms p99_ms req/s"
for path in /healthz /pods /stats/summary /metrics; do
  printf '%-19s %s\n' "$path" "$($API http "$addr" "$ca" "$node" "$path" "$REQUESTS" "$CONCURRENCY")"
done
rss0=$(rss_kb $pid)
$API follow-cycles "$addr" "$ca" "$node" "/containerLogs/default/p1-$node/c?follow=true&tailLines=1" "$FOLLOWS" >/dev/null
rss1=$(rss_kb $pid)
echo "RSS before/after $FOLLOWS log follows (KiB): $rss0 $rss1"
$API exec-cycles "$addr" "$ca" "$node" default "p1-$node" c "$EXECS" >"$work/exec"
rss2=$(rss_kb $pid)
echo "RSS after $EXECS exec sessions (KiB): $rss2"
echo "exec round trip via kubelet-rs (median ms): $(cat "$work/exec")"
echo "exec round trip CRI floor (median ms):      $($API exec-floor "p1-$node" c "$EXECS")"
rm -f "$work"/manifests/*.yaml
for _ in $(seq 120); do
  left=$(ctr -n k8s.io containers ls -q | wc -l)
  [ "$left" -eq 0 ] && break; sleep 0.5
done
kill -TERM $pid; wait $pid || true
$CRI cleanup "-$node"
