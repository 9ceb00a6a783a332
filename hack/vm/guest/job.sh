#!/usr/bin/env bash
# The guest side of hack/vm/run.sh, run at boot by kubelet-rs-vm-job.service
# from the read-only job share (/mnt/job): mounts the host's workspace at the
# host's own path, records the guest's versions and cgroup setup, runs each
# test binary listed in /mnt/job/tests.list and writes everything, plus the
# exit code, to /mnt/results. The unit powers the guest off when this ends.
#
# /mnt/job holds: job.env (WORKSPACE, TARGET_DIR, SUITE, SET, TEST_THREADS,
# TEST_TIMEOUT, JOB_DEADLINE (guest uptime by which the tests must end),
# LANE2), tests.list (one test run per line:
# label<TAB>executable<TAB>KEY=VALUE words or -<TAB>args), env.list
# (KEY=VALUE lines for every test). With LANE2=1 a second containerd runs
# runc with the cgroupfs driver on /run/containerd-lane2/containerd.sock
# (tests/lane.rs lane 2, KUBELET_RS_TEST_LANE=2), as
# `deploy/setup-runtime.sh --lane2` does on the host.
set -uo pipefail

R=/mnt/results
J=/mnt/job
mkdir -p "$R/tests" "$R/guest"
exec > >(tee -a "$R/job.log") 2>&1
say() { printf '[%s +%ss] %s\n' "$(date -u +%T)" "$(cut -d' ' -f1 /proc/uptime)" "$*"; }
fail() { say "ERROR: $*"; echo 2 >"$R/exit-code"; exit 2; }

say "job starts (uptime $(cut -d' ' -f1 /proc/uptime) s)"
echo "job_start_uptime=$(cut -d' ' -f1 /proc/uptime)" >"$R/guest/timings"
# shellcheck source=/dev/null
. "$J/job.env" || fail "no $J/job.env"

# The workspace (and the target dir, if elsewhere) at the host's own paths.
mount_share() { # tag path
  mkdir -p "$2"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro,cache=loose "$1" "$2" ||
    fail "cannot mount the 9p share $1 at $2"
}
mount_share kws "$WORKSPACE"
if [ "${TARGET_SHARED:-0}" = 1 ]; then mount_share ktarget "$TARGET_DIR"; fi

# The guest as the tests see it.
{
  echo "suite: $SUITE"
  echo "kernel: $(uname -r)"
  echo "cmdline: $(cat /proc/cmdline)"
  echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup)"
  echo "cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
  echo "containerd: $(containerd --version)"
  echo "runc: $(runc --version | head -n1)"
  echo "systemd: $(systemctl --version | head -n1)"
  echo "system state: $(systemctl is-system-running 2>&1)"
} >"$R/guest/versions.txt" 2>&1
cat "$R/guest/versions.txt"
systemctl --version >"$R/guest/systemctl-version.txt" 2>&1
runc --version >"$R/guest/runc-version.txt" 2>&1
cat /proc/cmdline >"$R/guest/cmdline.txt"
stat -fc %T /sys/fs/cgroup >"$R/guest/cgroupfs.txt"
containerd config dump >"$R/guest/containerd-config.toml" 2>&1
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || fail "/sys/fs/cgroup is not cgroup v2"

# containerd answers (the unit is ordered after it; it may still be starting).
for _ in $(seq 60); do
  ctr version >/dev/null 2>&1 && break
  sleep 1
done
ctr version >/dev/null 2>&1 || fail "containerd does not answer"

# Lane 2: the same config with its own root, state and socket, and runc's
# cgroupfs driver.
start_lane2() {
  local cfg=/etc/containerd/lane2.toml sock=/run/containerd-lane2/containerd.sock
  sed -E \
    -e "s#^(root = )['\"]/var/lib/containerd['\"]#\\1'/var/lib/containerd-lane2'#" \
    -e "s#^(state = )['\"]/run/containerd['\"]#\\1'/run/containerd-lane2'#" \
    -e "s#(address = )['\"]/run/containerd/containerd.sock['\"]#\\1'$sock'#" \
    -e 's/(SystemdCgroup = )true/\1false/' \
    -e 's#/var/run/nri/nri.sock#/var/run/nri/nri-lane2.sock#' \
    /etc/containerd/config.toml >"$cfg"
  for want in "'/var/lib/containerd-lane2'" "'/run/containerd-lane2'" "'$sock'" "SystemdCgroup = false"; do
    grep -qF "$want" "$cfg" || fail "lane 2 containerd config: could not set $want"
  done
  systemd-run --unit=containerd-lane2 --property=Delegate=yes --property=KillMode=process \
    /usr/bin/containerd --config "$cfg" || fail "cannot start the lane 2 containerd"
  for _ in $(seq 60); do
    ctr --address "$sock" version >/dev/null 2>&1 && break
    sleep 1
  done
  ctr --address "$sock" version >/dev/null 2>&1 || fail "the lane 2 containerd does not answer on $sock"
  containerd --config "$cfg" config dump >"$R/guest/containerd-lane2-config.toml" 2>&1
  say "lane 2 containerd (cgroupfs driver) answers on $sock"
}
if [ "${LANE2:-0}" = 1 ]; then start_lane2; fi

