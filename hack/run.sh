#!/usr/bin/env bash
# Runs kubelet-rs in the foreground in standalone mode (no apiserver) on the
# example manifests in deploy/manifests, against the local containerd. Sets up
# the runtime first if it is missing. Extra arguments go to kubelet-rs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/run.sh: must run as root (containerd, /var/log/pods)" >&2
  exit 1
fi
deploy/setup-runtime.sh
cargo build --release --locked --bin kubelet-rs
cat >&2 <<'MSG'
kubelet-rs is starting in standalone mode on deploy/manifests.
Watch the pods from another shell:
  ctr -n k8s.io containers ls          (crictl pods / crictl ps, if crictl is installed)
  ls /var/log/pods/; tail -f /var/log/pods/default_web-*/httpd/0.log
  curl -s localhost:10248/healthz
Served on loopback only: /healthz on 127.0.0.1:10248, the node API on
https://127.0.0.1:10250 and the read-only port on 127.0.0.1:10255 (anonymous
requests are allowed there, as upstream's flag defaults; pass --address,
--anonymous-auth or --authorization-mode to choose otherwise).
Edit, add or remove files in deploy/manifests and watch the pods follow. Ctrl-C stops
kubelet-rs; the containers keep running and are adopted on the next start.
MSG
exec target/release/kubelet-rs \
  --pod-manifest-path "$PWD/deploy/manifests" \
  --container-runtime-endpoint unix:///run/containerd/containerd.sock \
  --root-dir /var/lib/kubelet-rs \
  --v 2 "$@"
