#!/usr/bin/env bash
# End-to-end benchmark (issue: 30 static pods, empty node to all running).
#   1. CRI floor: 30 sandboxes + containers created directly over CRI, concurrently.
#   2. kubelet-rs: 30 manifests dropped into an empty static pod dir at once,
#      timed until 30 containers run (polled over CRI every 20ms).
#   3. kubelet-rs RSS and CPU at idle (no pods) and with the 30 pods running.
# Each scenario runs RUNS times (default 3); medians are printed. Results go to
# stdout; docs/perf.md records a run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${RUNS:-3}
N=${N:-30}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example cri_bench
BENCH=target/release/examples/cri_bench
KUBELET=target/release/kubelet-rs
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
cpu_cores() { # pid seconds -> average cores used over the window
  local t0 t1 hz; hz=$(getconf CLK_TCK); t0=$(cpu_ticks "$1"); sleep "$2"; t1=$(cpu_ticks "$1")
  awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$2" 'BEGIN {printf "%.4f", (b-a)/hz/s}'
}

floor=(); kube=(); rss_idle=(); rss_busy=(); cpu_idle=(); cpu_busy=()
for run in $(seq "$RUNS"); do
  sfx="b$run-$$"
  ms=$($BENCH floor "$N" "-$sfx"); floor+=("$ms"); $BENCH cleanup "-$sfx"
  echo "run $run: CRI floor ${ms} ms" >&2

  work=$(mktemp -d); mkdir -p "$work/manifests"
  node="bench$run-$$"
  $KUBELET --pod-manifest-path "$work/manifests" --hostname-override "$node" --root-dir "$work/root" \
    --healthz-port 0 --address 127.0.0.1 --read-only-port 0 >"$work/log" 2>&1 &
  pid=$!
  sleep 5
  rss_idle+=("$(rss_kb $pid)"); cpu_idle+=("$(cpu_cores $pid 10)")
  for i in $(seq "$N"); do
    cat >"$work/p$i.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: p$i}
spec:
  terminationGracePeriodSeconds: 2
  containers: [{name: c, image: "localhost:5000/busybox:1.35", command: [sleep, "3600"]}]
YAML
  done
  # Move them in together (rename is atomic), then time until all run.
  $BENCH wait-running "$N" "-$node" >"$work/t" &
  waiter=$!
  mv "$work"/p*.yaml "$work/manifests/"
  wait $waiter; ms=$(cat "$work/t"); kube+=("$ms")
  echo "run $run: kubelet-rs ${ms} ms" >&2
  sleep 5
  rss_busy+=("$(rss_kb $pid)"); cpu_busy+=("$(cpu_cores $pid 10)")
  rm -f "$work"/manifests/*.yaml
  # Let kubelet-rs stop and remove the pods itself, then stop it.
  for _ in $(seq 120); do
    left=$(ctr -n k8s.io containers ls -q | wc -l)
    [ "$left" -eq 0 ] && break; sleep 0.5
  done
  kill -TERM $pid; wait $pid || true
  $BENCH cleanup "-$node"; rm -f /tmp/kubelet-rs-floor-*
  rm -rf "$work"
done
f=$(printf '%s\n' "${floor[@]}" | median); k=$(printf '%s\n' "${kube[@]}" | median)
echo "pods: $N, runs: $RUNS"
echo "CRI floor (median ms):             $f   [${floor[*]}]"
echo "kubelet-rs (median ms):            $k   [${kube[*]}]"
awk -v k="$k" -v f="$f" 'BEGIN {printf "ratio kubelet-rs / floor:          %.2fx (target <= 1.15x)\n", k/f}'
echo "RSS idle (median KiB):             $(printf '%s\n' "${rss_idle[@]}" | median)   [${rss_idle[*]}]"
echo "RSS with $N pods (median KiB):     $(printf '%s\n' "${rss_busy[@]}" | median)   [${rss_busy[*]}] (target < 20480)"
echo "CPU idle (median cores):           $(printf '%s\n' "${cpu_idle[@]}" | median)   [${cpu_idle[*]}]"
echo "CPU with $N pods (median cores):   $(printf '%s\n' "${cpu_busy[@]}" | median)   [${cpu_busy[*]}]"
