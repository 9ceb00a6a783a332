#!/usr/bin/env bash
# Churn benchmark (issue 20): the kubelet-rs release binary as its own
# process against the apiserver double, WAVES waves (default 20) of PODS
# pods (default 50) of the density shape (projected service-account token,
# ConfigMap, emptyDir; a sleeping busybox), each wave created at once,
# awaited until all Running, deleted and awaited until gone from the API,
# PAUSE seconds (default 130, so the default run takes about an hour)
# between waves. Per wave (and a baseline, wave 0) it prints the ms to all
# Running and to all gone, the kubelet's RSS, RssAnon, descriptors and
# threads, and what the node's pods hold on the host: sandboxes and
# containers in the runtime, mounts under the kubelet root dir, pod
# directories, pod cgroups, pod log directories. At the end (after the
# runtime's GC has had its turn) a summary: what leaked (must be nothing;
# the script then exits non-zero), and descriptors, threads and RSS against
# after the first wave. Output also goes to /tmp/bench-churn.out.
#
# LANE=1 (default) runs on the main containerd; LANE=2 on the second test
# lane's (tests/lane.rs: own socket, --cgroup-root, podLogsDir, lock). Holds
# the lane's machine lock (a kubelet kills pods it does not know).
#
#   sudo LANE=2 WAVES=3 PODS=10 PAUSE=0 hack/bench-churn.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LANE=${LANE:-1}
WAVES=${WAVES:-20}
PODS=${PODS:-50}
PAUSE=${PAUSE:-130}
OUT=/tmp/bench-churn-lane$LANE.out
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-churn.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs -p kubelet-rs
cargo build --release --locked -p kubelet-rs-integration --example churn_bench
CHURN=target/release/examples/churn_bench
KUBELET=target/release/kubelet-rs
# As bench-density.sh: this machine's disk is often over 85% full, which
# upstream's default thresholds answer with DiskPressure; keep the memory
# threshold only, and no image GC.
QUIET=(--eviction-hard='memory.available<100Mi' --image-gc-high-threshold=100 --image-gc-low-threshold=99)
FLAGS=(--max-pods="$(( PODS > 110 ? PODS : 110 ))" "${QUIET[@]}")
case "$LANE" in
1)
  ENDPOINT=unix:///run/containerd/containerd.sock
  LOCK=/tmp/kubelet-rs-integration.lock
  # The node API on a port of the lane's own range (tests/lane.rs), so
  # that benches in both lanes run at once.
  FLAGS+=(--port=24250)
  ;;
2)
  deploy/setup-runtime.sh --lane2
  ENDPOINT=unix:///run/containerd-lane2/containerd.sock
  LOCK=/tmp/kubelet-rs-integration-lane2.lock
  FLAGS+=(--port=29250)
  CGROUP_ROOT=kubelet-rs-lane2
  # The lane's cgroup root in every v1 hierarchy (as tests/lane.rs does;
  # a new v1 cpuset takes its parent's CPUs and memory nodes), or in v2.
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p "/sys/fs/cgroup/$CGROUP_ROOT"
    for c in $(cat "/sys/fs/cgroup/$CGROUP_ROOT/cgroup.controllers"); do
      echo "+$c" >"/sys/fs/cgroup/$CGROUP_ROOT/cgroup.subtree_control"
    done
  else
    for c in /sys/fs/cgroup/*/; do
      [ -f "$c/cgroup.procs" ] || continue
      mkdir -p "$c$CGROUP_ROOT"
      for f in cpuset.cpus cpuset.mems; do
        if [ -f "$c$CGROUP_ROOT/$f" ] && [ -z "$(tr -d '[:space:]' <"$c$CGROUP_ROOT/$f")" ]; then
          cat "$c$f" >"$c$CGROUP_ROOT/$f"
        fi
      done
    done
  fi
  CONFIG=$(mktemp /tmp/bench-churn-config.XXXXXX.yaml)
  trap 'rm -f "$CONFIG"' EXIT
  printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: /var/log/pods-lane2\nfailCgroupV1: false\n' >"$CONFIG"
  FLAGS+=(--config="$CONFIG" --cgroup-root="/$CGROUP_ROOT")
  ;;
*) echo "hack/bench-churn.sh: LANE=$LANE: use 1 or 2" >&2; exit 1 ;;
esac
FLAGS+=(--container-runtime-endpoint="$ENDPOINT")
echo "churn: lane $LANE, $WAVES waves of $PODS pods, ${PAUSE}s between waves (waiting for $LOCK)" | tee "$OUT"
CHURN_PAUSE="$PAUSE" CHURN_ENDPOINT="$ENDPOINT" flock "$LOCK" \
  "$CHURN" "$KUBELET" "$WAVES" "$PODS" "${FLAGS[@]}" | tee -a "$OUT"
