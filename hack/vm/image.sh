#!/usr/bin/env bash
# Builds (or reuses) the Debian guest image for hack/vm/run.sh: a minimal
# Debian <suite> (trixie or sid) root filesystem made with mmdebstrap from
# Debian's own packages (systemd as PID 1 on cgroup v2, containerd with the
# systemd cgroup driver, runc, CNI plugins), as an ext4 disk image plus the
# suite's kernel and initrd.
#
#   hack/vm/image.sh <trixie|sid>      # prints the cache directory on stdout
#
# The output (disk.img, vmlinuz, initrd.img, packages.txt) lives in
# ${KUBELET_RS_VM_CACHE:-/var/cache/kubelet-rs/vm}/<suite>-<hash>/, where the
# hash covers the suite, the package list, this script, the guest files it
# installs (hack/vm/guest/), the CNI config and pause tag taken from deploy/,
# and the Date of the mirror's InRelease file. An existing entry is reused; a
# new one replaces the suite's older entries. When the mirror cannot be
# asked, the newest existing entry of the suite is reused.
# The disk image is never booted directly: run.sh boots a throw-away overlay.
# The mirror may be a frozen snapshot whose Release files have expired
# (Valid-Until): apt is told not to check that; signatures are still checked.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
MIRROR=http://deb.debian.org/debian
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
DISK_SIZE=8G
PACKAGES=(
  systemd systemd-sysv dbus udev kmod
  containerd runc containernetworking-plugins iptables iproute2
  linux-image-amd64 busybox-static procps ca-certificates
  util-linux mount e2fsprogs strace
)

log() { printf 'vm-image: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

suite=${1:-}
case "$suite" in
trixie | sid) ;;
*) die "usage: $0 <trixie|sid>" ;;
esac
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap builds the root filesystem as root)"
for tool in mmdebstrap mkfs.ext4 curl sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing (hack/vm/run.sh installs the host prerequisites)"
done

pause_tag="$(sed -n 's/^PAUSE_TAG=\([^ ]*\)$/\1/p' "$repo/deploy/setup-runtime.sh")"
[ -n "$pause_tag" ] || die "could not read PAUSE_TAG from deploy/setup-runtime.sh"
cni_conf="$repo/deploy/cni/10-kubelet-rs-bridge.conflist"
[ -f "$cni_conf" ] || die "$cni_conf is missing"

cache_root="${KUBELET_RS_VM_CACHE:-/var/cache/kubelet-rs/vm}"
mkdir -p "$cache_root"

# The mirror's snapshot date: a new one means new packages, so a new image.
mirror_date="$(curl -fsS --max-time 20 "$MIRROR/dists/$suite/InRelease" 2>/dev/null |
  sed -n 's/^Date: //p' | head -n1 || true)"

newest_entry() {
  ls -1dt "$cache_root/$suite"-*/ 2>/dev/null | while read -r d; do
    [ -f "$d/complete" ] && { echo "${d%/}"; break; }
  done
}

if [ -z "$mirror_date" ]; then
  entry="$(newest_entry)"
  [ -n "$entry" ] || die "cannot read $MIRROR/dists/$suite/InRelease and no cached $suite image exists"
  log "mirror not answering; reusing the newest cached image $entry"
  echo "$entry"
  exit 0
fi

hash="$(
  {
    echo "suite=$suite mirror=$MIRROR date=$mirror_date pause=$pause_tag size=$DISK_SIZE"
    echo "packages=${PACKAGES[*]}"
    cat "$here/image.sh" "$cni_conf"
    for f in "$here"/guest/*; do
      # job.sh is read from the job share at each run, not baked in.
      [ "$(basename "$f")" = job.sh ] || { echo "== $(basename "$f")"; cat "$f"; }
    done
  } | sha256sum | cut -c1-12
)"
out="$cache_root/$suite-$hash"
if [ -f "$out/complete" ]; then
  log "reusing $out (mirror $suite of $mirror_date)"
  echo "$out"
  exit 0
fi

# Only one build per cache at a time (two runs of run.sh may start together).
exec 9>"$cache_root/.build-$suite.lock"
flock -w 1800 9 || die "another image build of $suite held the lock for 30 minutes"
if [ -f "$out/complete" ]; then
  log "reusing $out (built meanwhile)"
  echo "$out"
  exit 0
fi

log "building the $suite image into $out (mirror of $mirror_date)"
start=$(date +%s)
rm -rf "$out"
mkdir -p "$out"
rootfs="$out/rootfs"
trap 'rm -rf "$rootfs"' EXIT

nice -n 10 mmdebstrap --variant=minbase --mode=root --format=directory \
  --keyring="$KEYRING" \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --include="$(IFS=,; echo "${PACKAGES[*]}")" \
  --customize-hook="\"$here/guest/customize.sh\" \"\$1\" \"$suite\" \"$pause_tag\" \"$cni_conf\"" \
  "$suite" "$rootfs" "deb $MIRROR $suite main" >&2 ||
  die "mmdebstrap failed for $suite"

kernel="$(ls -1 "$rootfs"/boot/vmlinuz-* | sort -V | tail -n1)"
initrd="$(ls -1 "$rootfs"/boot/initrd.img-* | sort -V | tail -n1)"
[ -f "$kernel" ] && [ -f "$initrd" ] || die "no kernel or initrd in $rootfs/boot"
cp "$kernel" "$out/vmlinuz"
cp "$initrd" "$out/initrd.img"
cp "$rootfs/usr/share/kubelet-rs-vm/packages.txt" "$out/packages.txt"

# An ext4 filesystem made from the directory; sparse: only the used blocks
# take disk space. The directory goes right after (disk space is scarce).
mkfs.ext4 -q -F -L root -E root_owner=0:0 -d "$rootfs" "$out/disk.img" "$DISK_SIZE" >&2
rm -rf "$rootfs"
trap - EXIT

{
  echo "suite=$suite"
  echo "mirror=$MIRROR"
  echo "mirror_date=$mirror_date"
  echo "kernel=$(basename "$kernel")"
  echo "built=$(date -u +%FT%TZ)"
  echo "build_seconds=$(($(date +%s) - start))"
} >"$out/complete"

# Older entries of this suite are of no use any more.
for old in "$cache_root/$suite"-*/; do
  old="${old%/}"
  [ "$old" = "$out" ] || { log "removing old image $old"; rm -rf "$old"; }
done
log "built $out in $(($(date +%s) - start))s ($(du -sh --apparent-size "$out/disk.img" | cut -f1) apparent, $(du -sh "$out/disk.img" | cut -f1) used)"
echo "$out"
