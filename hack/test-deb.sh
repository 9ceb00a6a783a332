#!/usr/bin/env bash
# Builds the kubelet-rs Debian package and tests it on this machine, as root:
# install, the files, the alternative, `systemd-analyze verify` of the
# installed unit and drop-in, `kubelet --version` through the alternative
# against kubeadm's regex, `kubelet check -o json`, that the install started
# nothing, then co-installation with stand-ins for upstream's kubelet and
# kubeadm packages (built here with dpkg-deb) in both orders, switching and
# removal. It purges everything it installed, also on failure, and never
# starts a kubelet.
#
#   hack/test-deb.sh    packages target/debug/kubelet-rs when it exists,
#                       else builds the release binary (hack/build-deb.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
  echo "hack/test-deb.sh: FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }

[ "$(id -u)" -eq 0 ] || fail "must run as root: it installs packages"
for tool in dpkg dpkg-deb dpkg-divert update-alternatives systemd-analyze jq; do
  command -v "$tool" >/dev/null || fail "$tool is needed"
done

# The stand-ins carry this maintainer, so a leftover of an interrupted run
# is told apart from a real package.
FAKE_MAINTAINER="kubelet-rs test-deb <test-deb@localhost>"
# Removed on a clean finish: if present, a previous run died before cleaning.
MARKER=/var/tmp/kubelet-rs-test-deb.running

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q ' installed$'; }
known() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -qv 'not-installed'; }
maintainer() { dpkg-query -W -f='${Maintainer}' "$1" 2>/dev/null || true; }

purge_ours() {
  local p
  for p in kubeadm kubelet kubelet-rs; do
    if known "$p"; then
      if [ "$p" = kubelet-rs ] || [ "$(maintainer "$p")" = "$FAKE_MAINTAINER" ]; then
        dpkg --purge "$p" >/dev/null
      fi
    fi
  done
}

# --- the machine must hold no kubelet we did not put here
if [ -e "$MARKER" ]; then
  echo "hack/test-deb.sh: cleaning up after an interrupted run"
  purge_ours
  # The paths that did not exist before that run (recorded in the marker).
  while read -r path; do rmdir "$path" 2>/dev/null || true; done <"$MARKER"
  rm -f "$MARKER"
fi
for p in kubelet kubeadm kubelet-rs; do
  if known "$p"; then
    fail "package $p is on this machine ($(maintainer "$p")): not touching a real node's kubelet"
  fi
done
absent() { [ ! -e "$1" ] && [ ! -L "$1" ]; }
absent /usr/bin/kubelet || fail "/usr/bin/kubelet exists: not touching a real node's kubelet"
absent /etc/default/kubelet || fail "/etc/default/kubelet exists: not touching a real node's kubelet settings"
! dpkg-divert --list | grep -q kubelet || fail "kubelet diversions exist: $(dpkg-divert --list | grep kubelet)"

# Paths the package creates; those absent now are removed again at the end.
created=()
for path in /etc/kubernetes/manifests /etc/kubernetes /var/lib/kubelet; do
  [ -e "$path" ] || created+=("$path")
