#!/usr/bin/env bash
# Volumes benchmark: N pods (default 30) bound at once through the apiserver
# double, each with a projected service-account token (the kube-api-access
# shape), a ConfigMap and an emptyDir, until all are Running and Ready in the
# API; next to the same N pods without volumes. Then the ConfigMap is
# updated and the time until every pod's mounted file has the new value is
# printed. RUNS (default 3) runs each; medians are printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${RUNS:-3}
N=${N:-30}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-volumes.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example api_bench
API=target/release/examples/api_bench
KUBELET=target/release/kubelet-rs
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
plain=(); vols=(); prop=()
for run in $(seq "$RUNS"); do
  out=$($API "$KUBELET" "$N"); read -r ms _ <<<"$out"; plain+=("$ms")
  out=$(API_BENCH_VOLUMES=1 $API "$KUBELET" "$N"); read -r msv _ pms <<<"$out"
  vols+=("$msv"); prop+=("$pms")
  echo "run $run: no volumes ${ms} ms; with volumes ${msv} ms; configMap update in every pod after ${pms} ms" >&2
done
echo "pods=$N runs=$RUNS"
echo "bound -> Running, no volumes (median):   $(printf '%s\n' "${plain[@]}" | median) ms"
echo "bound -> Running, 3 volumes (median):    $(printf '%s\n' "${vols[@]}" | median) ms"
echo "configMap update propagation (median):   $(printf '%s\n' "${prop[@]}" | median) ms"
