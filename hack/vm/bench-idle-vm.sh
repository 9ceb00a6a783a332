#!/usr/bin/env bash
# The idle benchmark in the VM (issue 29): hack/bench-idle.sh's
# measurement (tests/examples/idle_bench.rs: idle, 30 pods, after they are
# gone) on the systemd + cgroup v2 node of hack/vm, through the ordinary
# hack/vm/run.sh with the set hack/vm/sets/perf.
#
#   sudo hack/vm/bench-idle-vm.sh [sid|trixie]     # default sid
#
# run.sh runs test binaries named <test>-<16 hex> under target/debug/deps
# (with KUBELET_RS_VM_BUILD=0 it takes the newest such file) and the guest
# calls them as `<exe> --test-threads=N <args>`. The bench is a cargo
# example, so this installs a shim of that name,
# target/debug/deps/idle_bench_vm-0000000000000000, that execs
# hack/vm/idle-bench-guest.sh (drops --test-threads, pre-pulls the images,
# runs target/release/examples/idle_bench target/release/kubelet-rs ...).
# KUBELET_RS_VM_TIMEOUT defaults to 1800 s here too. The results:
# target/vm/<suite>/perf/tests/idle_bench_vm.stdout (the bench's lines),
# .stderr, and kubelet.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
suite=${1:-sid}
[ "$(id -u)" -eq 0 ] || { echo "hack/vm/bench-idle-vm.sh: run as root" >&2; exit 1; }
target_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
if [ "${KUBELET_RS_VM_BUILD:-1}" = 1 ]; then
  cargo build --release --locked --bin kubelet-rs -p kubelet-rs
  cargo build --release --locked -p kubelet-rs-integration --example idle_bench
fi
case "$target_dir/" in "$PWD"/*) ;; *) echo "hack/vm/bench-idle-vm.sh: the target dir must be under the workspace (the guest reaches the shim's script there)" >&2; exit 1 ;; esac
mkdir -p "$target_dir/debug/deps"
shim="$target_dir/debug/deps/idle_bench_vm-0000000000000000"
printf '#!/bin/sh\nexec %s/hack/vm/idle-bench-guest.sh "$@"\n' "$PWD" >"$shim.tmp"
chmod 0755 "$shim.tmp"
mv "$shim.tmp" "$shim"
rc=0
KUBELET_RS_VM_BUILD=0 hack/vm/run.sh "$suite" perf || rc=$?
out="$target_dir/vm/$suite/perf/tests/idle_bench_vm.stdout"
echo
[ -f "$out" ] && cat "$out"
exit $rc
