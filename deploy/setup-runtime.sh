#!/usr/bin/env bash
# Installs and starts what kubelet-rs runs on, idempotently and only from Debian
# packages: containerd + runc + CNI plugins, a loopback-only image registry on
# 127.0.0.1:5000, and the project's own busybox and pause images built from
# busybox-static with umoci + skopeo. A second loopback registry on
# 127.0.0.1:5001 requires basic auth (htpasswd, bcrypt; user $AUTH_USER,
# password $AUTH_PASSWORD below) and holds the same busybox as
# private/busybox:1.35, for imagePullSecrets tests. dbus-daemon runs the
# private bus of the graceful node shutdown tests (a test logind on it; these
# machines have no systemd). Safe to run again at any
# time: each step checks first and does only what is missing.
#
#   sudo deploy/setup-runtime.sh          # set up (or repair) the node
#   deploy/setup-runtime.sh --check       # exit non-zero with a reason if anything is missing
#   sudo deploy/setup-runtime.sh --stop-containerd    # stop containerd (SIGTERM; containers keep
#                                                     # running in their shims), wait until its socket is gone
#   sudo deploy/setup-runtime.sh --start-containerd   # start it again the way step 4 does, wait until it answers
#   sudo deploy/setup-runtime.sh --lane2  # after the set-up: a second containerd for the second test lane
#
# --stop/--start-containerd are for fault tests (a containerd restart under
# running pods); they touch nothing but the containerd daemon this script
# starts (never the second lane's).
#
# --lane2 starts a second containerd (own socket /run/containerd-lane2/,
# root and state; the same CNI network, registries and
# images), so that hack/test.sh can run the two apiserver profiles' passes
# at once without one kubelet removing the other's pods (tests/lane.rs).
#
# The CNI bridge is added only when the node has no network of its own: if
# the CNI config directory holds any other network configuration, it is left
# alone (two bridges on one subnet make the host route pod IPs to the wrong
# one). KUBELET_RS_CNI_DIR overrides that directory (default /etc/cni/net.d),
# for tests; sourcing this file defines its functions without running it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOCK=/run/containerd/containerd.sock
LANE2_CONFIG=/etc/containerd/lane2.toml
LANE2_SOCK=/run/containerd-lane2/containerd.sock
REGISTRY=127.0.0.1:5000
STATE=/var/lib/kubelet-rs
LOGDIR=/var/log/kubelet-rs
BUSYBOX_TAGS=(1.35 latest)
PAUSE_TAG=3.9
AGNHOST_IMAGE=agnhost-entrypoint:1.0
# The registry that needs credentials, and the fixed test credentials for it
# (tests/pull_secrets.rs uses the same). Loopback only: not a secret.
AUTH_REGISTRY=127.0.0.1:5001
AUTH_USER=kubelet-test
AUTH_PASSWORD=kubelet-test-pull-secret
AUTH_IMAGE=private/busybox:1.35
PACKAGES=(containerd runc containernetworking-plugins iptables docker-registry umoci skopeo busybox-static apache2-utils dbus-daemon)
CNI_DIR="${KUBELET_RS_CNI_DIR:-/etc/cni/net.d}"
CNI_FILE=10-kubelet-rs-bridge.conflist

