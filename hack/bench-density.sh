#!/usr/bin/env bash
# Density benchmark (issue 20): N pods (default 250, with --max-pods=250)
# bound at once through the apiserver double, each with a projected
# service-account token, a ConfigMap, an emptyDir and an exec readiness
# probe every 10 s; prints the time until all are Running and Ready, then
# the kubelet at rest over 60 s: CPU, RSS, PLEG relist p50/p99. The same at
# SMALL pods (default 30) first, to show the cost per pod. Holds the
# integration tests' machine lock (a kubelet kills pods it does not know).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-250}
SMALL=${SMALL:-30}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-density.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example api_bench
API=target/release/examples/api_bench
KUBELET=target/release/kubelet-rs
# As the test harness: this machine's disk is often over 85% full, which
# upstream's default thresholds (nodefs/imagefs.available<10%/15%) answer
# with DiskPressure, refusing every pod; keep the memory threshold only.
QUIET=(--eviction-hard='memory.available<100Mi' --image-gc-high-threshold=100 --image-gc-low-threshold=99)
for n in "$SMALL" "$N"; do
  out=$(API_BENCH_DENSITY=1 API_BENCH_VOLUMES=1 flock /tmp/kubelet-rs-integration.lock \
    "$API" "$KUBELET" "$n" --max-pods="$N" "${QUIET[@]}")
  read -r ms patches cpu rss relists p50 p99 <<<"$out"
  echo "pods=$n: all Ready after ${ms} ms (${patches} status patches); at rest: ${cpu} cores, RSS ${rss} KiB, ${relists} relists in 60 s, relist p50 ${p50} ms p99 ${p99} ms"
done