# The host's registry answers through the qemu user network.
if ! curl_ok="$(busybox wget -q -O - http://10.0.2.2:5000/v2/ 2>&1)"; then
  say "warning: the host registry http://10.0.2.2:5000/v2/ does not answer: $curl_ok"
fi

# Test environment: as cargo test would run them (cwd = the package dir).
export KUBELET_RS_VM="$SUITE" RUST_BACKTRACE=1 CARGO_MANIFEST_DIR="$WORKSPACE/tests"
while IFS= read -r kv; do
  [ -n "$kv" ] && export "${kv?}"
done <"$J/env.list"
env | sort >"$R/guest/test-env.txt"

rc=0
echo "tests_start_uptime=$(cut -d' ' -f1 /proc/uptime)" >>"$R/guest/timings"
while IFS=$'\t' read -r name exe tenv args; do
  [ -n "$name" ] || continue
  [ "$tenv" != - ] || tenv=
  say "== $name: ${tenv:+$tenv }$exe --test-threads=$TEST_THREADS $args"
  t0=$(date +%s)
  # No test may eat the time the job needs to collect the results and power
  # off before the host's deadline (the guest's uptime is about the time
  # since qemu started).
  left=$((${JOB_DEADLINE:-999999} - $(cut -d. -f1 /proc/uptime)))
  limit=$TEST_TIMEOUT
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    say "== $name: skipped, no time left before the deadline"
    echo 124 >"$R/tests/$name.rc"
    rc=1
    continue
  fi
  # shellcheck disable=SC2086 # tenv and args are the set file's words
  (cd "$WORKSPACE/tests" && env $tenv timeout --kill-after=10 "$limit" "$exe" --test-threads="$TEST_THREADS" $args) \
    >"$R/tests/$name.stdout" 2>"$R/tests/$name.stderr"
  trc=$?
  echo "$trc" >"$R/tests/$name.rc"
  [ "$trc" -ne 124 ] && [ "$trc" -ne 137 ] || say "== $name: killed after ${limit}s (timeout)"
  echo "${name}_seconds=$(($(date +%s) - t0))" >>"$R/guest/timings"
  say "== $name: exit $trc in $(($(date +%s) - t0)) s; $(grep -h '^test result:' "$R/tests/$name.stdout" | tr '\n' ' ')"
  [ "$trc" -eq 0 ] || rc=1
done <"$J/tests.list"
echo "tests_end_uptime=$(cut -d' ' -f1 /proc/uptime)" >>"$R/guest/timings"

# What the kubelets left behind.
{
  echo "## systemd-cgls"
  systemd-cgls --no-pager 2>&1
  echo "## /sys/fs/cgroup/kubepods.slice (and any other kubepods) directories"
  find /sys/fs/cgroup -type d \( -name 'kubepods*' -o -path '*kubepods*' \) 2>/dev/null | sort
} >"$R/guest/cgroups.txt"
crictl_like="$(ctr -n k8s.io containers list 2>&1)"
echo "$crictl_like" >"$R/guest/containers-left.txt"
journalctl -b --no-pager -o short-monotonic >"$R/guest/journal.txt" 2>&1
journalctl -b --no-pager -u containerd -o short-monotonic >"$R/guest/containerd.log" 2>&1
systemctl --failed --no-pager >"$R/guest/failed-units.txt" 2>&1

# Containers a failed test left running would hold the poweroff for their
# stop timeouts (90 s per scope): kill whatever runs under the kubelets'
# cgroup trees first (cgroup.kill, Linux 5.14+).
for kill_file in /sys/fs/cgroup/kubepods*/cgroup.kill /sys/fs/cgroup/kubelet-rs*/cgroup.kill; do
  [ -f "$kill_file" ] && echo 1 >"$kill_file" 2>/dev/null
done
systemctl stop containerd-lane2.service 2>/dev/null

echo "$rc" >"$R/exit-code"
say "job done, exit code $rc"
sync
exit 0