done
printf '%s\n' "${created[@]}" >"$MARKER"
work=$(mktemp -d /tmp/kubelet-rs-test-deb.XXXXXX)
cleanup() {
  local rc=$?
  purge_ours || true
  for path in "${created[@]}"; do rmdir "$path" 2>/dev/null || true; done
  rm -rf "$work"
  rm -f "$MARKER"
  [ $rc -eq 0 ] || echo "hack/test-deb.sh: failed; the packages it installed are purged" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build
step "build the package"
if [ -x target/debug/kubelet-rs ]; then
  deb=$(hack/build-deb.sh --binary target/debug/kubelet-rs --compression gzip --out "$work")
else
  deb=$(hack/build-deb.sh --out "$work")
fi
[ -f "$deb" ] || fail "hack/build-deb.sh printed no package ($deb)"
echo "$deb"

# Stand-ins for upstream's packages, laid out as pkgs.k8s.io's are: the
# kubelet's binary, unit, /etc/default/kubelet (a conffile) and directories;
# kubeadm's binary and drop-in, depending on kubelet as kubeadm 1.28-1.31 do.
fake_pkg() { # dir name version depends -> path of the .deb; files from $work/dir
  local name=$2 version=$3 depends=$4 root=$work/$1
  mkdir -p "$root/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: all"
    echo "Maintainer: $FAKE_MAINTAINER"
    [ -z "$depends" ] || echo "Depends: $depends"
    echo "Description: stand-in for upstream's $name package (hack/test-deb.sh)"
  } >"$root/DEBIAN/control"
  dpkg-deb --root-owner-group -Zgzip --build "$root" "$work/$1.deb" >/dev/null
  echo "$work/$1.deb"
}
install -D -m 0755 /dev/stdin "$work/kubelet/usr/bin/kubelet" <<'EOF'
#!/bin/sh
echo "Kubernetes v1.31.0"
EOF
install -D -m 0644 /dev/stdin "$work/kubelet/usr/lib/systemd/system/kubelet.service" <<'EOF'
# upstream stand-in unit
[Unit]
Description=kubelet: The Kubernetes Node Agent
[Service]
ExecStart=/usr/bin/kubelet
[Install]
WantedBy=multi-user.target
EOF
install -D -m 0644 deploy/debian/default-kubelet "$work/kubelet/etc/default/kubelet"
install -d "$work/kubelet/var/lib/kubelet" "$work/kubelet/etc/kubernetes/manifests"
mkdir -p "$work/kubelet/DEBIAN"
echo /etc/default/kubelet >"$work/kubelet/DEBIAN/conffiles"
install -D -m 0755 /dev/stdin "$work/kubeadm/usr/bin/kubeadm" <<'EOF'
#!/bin/sh
echo "kubeadm stand-in"
EOF
install -D -m 0644 /dev/stdin "$work/kubeadm/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf" <<'EOF'
# upstream stand-in drop-in
[Service]
ExecStart=
ExecStart=/usr/bin/kubelet
EOF
# The older apt.kubernetes.io kubelet had its unit in /lib/systemd/system:
# with merged /usr the same file as ours, under a name dpkg thinks differs.
install -D -m 0755 "$work/kubelet/usr/bin/kubelet" "$work/legacy/usr/bin/kubelet"
sed 's/stand-in/legacy stand-in/' "$work/kubelet/usr/lib/systemd/system/kubelet.service" |
  install -D -m 0644 /dev/stdin "$work/legacy/lib/systemd/system/kubelet.service"
fake_kubelet=$(fake_pkg kubelet kubelet 1.31.0-1.1 "")
fake_kubeadm=$(fake_pkg kubeadm kubeadm 1.31.0-1.1 "kubelet (>= 1.19.0)")
fake_legacy=$(fake_pkg legacy kubelet 1.27.0-00 "")

# dpkg without a terminal: a conffile prompt fails the step instead of waiting.
pkg() { dpkg "$@" </dev/null || fail "dpkg $*"; }

# --- helpers for the checks
UNIT=/usr/lib/systemd/system/kubelet.service
DROPIN=/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf
same() { cmp -s "$1" "$2" || fail "$1 is not $3"; }
alt_value() { update-alternatives --query kubelet 2>/dev/null | sed -n 's/^Value: //p'; }
alt_list() { update-alternatives --list kubelet 2>/dev/null | sort | tr '\n' ' '; }
expect_alternative() { # value, listed alternatives (sorted, space-separated)
  [ "$(alt_value)" = "$1" ] || fail "kubelet alternative is '$(alt_value)', want $1"
  [ "$(alt_list)" = "$2 " ] || fail "kubelet alternatives are '$(alt_list)', want '$2'"
  [ "$(readlink -f /usr/bin/kubelet)" = "$1" ] ||
    fail "/usr/bin/kubelet resolves to $(readlink -f /usr/bin/kubelet), want $1"
}
diversions() { dpkg-divert --list | grep -c 'by kubelet-rs$' || true; }
version_of_kubelet() { /usr/bin/kubelet --version; }
KUBEADM_REGEX='^\s*Kubernetes v([0-9]+\.[0-9]+\.[0-9]+)([-0-9a-zA-Z_.+]*)?\s*$'