log() { printf 'setup-runtime: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

containerd_up() { [ -S "$SOCK" ] && ctr --address "$SOCK" version >/dev/null 2>&1; }
lane2_up() { [ -S "$LANE2_SOCK" ] && ctr --address "$LANE2_SOCK" version >/dev/null 2>&1; }
# containerd processes other than the second lane's.
main_pids() {
  local p
  for p in $(pgrep -x containerd); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "--config $LANE2_CONFIG" || echo "$p"
  done
}
main_running() { [ -n "$(main_pids)" ]; }
kill_main() { local p; p=$(main_pids); [ -z "$p" ] || kill "$@" $p 2>/dev/null || true; }
registry_up() { curl -fsS -o /dev/null "http://$REGISTRY/v2/" 2>/dev/null; }
image_in_registry() { skopeo inspect --tls-verify=false --raw "docker://$REGISTRY/$1" >/dev/null 2>&1; }
# The auth registry answers /v2/ with 401 without credentials, 200 with them.
auth_registry_up() { curl -fsS -o /dev/null -u "$AUTH_USER:$AUTH_PASSWORD" "http://$AUTH_REGISTRY/v2/" 2>/dev/null; }
auth_registry_listening() { curl -sS -o /dev/null "http://$AUTH_REGISTRY/v2/" 2>/dev/null; }
image_in_auth_registry() {
  skopeo inspect --tls-verify=false --creds "$AUTH_USER:$AUTH_PASSWORD" --raw "docker://$AUTH_REGISTRY/$1" >/dev/null 2>&1
}

check() {
  local bad=0
  containerd_up || { log "containerd is not answering on $SOCK"; bad=1; }
  registry_up || { log "no image registry on $REGISTRY"; bad=1; }
  if [ $bad -eq 0 ]; then
    for t in "${BUSYBOX_TAGS[@]}"; do image_in_registry "busybox:$t" || { log "image busybox:$t missing"; bad=1; }; done
    image_in_registry "pause:$PAUSE_TAG" || { log "image pause:$PAUSE_TAG missing"; bad=1; }
    image_in_registry "$AGNHOST_IMAGE" || { log "image $AGNHOST_IMAGE missing"; bad=1; }
  fi
  if ! auth_registry_up; then
    log "no image registry taking the test credentials on $AUTH_REGISTRY"; bad=1
  else
    image_in_auth_registry "$AUTH_IMAGE" || { log "image $AUTH_REGISTRY/$AUTH_IMAGE missing"; bad=1; }
  fi
  return $bad
}

# Installs the kubelet-rs bridge network into CNI config directory $1 unless
# the directory already holds another network configuration (any file
# containerd's CNI loader reads: *.conf, *.conflist, *.json), which is then
# left untouched. Our own file is rewritten, or removed when another network
# has appeared since, so that only one network is ever configured.
install_cni() {
  local dir=$1 f
  local others=()
  mkdir -p "$dir"
  for f in "$dir"/*.conf "$dir"/*.conflist "$dir"/*.json; do
    [ -e "$f" ] || continue
    [ "$(basename "$f")" = "$CNI_FILE" ] && continue
    others+=("$f")
  done
  if [ ${#others[@]} -gt 0 ]; then
    log "CNI: $dir already holds a network configuration (${others[*]}); leaving it alone, no kubelet-rs bridge added"
    if [ -e "$dir/$CNI_FILE" ]; then
      rm -f "$dir/$CNI_FILE"
      log "CNI: removed our earlier $dir/$CNI_FILE so that only that network is configured"
    fi
    return 0
  fi
  if cmp -s "$here/cni/$CNI_FILE" "$dir/$CNI_FILE"; then
    log "CNI: $dir/$CNI_FILE is up to date"
  else
    install -m 0644 "$here/cni/$CNI_FILE" "$dir/$CNI_FILE"
    log "CNI: wrote $dir/$CNI_FILE (bridge kubeletrs0, 10.88.0.0/16)"
  fi
}

# containerd running (systemd where it is PID 1, else a background daemon);
# with restart=1 a running one is restarted first (for a new config).
start_containerd() {
  local restart=${restart:-0}
  if [ -d /run/systemd/system ]; then
    systemctl enable containerd >/dev/null 2>&1 || true
    if [ $restart -eq 1 ]; then systemctl restart containerd; else systemctl start containerd; fi
  else
    if [ $restart -eq 1 ] && main_running; then
      log "restarting containerd for the new config"
      kill_main
      for _ in $(seq 50); do main_running || break; sleep 0.2; done
    fi
    # A containerd that is still shutting down (or still starting) holds no
    # socket: give it time to exit or come up before deciding.
    for _ in $(seq 50); do
      containerd_up && return 0
      main_running || break
      sleep 0.2
    done
    if main_running && ! containerd_up; then
      log "containerd is running without its socket; restarting it"
      kill_main
      for _ in $(seq 50); do main_running || break; sleep 0.2; done
    fi
    if ! main_running; then
      log "starting containerd (log: $LOGDIR/containerd.log)"
      setsid nohup containerd --config /etc/containerd/config.toml >>"$LOGDIR/containerd.log" 2>&1 < /dev/null &
    fi
  fi
  for _ in $(seq 100); do containerd_up && return 0; sleep 0.2; done
  die "containerd did not come up on $SOCK (see $LOGDIR/containerd.log)"
}

# Stops the running containerd (systemd's unit, else the daemon by its pid,
# SIGTERM: its shims and containers keep running) and waits until nothing
# answers on its socket.
stop_containerd() {
  local pid
  if [ -d /run/systemd/system ]; then
    systemctl stop containerd
  elif pid="$(main_pids | sed -n 1p)" && [ -n "$pid" ]; then
    log "stopping containerd (pid $pid)"
    kill -TERM "$pid" || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "containerd (pid $pid) did not exit in 10s; killing it"
      kill -KILL "$pid" || true
    fi
  fi
  for _ in $(seq 100); do containerd_up || return 0; sleep 0.1; done
  die "containerd still answers on $SOCK"
}

# The second lane's containerd: the main config with its own root, state
# and socket (the CRI stream server already takes a free port); restarted
# when that config changes.
start_lane2() {
  [ -f /etc/containerd/config.toml ] || die "no /etc/containerd/config.toml: run $0 without arguments first"
  local want pid
  want="$(mktemp)"
  sed -e 's|^root = "/var/lib/containerd"|root = "/var/lib/containerd-lane2"|' \
      -e 's|^state = "/run/containerd"|state = "/run/containerd-lane2"|' \
      -e 's|address = "/run/containerd/containerd.sock"|address = "/run/containerd-lane2/containerd.sock"|' \
      /etc/containerd/config.toml > "$want"
  for key in 'root = "/var/lib/containerd-lane2"' 'state = "/run/containerd-lane2"' \
    "address = \"$LANE2_SOCK\""; do
    grep -qF "$key" "$want" || die "could not set $key in $LANE2_CONFIG"
  done
  if ! cmp -s "$want" "$LANE2_CONFIG"; then
    install -m 0644 "$want" "$LANE2_CONFIG"
    log "wrote $LANE2_CONFIG"
    if pid="$(pgrep -f -x "containerd --config $LANE2_CONFIG")"; then
      log "restarting the second lane's containerd for its new config"
      kill $pid || true
      for _ in $(seq 50); do lane2_up || break; sleep 0.2; done
    fi
  fi
  rm -f "$want"
  lane2_up && return 0
  pkill -f -x "containerd --config $LANE2_CONFIG" || true
  log "starting the second lane's containerd on $LANE2_SOCK (log: $LOGDIR/containerd-lane2.log)"
  setsid nohup containerd --config "$LANE2_CONFIG" >>"$LOGDIR/containerd-lane2.log" 2>&1 < /dev/null &
  for _ in $(seq 100); do lane2_up && return 0; sleep 0.2; done
  die "the second lane's containerd did not come up on $LANE2_SOCK (see $LOGDIR/containerd-lane2.log)"
}

# Sourced, as by a test: define the functions only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0
fi

if [ "${1:-}" = "--check" ]; then
  check && log "runtime ready"
  exit $?
fi

case "${1:-}" in
--stop-containerd | --start-containerd)
  [ "$(id -u)" -eq 0 ] || die "must run as root (it stops and starts containerd)"
  mkdir -p "$LOGDIR"
  if [ "$1" = --stop-containerd ]; then
    stop_containerd
    log "containerd stopped"
  else
    [ -f /etc/containerd/config.toml ] || die "no /etc/containerd/config.toml: run $0 without arguments first"
    restart=0 start_containerd
    log "containerd answers on $SOCK"
  fi
  exit 0
  ;;
--lane2)
  [ "$(id -u)" -eq 0 ] || die "must run as root (it starts containerd)"
  mkdir -p "$LOGDIR"
  start_lane2
  log "second lane: containerd answers on $LANE2_SOCK"
  exit 0
  ;;
"") ;;
*) die "unknown argument $1 (use --check, --stop-containerd, --start-containerd, --lane2 or nothing)" ;;
esac

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts containerd)"
mkdir -p "$STATE" "$LOGDIR"

# 1. Packages.
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. CNI: one bridge network, no masquerading (traffic stays on the node),
#    unless the node already has a network.
install_cni "$CNI_DIR"

# 3. containerd config: the default plus deploy/containerd/kubelet-rs.toml.
mkdir -p /etc/containerd
want="$(mktemp)"
containerd config default \
  | sed -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
        -e "s|sandbox_image = \".*\"|sandbox_image = \"localhost:5000/pause:$PAUSE_TAG\"|" \
        -e 's|bin_dir = "/opt/cni/bin"|bin_dir = "/usr/lib/cni"|' \
  | awk '{print} /^ *\[plugins\."io\.containerd\.grpc\.v1\.cri"\.registry\.mirrors\]$/ {
          print "        [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"localhost:5000\"]";
          print "          endpoint = [\"http://localhost:5000\"]";
          print "        [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"localhost:5001\"]";
          print "          endpoint = [\"http://localhost:5001\"]" }' > "$want"
grep -q 'restrict_oom_score_adj = true' "$want" || die "could not set restrict_oom_score_adj in containerd config"
grep -q 'mirrors."localhost:5000"' "$want" || die "could not add the localhost:5000 mirror to containerd config"
grep -q 'mirrors."localhost:5001"' "$want" || die "could not add the localhost:5001 mirror to containerd config"
restart=0
if ! cmp -s "$want" /etc/containerd/config.toml; then
  log "writing /etc/containerd/config.toml"
  install -m 0644 "$want" /etc/containerd/config.toml
  restart=1
fi
rm -f "$want"

# 4. containerd running.
if [ $restart -eq 1 ] || ! containerd_up; then start_containerd; fi

# 5. Registry on loopback.
mkdir -p "$STATE/registry" /etc/kubelet-rs
install -m 0644 "$here/registry.yml" /etc/kubelet-rs/registry.yml
if ! registry_up; then
  log "starting docker-registry on $REGISTRY (log: $LOGDIR/registry.log)"
  setsid nohup docker-registry serve /etc/kubelet-rs/registry.yml >>"$LOGDIR/registry.log" 2>&1 < /dev/null &
  for _ in $(seq 100); do registry_up && break; sleep 0.2; done
  registry_up || die "registry did not come up on $REGISTRY (see $LOGDIR/registry.log)"
fi

# 5b. Registry with basic auth on loopback (htpasswd needs bcrypt: htpasswd -B).
#     Its config and password file are rewritten only when they change, and
#     a running registry is then restarted (it reads both at start only).
mkdir -p "$STATE/registry-auth"
restart_auth=0
if ! htpasswd -vb "$STATE/registry-auth.htpasswd" "$AUTH_USER" "$AUTH_PASSWORD" >/dev/null 2>&1; then
  htpasswd -Bbc "$STATE/registry-auth.htpasswd" "$AUTH_USER" "$AUTH_PASSWORD" 2>/dev/null
  log "wrote $STATE/registry-auth.htpasswd (user $AUTH_USER)"
  restart_auth=1
fi
want="$(mktemp)"
cat > "$want" <<EOF
# Local image registry for kubelet-rs imagePullSecrets tests: loopback only,
# basic auth. Written by deploy/setup-runtime.sh.
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry-auth
  delete:
    enabled: true
auth:
  htpasswd:
    realm: kubelet-rs-test
    path: $STATE/registry-auth.htpasswd
http:
  addr: $AUTH_REGISTRY
EOF
if ! cmp -s "$want" /etc/kubelet-rs/registry-auth.yml; then
  install -m 0644 "$want" /etc/kubelet-rs/registry-auth.yml
  log "wrote /etc/kubelet-rs/registry-auth.yml"
  restart_auth=1
fi
rm -f "$want"
# A registry serving an older config is replaced (found by its command line).
if [ $restart_auth -eq 1 ] && pid="$(pgrep -o -f -x 'docker-registry serve /etc/kubelet-rs/registry-auth.yml')"; then
  log "restarting the registry on $AUTH_REGISTRY for its new config"
  kill "$pid" || true
  for _ in $(seq 50); do auth_registry_listening || break; sleep 0.2; done
fi
if ! auth_registry_up; then
  log "starting docker-registry with basic auth on $AUTH_REGISTRY (log: $LOGDIR/registry-auth.log)"
  setsid nohup docker-registry serve /etc/kubelet-rs/registry-auth.yml >>"$LOGDIR/registry-auth.log" 2>&1 < /dev/null &
  for _ in $(seq 100); do auth_registry_up && break; sleep 0.2; done
  auth_registry_up || die "registry did not come up on $AUTH_REGISTRY (see $LOGDIR/registry-auth.log)"
fi

# 6. Images, built from busybox-static and pushed once.
build_image() { # name tag entrypoint-json cmd-json...
  local name=$1 tag=$2 work
  shift 2
  work="$(mktemp -d)"
  umoci init --layout "$work/oci" >/dev/null
  umoci new --image "$work/oci:$tag"
  umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
  mkdir -p "$work/bundle/rootfs/bin" "$work/bundle/rootfs/tmp" "$work/bundle/rootfs/etc"
  install -m 0755 /bin/busybox "$work/bundle/rootfs/bin/busybox"
  for app in $(/bin/busybox --list); do
    [ "$app" = busybox ] || ln -sf busybox "$work/bundle/rootfs/bin/$app"
  done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$work/bundle/rootfs/etc/passwd"
  echo 'root:x:0:' > "$work/bundle/rootfs/etc/group"
  [ -z "${IMAGE_EXTRA:-}" ] || "$IMAGE_EXTRA" "$work/bundle/rootfs"
  umoci repack --image "$work/oci:$tag" "$work/bundle" >/dev/null
  umoci config --image "$work/oci:$tag" --config.env PATH=/bin "$@" >/dev/null
  skopeo copy --quiet --dest-tls-verify=false "oci:$work/oci:$tag" "docker://$REGISTRY/$name:$tag"
  rm -rf "$work"
  log "pushed $REGISTRY/$name:$tag"
}
for t in "${BUSYBOX_TAGS[@]}"; do
  image_in_registry "busybox:$t" || build_image busybox "$t" --config.cmd sh
done
image_in_registry "pause:$PAUSE_TAG" || build_image pause "$PAUSE_TAG" \
  --config.entrypoint /bin/sh --config.entrypoint -c \
  --config.entrypoint 'trap "exit 0" TERM INT; sleep 2147483647 & wait'

# Stand-in for agnhost's entrypoint defaults (ENTRYPOINT /agnhost, CMD pause)
# for the "Docker Containers" specs: `/agnhost entrypoint-tester ARGS` prints
# its argv as Go's fmt does ("[/agnhost entrypoint-tester ARGS]"), `pause`
# prints "Paused" and sleeps; /agnhost-2 is the same program.
agnhost_files() { # rootfs
  cat > "$1/agnhost" <<'SCRIPT'
#!/bin/sh
case "$1" in
entrypoint-tester) echo "[$0 $*]" ;;
pause) echo Paused; trap 'exit 0' TERM INT; sleep 2147483647 & wait ;;
*) echo "unknown subcommand: $1" >&2; exit 1 ;;
esac
SCRIPT
  chmod 0755 "$1/agnhost"
  cp "$1/agnhost" "$1/agnhost-2"
}
image_in_registry "$AGNHOST_IMAGE" || IMAGE_EXTRA=agnhost_files build_image "${AGNHOST_IMAGE%%:*}" "${AGNHOST_IMAGE#*:}" \
  --config.entrypoint /agnhost --config.cmd pause

# The same busybox, behind the test credentials.
if ! image_in_auth_registry "$AUTH_IMAGE"; then
  skopeo copy --quiet --src-tls-verify=false --dest-tls-verify=false \
    --dest-creds "$AUTH_USER:$AUTH_PASSWORD" \
    "docker://$REGISTRY/busybox:1.35" "docker://$AUTH_REGISTRY/$AUTH_IMAGE"
  log "pushed $AUTH_REGISTRY/$AUTH_IMAGE"
fi

check
log "runtime ready: containerd on $SOCK, registry on $REGISTRY, registry with basic auth on $AUTH_REGISTRY"
