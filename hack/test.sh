#!/usr/bin/env bash
# The whole kubelet-rs test suite, as CI runs it (.ci/run calls this):
# runtime setup (idempotent), formatting, clippy, unit tests, and the
# integration tests against real containerd. Fails loudly, never skips, when
# the runtime cannot be set up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/test.sh: must run as root: the integration tests drive containerd" >&2
  exit 1
fi

echo "== runtime setup"
deploy/setup-runtime.sh
deploy/setup-runtime.sh --check

echo "== cargo fmt"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (unit + integration against containerd; apiserver double as 1.35)"
KUBELET_RS_APISERVER_PROFILE=1.35 cargo test --workspace --locked 2>&1 | tee /tmp/kubelet-rs-test.log

# Every test that starts the apiserver double runs again with the double
# behaving as a 1.19 apiserver (crates/apiserver-double/src/profile.rs): the
# unit tests, and each integration test whose file uses the cluster harness.
# Not the fault tests that break the runtime or the disk (a hung pod, a
# containerd restart, a full disk) or churn pods: they make no request the
# other cluster tests do not make on both profiles, and would add minutes
# of containerd restarts and held faults (the apiserver outage test does
# run on both).
echo "== cargo test again against the 1.19 apiserver profile"
one_profile="fault_hung_pod fault_containerd_restart fault_disk_full churn"
targets=()
for name in $(sed -n 's/^name = "\(.*\)"$/\1/p' tests/Cargo.toml); do
  case " $one_profile " in *" $name "*) continue ;; esac
  if [ -f "tests/$name.rs" ] && grep -qE 'Joined::|Suite::|Cluster::' "tests/$name.rs"; then
    targets+=(--test "$name")
  fi
done
KUBELET_RS_APISERVER_PROFILE=1.19 cargo test --workspace --locked --lib "${targets[@]}" 2>&1 |
  tee -a /tmp/kubelet-rs-test.log
passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' /tmp/kubelet-rs-test.log | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' /tmp/kubelet-rs-test.log | awk '{s+=$1} END {print s+0}')
echo "$passed passed, $failed failed"