# --- 1. kubelet-rs alone
step "1. dpkg -i kubelet-rs (alone)"
pkg -i "$deb"
installed kubelet-rs || fail "kubelet-rs is not installed after dpkg -i"
[ -x /usr/bin/kubelet-rs ] || fail "no /usr/bin/kubelet-rs"
same "$UNIT" deploy/systemd/kubelet.service "deploy/systemd/kubelet.service"
same "$DROPIN" deploy/systemd/kubelet.service.d/10-kubeadm.conf "deploy/systemd/.../10-kubeadm.conf"
same /etc/default/kubelet deploy/debian/default-kubelet "the default /etc/default/kubelet"
for d in /var/lib/kubelet /etc/kubernetes/manifests; do
  [ -d "$d" ] || fail "no directory $d"
done
expect_alternative /usr/bin/kubelet-rs /usr/bin/kubelet-rs
[ "$(diversions)" = 4 ] || fail "want 4 diversions by kubelet-rs, have: $(dpkg-divert --list | grep kubelet)"
[ -L /etc/systemd/system/multi-user.target.wants/kubelet.service ] ||
  fail "kubelet.service is not enabled (no multi-user.target.wants link)"

step "systemd-analyze verify the installed kubelet.service with its drop-in"
verify_out=$(systemd-analyze verify --man=no "$UNIT" 2>&1) || {
  echo "$verify_out" >&2
  fail "systemd-analyze verify $UNIT exited non-zero"
}
if echo "$verify_out" | grep -i kubelet; then
  fail "systemd-analyze verify reports on kubelet.service (above)"
fi
[ -z "$verify_out" ] || echo "(about other units: $(echo "$verify_out" | wc -l) lines)"
# And it does read drop-ins: a broken one in a scratch unit directory shows.
mkdir -p "$work/units/kubelet.service.d"
printf '[Service]\nType=not-a-type\n' >"$work/units/kubelet.service.d/99-probe.conf"
SYSTEMD_UNIT_PATH="$work/units:" systemd-analyze verify --man=no "$UNIT" 2>&1 |
  grep -q '99-probe.conf' || fail "systemd-analyze verify does not read kubelet.service's drop-ins here"

step "kubelet --version through the alternative"
v=$(version_of_kubelet) || fail "/usr/bin/kubelet --version failed"
echo "$v"
echo "$v" | grep -Pq "$KUBEADM_REGEX" || fail "'$v' does not match kubeadm's regex"
echo "$v" | grep -q '+kubelet-rs\.' || fail "'$v' is not kubelet-rs"

step "kubelet check -o json through the alternative"
set +e
check_out=$(timeout 60 /usr/bin/kubelet check \
  --container-runtime-endpoint unix:///run/containerd/containerd.sock -o json 2>"$work/check.err")
check_rc=$?
set -e
case $check_rc in
0 | 1) ;;
*) cat "$work/check.err" >&2; fail "kubelet check exited $check_rc (want 0 or 1)" ;;
esac
echo "$check_out" | jq -e '.findings | type == "array"' >/dev/null ||
  fail "kubelet check -o json printed no document with a findings array: $check_out"
echo "exit $check_rc, $(echo "$check_out" | jq '.findings | length') findings"

