#!/usr/bin/env bash
# Runs a set of kubelet-rs integration tests inside a throw-away Debian VM
# (qemu TCG; systemd as PID 1 on cgroup v2; Debian's containerd and runc
# with the systemd cgroup driver), so the kubelet meets a systemd node.
#
#   hack/vm/run.sh <trixie|sid> <set>       # run hack/vm/sets/<set>; results in target/vm/<suite>/<set>/
#   hack/vm/run.sh <trixie|sid> --shell     # boot the guest with its console here (Ctrl-A x quits)
#
# Steps: installs the host's prerequisites (qemu-system-x86, mmdebstrap) if
# missing; checks the host's loopback registries (deploy/setup-runtime.sh
# starts them; the guest pulls from them as 10.0.2.2:5000/5001); builds or
# reuses the image (hack/vm/image.sh); builds the set's test binaries on the
# host (cargo test --no-run; KUBELET_RS_VM_BUILD=0 takes the newest
# target/debug/deps/<test>-<hash> instead); boots a fresh copy-on-write
# overlay of the image with the workspace shared read-only at its own path;
# the guest runs the tests (hack/vm/guest/job.sh), writes the results and
# powers off. Exits non-zero when a test failed, the guest wrote no exit
# code, or the deadline passed (the guest is then killed).
#
# Environment: KUBELET_RS_VM_TIMEOUT (seconds for the whole VM run, default
# 1800), KUBELET_RS_VM_MEM (MiB, 4096), KUBELET_RS_VM_CPUS (2),
# KUBELET_RS_VM_TEST_THREADS (1), KUBELET_RS_VM_TEST_TIMEOUT (seconds per
# test binary inside the guest, default the whole deadline),
# KUBELET_RS_VM_BUILD (1), KUBELET_RS_VM_CACHE (image cache, see image.sh),
# CARGO_TARGET_DIR.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
TIMEOUT=${KUBELET_RS_VM_TIMEOUT:-1800}
MEM=${KUBELET_RS_VM_MEM:-4096}
CPUS=${KUBELET_RS_VM_CPUS:-2}
THREADS=${KUBELET_RS_VM_TEST_THREADS:-1}
TEST_TIMEOUT=${KUBELET_RS_VM_TEST_TIMEOUT:-$TIMEOUT}
BUILD=${KUBELET_RS_VM_BUILD:-1}
HOST_PACKAGES=(qemu-system-x86 mmdebstrap e2fsprogs curl)

log() { printf 'vm-run: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { die "usage: $0 <trixie|sid> <set>|--shell   (sets: $(ls "$here/sets" | tr '\n' ' '))"; }

suite=${1:-}
what=${2:-}
case "$suite" in trixie | sid) ;; *) usage ;; esac
[ -n "$what" ] || usage
shell=0
if [ "$what" = --shell ]; then
  shell=1
  set_name=shell
else
  set_name=$what
  set_file="$here/sets/$set_name"
  [ -f "$set_file" ] || die "no test set $set_file"
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, builds images with mmdebstrap)"
t_start=$(date +%s)

# 1. Host prerequisites. Never qemu-utils: qemu-img is used if present.
missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    die "could not install ${missing[*]}"
fi
for tool in qemu-system-x86_64 mmdebstrap mkfs.ext4 curl flock; do
  command -v "$tool" >/dev/null || die "$tool is missing after installing ${HOST_PACKAGES[*]}"
done

# 2. The host's registries (the guest reaches them as 10.0.2.2).
pause_tag="$(sed -n 's/^PAUSE_TAG=\([^ ]*\)$/\1/p' "$repo/deploy/setup-runtime.sh")"
curl -fsS --max-time 10 -o /dev/null http://127.0.0.1:5000/v2/ ||
  die "no image registry on 127.0.0.1:5000: run 'sudo deploy/setup-runtime.sh' first"
curl -fsS --max-time 10 http://127.0.0.1:5000/v2/pause/tags/list | grep -q "\"$pause_tag\"" ||
  die "localhost:5000/pause:$pause_tag is not in the registry: run 'sudo deploy/setup-runtime.sh'"
code="$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' http://127.0.0.1:5001/v2/ || true)"
case "$code" in 200 | 401) ;; *) die "no image registry on 127.0.0.1:5001 (HTTP '$code'): run 'sudo deploy/setup-runtime.sh'" ;; esac

# 3. The image.
t0=$(date +%s)
image="$("$here/image.sh" "$suite")" || die "image build failed"
t_image=$(($(date +%s) - t0))
for f in disk.img vmlinuz initrd.img; do [ -f "$image/$f" ] || die "$image/$f is missing"; done

