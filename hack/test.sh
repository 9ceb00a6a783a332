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

echo "== cargo test (unit + integration against containerd)"
cargo test --workspace --locked 2>&1 | tee /tmp/kubelet-rs-test.log
passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' /tmp/kubelet-rs-test.log | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' /tmp/kubelet-rs-test.log | awk '{s+=$1} END {print s+0}')
echo "$passed passed, $failed failed"
