#!/usr/bin/env bash
# Idle footprint benchmark (issues 21 and 28): the release kubelet-rs on a
# node shaped as kubeadm sets one up (its config file, an empty static pod
# directory, client certificate rotation, a CSI driver and a device plugin
# registered) against the apiserver double, idle, then with PODS (default
# 30) plain pods, then after they are deleted: CPU seconds and wake-ups per
# 30 s, system calls per 30 s by kind (strace -c -f), VmRSS and RssAnon
# (tests/examples/idle_bench.rs). Holds the integration tests' machine lock
# (a kubelet kills pods it does not know). KUBELET=path benches another build
# (an older commit's, for a before/after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PODS=${PODS:-30}
[ "$(id -u)" -eq 0 ] || { echo "hack/bench-idle.sh: run as root" >&2; exit 1; }
deploy/setup-runtime.sh
command -v strace >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q strace
if [ -z "${KUBELET:-}" ]; then
  cargo build --release --locked --bin kubelet-rs -p kubelet-rs
  KUBELET=target/release/kubelet-rs
fi
cargo build --release --locked -p kubelet-rs-integration --example idle_bench
echo "binary: $(stat -c %s "$KUBELET") bytes"
# As the density bench: upstream's disk thresholds would see this machine's
# disk as under pressure; keep the memory threshold only.
flock /tmp/kubelet-rs-integration.lock target/release/examples/idle_bench "$KUBELET" "$PODS" \
  --eviction-hard='memory.available<100Mi' --image-gc-high-threshold=100 --image-gc-low-threshold=99