# 4. The test binaries.
target_dir="$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")"
tests=() # "name<TAB>KEY=VALUE words<TAB>args"
envs=()
lane2=0
if [ $shell -eq 0 ]; then
  while read -r first rest; do
    case "$first" in
    "" | \#*) continue ;;
    env)
      [[ "$rest" == *=* ]] || die "$set_file: 'env $rest' is not KEY=VALUE"
      envs+=("$rest")
      ;;
    lane2) lane2=1 ;;
    *)
      # KEY=VALUE words before the test name are that run's own environment.
      tenv=
      while [[ "$first" == *=* ]]; do
        tenv="${tenv:+$tenv }$first"
        read -r first rest <<<"$rest"
      done
      [ -n "$first" ] || die "$set_file: a line with no test name"
      tests+=("$first"$'\t'"$tenv"$'\t'"$rest")
      ;;
    esac
  done < <(sed 's/[[:space:]]#.*$//' "$set_file")
  [ ${#tests[@]} -gt 0 ] || die "$set_file lists no tests"

  declare -A exe=()
  if [ "$BUILD" = 1 ]; then
    args=()
    for t in "${tests[@]}"; do args+=(--test "${t%%$'\t'*}"); done
    mapfile -t args < <(printf '%s\n' "${args[@]}" | awk 'NR % 2 == 1 { flag = $0; next } !seen[$0]++ { print flag; print }')
    log "building ${args[*]} (cargo test --no-run)"
    json="$(cd "$repo" && cargo test -p kubelet-rs-integration "${args[@]}" --no-run --message-format=json)" ||
      die "cargo test --no-run failed"
    while IFS=$'\t' read -r n e; do exe[$n]=$e; done < <(
      grep '"reason":"compiler-artifact"' <<<"$json" |
        sed -n 's/.*"target":{"kind":\["test"\][^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1\t\2/p'
    )
  fi
  resolved=() # "label<TAB>executable<TAB>KEY=VALUE words or -<TAB>args"
  declare -A seen=()
  for t in "${tests[@]}"; do
    n=${t%%$'\t'*}
    r=${t#*$'\t'}
    tenv=${r%%$'\t'*}
    rest=${r#*$'\t'}
    e=${exe[$n]:-}
    if [ -z "$e" ]; then
      # The newest built test executable of that name (cargo names them <name>-<16 hex>).
      e="$(find "$target_dir/debug/deps" -maxdepth 1 -type f -perm -u+x -name "$n-*" \
        -printf '%T@ %p\n' 2>/dev/null | grep -E "/$n-[0-9a-f]{16}\$" | sort -rn | head -n1 | cut -d' ' -f2- || true)"
    fi
    [ -n "$e" ] && [ -x "$e" ] ||
      die "no test executable for '$n': cargo test -p kubelet-rs-integration --test $n --no-run"
    e="$(realpath "$e")"
    case "$e" in "$repo"/* | "$target_dir"/*) ;; *) die "$e is outside the shared $repo and $target_dir" ;; esac
    # A test listed again (say with another lane) gets its own label.
    seen[$n]=$((${seen[$n]:-0} + 1))
    label=$n
    [ "${seen[$n]}" -eq 1 ] || label="$n-${seen[$n]}"
    log "test $label: ${tenv:+$tenv }$e $rest"
    resolved+=("$label"$'\t'"$e"$'\t'"${tenv:--}"$'\t'"$rest")
  done
fi

# 5. The run's directories: results (shared read-write) and job (read-only).
results="$target_dir/vm/$suite/$set_name"
rm -rf "$results"
mkdir -p "$results"
work="$(mktemp -d /tmp/kubelet-rs-vm.XXXXXX)"
qpid=
cleanup() {
  if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then kill -9 "$qpid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$work/job"
target_shared=1
case "$target_dir/" in "$repo"/*) target_shared=0 ;; esac
if [ $shell -eq 0 ]; then
  install -m 0755 "$here/guest/job.sh" "$work/job/job.sh"
  cat >"$work/job/job.env" <<ENV
WORKSPACE='$repo'
TARGET_DIR='$target_dir'
TARGET_SHARED=$target_shared
SUITE='$suite'
SET='$set_name'
TEST_THREADS=$THREADS
TEST_TIMEOUT=$TEST_TIMEOUT
LANE2=$lane2
JOB_DEADLINE=$((TIMEOUT > 240 ? TIMEOUT - 90 : TIMEOUT * 2 / 3))
ENV
  printf '%s\n' "${resolved[@]}" >"$work/job/tests.list"
  printf '%s\n' "${envs[@]+"${envs[@]}"}" >"$work/job/env.list"
  cp "$work/job/tests.list" "$work/job/env.list" "$work/job/job.env" "$results/"
fi

# 6. A fresh disk: a copy-on-write overlay (or a sparse copy) of the image.
if command -v qemu-img >/dev/null && qemu-img create -q -f qcow2 -F raw -b "$image/disk.img" "$work/disk.qcow2"; then
  drive="file=$work/disk.qcow2,format=qcow2,if=virtio,cache=unsafe"
else
  cp --sparse=always "$image/disk.img" "$work/disk.img"
  drive="file=$work/disk.img,format=raw,if=virtio,cache=unsafe"
fi

qemu=(
  qemu-system-x86_64 -name "kubelet-rs-vm-$suite"
  -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$CPUS"
  -nographic -no-reboot
  -kernel "$image/vmlinuz" -initrd "$image/initrd.img"
  -append "console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 panic=-1"
  -drive "$drive"
  -virtfs "local,path=$repo,mount_tag=kws,security_model=none,readonly=on,id=kws"
  -virtfs "local,path=$work/job,mount_tag=kjob,security_model=none,readonly=on,id=kjob"
  -virtfs "local,path=$results,mount_tag=kresults,security_model=none,id=kresults"
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0
)
if [ $target_shared -eq 1 ]; then
  qemu+=(-virtfs "local,path=$target_dir,mount_tag=ktarget,security_model=none,readonly=on,id=ktarget")
fi

if [ $shell -eq 1 ]; then
  log "booting $suite ($image) with its console here; the workspace is the 9p tag kws:"
  log "  mount -t 9p -o trans=virtio,version=9p2000.L,ro kws $repo      (Ctrl-A x quits)"
  # A child (not exec) so that the overlay is removed after; stdin stays the terminal.
  "${qemu[@]}" <&0 &
  qpid=$!
  wait "$qpid" || true
  qpid=
  exit 0
fi

# 7. Boot and wait, with a deadline.
log "booting $suite: $set_name (deadline ${TIMEOUT}s; console: $results/console.log)"
t_boot=$(date +%s)
"${qemu[@]}" </dev/null >"$results/console.log" 2>&1 &
qpid=$!
rss_kb=0
t_job=
timed_out=0
while kill -0 "$qpid" 2>/dev/null; do
  hwm="$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$qpid/status" 2>/dev/null || true)"
  [ -n "$hwm" ] && [ "$hwm" -gt "$rss_kb" ] && rss_kb=$hwm
  if [ -z "$t_job" ] && [ -f "$results/guest/timings" ]; then
    t_job=$(date +%s)
    log "guest job started $((t_job - t_boot))s after qemu start"
  fi
  if [ $(($(date +%s) - t_boot)) -ge "$TIMEOUT" ]; then
    log "deadline of ${TIMEOUT}s passed: killing the guest"
    timed_out=1
    kill -9 "$qpid" 2>/dev/null || true
    break
  fi
  sleep 2
done
qrc=0
wait "$qpid" || qrc=$?
qpid=
t_end=$(date +%s)

# 8. Summary.
echo
echo "== kubelet-rs VM run: $suite / $set_name"
[ -f "$results/guest/versions.txt" ] && sed 's/^/   /' "$results/guest/versions.txt"
failed=0
for t in "${resolved[@]}"; do
  n=${t%%$'\t'*}
  rc="$(cat "$results/tests/$n.rc" 2>/dev/null || echo none)"
  echo "-- $n (exit $rc)"
  res="$(grep -h '^test result:' "$results/tests/$n.stdout" 2>/dev/null || true)"
  if [ -n "$res" ]; then sed 's/^/   /' <<<"$res"; else echo "   (no test result)"; fi
  [ "$rc" = 0 ] || failed=1
done
job_s=
[ -n "$t_job" ] && job_s=$((t_end - t_job))
{
  echo "image_seconds=$t_image"
  echo "boot_to_job_seconds=${t_job:+$((t_job - t_boot))}"
  echo "job_and_poweroff_seconds=$job_s"
  echo "vm_seconds=$((t_end - t_boot))"
  echo "total_seconds=$((t_end - t_start))"
  echo "qemu_peak_rss_mib=$((rss_kb / 1024))"
  echo "qemu_exit=$qrc"
} >"$results/host-timings.txt"
echo "-- timings: $(tr '\n' ' ' <"$results/host-timings.txt")"
if [ -f "$results/guest/timings" ]; then echo "-- guest: $(tr '\n' ' ' <"$results/guest/timings")"; fi
echo "-- results: $results"

status=0
if [ $timed_out -eq 1 ]; then
  log "FAILED: the deadline passed"
  status=1
elif [ ! -f "$results/exit-code" ]; then
  log "FAILED: the guest wrote no exit code (see $results/console.log)"
  status=1
elif [ "$(cat "$results/exit-code")" != 0 ] || [ $failed -eq 1 ]; then
  log "FAILED: tests failed in the guest"
  status=1
else
  log "passed"
fi
exit $status
