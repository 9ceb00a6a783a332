#!/usr/bin/env bash
# Guest side of hack/vm/bench-idle-vm.sh (issue 29): runs the idle benchmark
# (tests/examples/idle_bench.rs, release build) inside the VM as one "test"
# of the set hack/vm/sets/perf.
#
# hack/vm/guest/job.sh runs every set line as `<exe> --test-threads=N
# <args>`; bench-idle-vm.sh installs a two-line shim named like a test
# binary (target/debug/deps/idle_bench_vm-0000000000000000) that execs this
# script. Here: drop the test harness's --test-threads, pull the busybox and
# pause images first (the host's containerd has them already, so the burst
# time compares like with like), keep the kubelet's log (hard link: the bench
# removes its temporary directory) and write it to the results, then run
#   target/release/examples/idle_bench target/release/kubelet-rs <args...>
# args = PODS and the kubelet flags.
set -uo pipefail

case "${1:-}" in --test-threads=*) shift ;; esac
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bench="$repo/target/release/examples/idle_bench"
kubelet="$repo/target/release/kubelet-rs"
results=/mnt/results
for f in "$bench" "$kubelet"; do
  [ -x "$f" ] || { echo "idle-bench-guest: $f is missing (cargo build --release on the host)" >&2; exit 2; }
done
say() { printf '[%s +%ss] %s\n' "$(date -u +%T)" "$(cut -d' ' -f1 /proc/uptime)" "$*" >&2; }

echo "node: $(uname -r); $(containerd --version); $(runc --version | head -n1); $(systemctl --version | head -n1)"
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup); nproc: $(nproc); mem: $(free -m | awk '/^Mem:/ {print $2}') MiB"
echo "kubelet: $(stat -c %s "$kubelet") bytes; args: $*"
env | grep '^IDLE_BENCH' | sort

pause_tag="$(sed -n 's/^PAUSE_TAG=\([^ ]*\)$/\1/p' "$repo/deploy/setup-runtime.sh")"
for img in localhost:5000/busybox:1.35 "localhost:5000/pause:$pause_tag"; do
  t0=$(date +%s)
  if ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d "$img" >/dev/null 2>&1; then
    say "pulled $img in $(($(date +%s) - t0)) s"
  else
    say "warning: could not pull $img first (the kubelet will pull it)"
  fi
done

# The bench's temporary directory lives under TMPDIR; a hard link in the
# same file system keeps the kubelet's log once the bench removes it.
export TMPDIR=/var/tmp/idle-bench
mkdir -p "$TMPDIR"
keep=/var/tmp/idle-bench-kubelet.log
(
  for _ in $(seq 240); do
    log="$(find "$TMPDIR" -maxdepth 2 -name kubelet.log 2>/dev/null | head -n1)"
    if [ -n "$log" ]; then ln -f "$log" "$keep" && exit 0; fi
    sleep 1
  done
) &
watcher=$!

say "idle_bench starts"
"$bench" "$kubelet" "$@"
rc=$?
say "idle_bench exit $rc"
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
[ -f "$keep" ] && cp "$keep" "$results/kubelet.log" 2>/dev/null
exit $rc