step "the install started no kubelet"
pid1=$(ps -p 1 -o comm= || true)
if [ -d /run/systemd/system ]; then
  state=$(systemctl is-active kubelet.service || true)
  [ "$state" = inactive ] || fail "kubelet.service is $state after install, want inactive"
  echo "systemd is PID 1: kubelet.service is inactive"
else
  echo "no systemd as PID 1 here (PID 1 is $pid1): checking for kubelet processes instead"
fi
for exe in /proc/[0-9]*/exe; do
  case "$(readlink "$exe" 2>/dev/null)" in
  /usr/bin/kubelet-rs | /usr/bin/kubelet | /usr/bin/kubelet.upstream)
    fail "a kubelet runs: ${exe%/exe} ($(readlink "$exe"))"
    ;;
  esac
done

# --- 2. kubeadm's package installs with kubelet-rs as its kubelet
step "2. kubeadm (depends on kubelet) with only kubelet-rs"
pkg -i "$fake_kubeadm"
same "$DROPIN" deploy/systemd/kubelet.service.d/10-kubeadm.conf "ours while kubelet-rs is installed"
grep -q 'stand-in' "$DROPIN.upstream" || fail "kubeadm's drop-in is not diverted to $DROPIN.upstream"

# --- 3. upstream's kubelet after kubelet-rs
step "3. upstream kubelet installed after kubelet-rs"
pkg -i "$fake_kubelet"
expect_alternative /usr/bin/kubelet.upstream "/usr/bin/kubelet-rs /usr/bin/kubelet.upstream"
[ "$(version_of_kubelet)" = "Kubernetes v1.31.0" ] || fail "/usr/bin/kubelet is not upstream's"
same "$UNIT" deploy/systemd/kubelet.service "ours while kubelet-rs is installed"
grep -q 'stand-in' "$UNIT.upstream" || fail "upstream's unit is not diverted to $UNIT.upstream"
dpkg-query -S /etc/default/kubelet | grep -q '^kubelet:' || fail "/etc/default/kubelet is not upstream's conffile"
update-alternatives --set kubelet /usr/bin/kubelet-rs >/dev/null
version_of_kubelet | grep -q '+kubelet-rs\.' || fail "update-alternatives --set did not select kubelet-rs"
# The operator's choice holds through an upgrade (a reinstall) of either package.
pkg -i "$deb"
pkg -i "$fake_kubelet"
[ "$(alt_value)" = /usr/bin/kubelet-rs ] || fail "an upgrade undid update-alternatives --set kubelet-rs"
[ "$(diversions)" = 4 ] || fail "want 4 diversions by kubelet-rs after the upgrades"
same "$UNIT" deploy/systemd/kubelet.service "ours after upstream's upgrade"
grep -q 'stand-in' "$UNIT.upstream" || fail "upstream's upgraded unit is not diverted"
update-alternatives --auto kubelet >/dev/null
expect_alternative /usr/bin/kubelet.upstream "/usr/bin/kubelet-rs /usr/bin/kubelet.upstream"

# --- 4. removing kubelet-rs gives upstream its files back
step "4. remove kubelet-rs: upstream's files return"
pkg -r kubelet-rs
if [ -L /usr/bin/kubelet ] || [ ! -f /usr/bin/kubelet ]; then
  fail "/usr/bin/kubelet is not upstream's file again"
fi
[ "$(version_of_kubelet)" = "Kubernetes v1.31.0" ] || fail "/usr/bin/kubelet is not upstream's"
grep -q 'stand-in' "$UNIT" || fail "$UNIT is not upstream's again"
grep -q 'stand-in' "$DROPIN" || fail "$DROPIN is not kubeadm's again"
for path in "$UNIT.upstream" "$DROPIN.upstream" /usr/bin/kubelet.upstream; do
  absent "$path" || fail "diverted copy $path left behind"
done
[ "$(diversions)" = 0 ] || fail "diversions left: $(dpkg-divert --list | grep kubelet)"
[ -z "$(alt_list)" ] || fail "kubelet alternatives left: $(alt_list)"
[ -f /etc/default/kubelet ] || fail "upstream's /etc/default/kubelet is gone"

