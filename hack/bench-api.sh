#!/usr/bin/env bash
# Cluster-mode benchmark: N pods (default 30) bound at once through the
# apiserver double -> all Running and Ready in the API. Runs the kubelet-rs
# release binary as its own process with the default client limits
# (kubeAPIQPS 50 / burst 100) and, for comparison, with the old upstream
# default of 5 QPS / burst 10. Also prints the CRI floor for the same N.
# RUNS (default 3) runs each; medians are printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${RUNS:-3}
N=${N:-30}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-api.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example api_bench --example cri_bench
API=target/release/examples/api_bench
CRI=target/release/examples/cri_bench
KUBELET=target/release/kubelet-rs
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
floor=(); fast=(); slow=(); fast_p=(); slow_p=()
for run in $(seq "$RUNS"); do
  sfx="ab$run-$$"
  ms=$($CRI floor "$N" "-$sfx"); floor+=("$ms"); $CRI cleanup "-$sfx"
  # Command substitution waits for api_bench to finish its cleanup (its kubelet
  # must be gone before the next scenario, or it would remove that one's pods).
  out=$($API "$KUBELET" "$N"); read -r ms p <<<"$out"; fast+=("$ms"); fast_p+=("$p")
  out=$($API "$KUBELET" "$N" --kube-api-qps=5 --kube-api-burst=10); read -r ms5 p5 <<<"$out"
  slow+=("$ms5"); slow_p+=("$p5")
  echo "run $run: CRI floor ${floor[-1]} ms; kubelet-rs via API ${ms} ms (${p} status patches); at 5 QPS ${ms5} ms (${p5} patches)" >&2
done
echo "pods=$N runs=$RUNS"
echo "CRI floor (median):                 $(printf '%s\n' "${floor[@]}" | median) ms"
echo "via apiserver, 50 QPS (median):     $(printf '%s\n' "${fast[@]}" | median) ms, $(printf '%s\n' "${fast_p[@]}" | median) status patches"
echo "via apiserver, 5 QPS (median):      $(printf '%s\n' "${slow[@]}" | median) ms, $(printf '%s\n' "${slow_p[@]}" | median) status patches"