# --- 5. kubelet-rs after upstream's kubelet
step "5. kubelet-rs installed after upstream kubelet"
pkg -i "$deb"
expect_alternative /usr/bin/kubelet.upstream "/usr/bin/kubelet-rs /usr/bin/kubelet.upstream"
same "$UNIT" deploy/systemd/kubelet.service "ours while kubelet-rs is installed"
same "$DROPIN" deploy/systemd/kubelet.service.d/10-kubeadm.conf "ours while kubelet-rs is installed"
grep -q 'stand-in' "$UNIT.upstream" || fail "upstream's unit is not diverted"
grep -q 'stand-in' "$DROPIN.upstream" || fail "kubeadm's drop-in is not diverted"
systemd-analyze verify --man=no "$UNIT" 2>&1 | grep -i kubelet && fail "systemd-analyze verify reports on kubelet.service"

# --- 6. upstream's kubelet removed, kubelet-rs stays
step "6. purge upstream kubelet: kubelet-rs becomes /usr/bin/kubelet"
pkg -P kubelet
installed kubeadm || fail "kubeadm went with upstream's kubelet (kubelet-rs provides kubelet)"
expect_alternative /usr/bin/kubelet-rs /usr/bin/kubelet-rs
version_of_kubelet | grep -q '+kubelet-rs\.' || fail "/usr/bin/kubelet is not kubelet-rs"
same "$UNIT" deploy/systemd/kubelet.service "ours"

# --- 7. the older layout: upstream's unit under /lib, before and after
step "7. older upstream kubelet (unit in /lib/systemd/system), both orders"
pkg -P kubeadm
pkg -i "$fake_legacy"
same "$UNIT" deploy/systemd/kubelet.service "ours while kubelet-rs is installed"
grep -q 'legacy stand-in' "$UNIT.upstream" || fail "the older upstream unit is not set aside"
expect_alternative /usr/bin/kubelet.upstream "/usr/bin/kubelet-rs /usr/bin/kubelet.upstream"
pkg -r kubelet-rs
grep -q 'legacy stand-in' /lib/systemd/system/kubelet.service || fail "the older upstream unit is not back"
[ "$(version_of_kubelet)" = "Kubernetes v1.31.0" ] || fail "/usr/bin/kubelet is not upstream's"
pkg -i "$deb"
same "$UNIT" deploy/systemd/kubelet.service "ours while kubelet-rs is installed"
grep -q 'legacy stand-in' "$UNIT.upstream" || fail "the older upstream unit is not set aside"
# Its removal deletes its (diverted) unit, not ours under the other name.
pkg -P kubelet
same "$UNIT" deploy/systemd/kubelet.service "ours after the older upstream kubelet's removal"
expect_alternative /usr/bin/kubelet-rs /usr/bin/kubelet-rs

# --- 8. purge all: the machine as it was
step "8. purge: nothing left"
pkg -P kubelet-rs
for path in /usr/bin/kubelet /usr/bin/kubelet-rs /usr/bin/kubelet.upstream "$UNIT" "$UNIT.upstream" \
  "$DROPIN" "$DROPIN.upstream" /etc/default/kubelet /etc/alternatives/kubelet \
  /etc/systemd/system/multi-user.target.wants/kubelet.service \
  /var/lib/systemd/deb-systemd-helper-enabled/kubelet.service.dsh-also; do
  absent "$path" || fail "$path left after purge"
done
[ "$(diversions)" = 0 ] || fail "diversions left: $(dpkg-divert --list | grep kubelet)"
for path in "${created[@]}"; do
  rmdir "$path" 2>/dev/null || true
  [ ! -e "$path" ] || fail "$path (created by the package) is not empty after purge: $(ls -A "$path")"
done
echo "hack/test-deb.sh: ok"
