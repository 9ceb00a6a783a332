#!/usr/bin/env bash
# mmdebstrap customize hook of hack/vm/image.sh: turns the freshly
# bootstrapped root filesystem into the test guest.
#
#   customize.sh <rootfs> <suite> <pause-tag> <cni-conflist>
#
# Guest layout: hostname kubelet-rs-vm; systemd-networkd DHCP on the qemu
# user network (the host is 10.0.2.2); the 9p shares "kjob" (read-only, the
# run's job) at /mnt/job and "kresults" (read-write) at /mnt/results; the
# workspace share is mounted by the job itself at the host's own path.
# containerd uses the systemd cgroup driver, the project's pause image, the
# CNI bridge of deploy/cni and pulls localhost:5000 / localhost:5001 from
# the host's registries (http://10.0.2.2:5000 / :5001) through
# /etc/containerd/certs.d. kubelet-rs-vm-job.service runs /mnt/job/job.sh at
# boot and powers the guest off when it ends.
set -euo pipefail

root=$1 suite=$2 pause_tag=$3 cni_conf=$4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { printf 'vm-customize: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
in_root() { chroot "$root" "$@"; }

# Host name and /etc/hosts (containerd copies /etc/hosts into sandboxes).
echo kubelet-rs-vm >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
127.0.1.1	kubelet-rs-vm
::1	localhost ip6-localhost ip6-loopback
HOSTS
# slirp's resolver; sandboxes copy the node's resolv.conf.
rm -f "$root/etc/resolv.conf"
echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"

# File systems: the root disk and the two 9p shares of every run.
mkdir -p "$root/mnt/job" "$root/mnt/results"
opts9p=trans=virtio,version=9p2000.L,msize=262144
cat >"$root/etc/fstab" <<FSTAB
/dev/vda	/	ext4	rw,relatime	0 1
kjob	/mnt/job	9p	$opts9p,ro,nofail	0 0
kresults	/mnt/results	9p	$opts9p,rw,nofail	0 0
FSTAB
printf '9p\n9pnet\n9pnet_virtio\n' >"$root/etc/modules-load.d/9p.conf"

# Network: DHCP from qemu's user network (trixie and sid ship networkd in the
# systemd package; installed separately should a suite split it out).
if [ ! -x "$root/usr/lib/systemd/systemd-networkd" ] && [ ! -x "$root/lib/systemd/systemd-networkd" ]; then
  log "installing systemd-networkd (not part of the systemd package in $suite)"
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd-networkd >&2
fi
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' >"$root/etc/systemd/network/50-dhcp.network"
in_root systemctl enable systemd-networkd.service systemd-networkd-wait-online.service >&2

# Console: root logs in on ttyS0 without a password (hack/vm/run.sh --shell).
in_root passwd -d root >/dev/null
mkdir -p "$root/etc/systemd/system/serial-getty@ttyS0.service.d"
cat >"$root/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'GETTY'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
GETTY
# No periodic jobs during a test run.
for t in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer dpkg-db-backup.timer; do
  in_root systemctl mask "$t" >/dev/null 2>&1 || true
done

# CNI: the project's bridge network; Debian's plugins live in /usr/lib/cni.
mkdir -p "$root/etc/cni/net.d"
install -m 0644 "$cni_conf" "$root/etc/cni/net.d/"
[ -x "$root/usr/lib/cni/bridge" ] || die "containernetworking-plugins: no /usr/lib/cni/bridge"

# containerd: its own default config (version 2 for 1.7, version 3 for 2.x)
# with the settings of deploy/containerd/kubelet-rs.toml, the systemd cgroup
# driver and registry hosts from /etc/containerd/certs.d.
mkdir -p "$root/etc/containerd"
in_root containerd config default >"$root/etc/containerd/config.toml.default"
sed -E \
  -e 's/(SystemdCgroup = )false/\1true/' \
  -e 's/(restrict_oom_score_adj = )false/\1true/' \
  -e "s#^( *sandbox_image = ).*#\\1\"localhost:5000/pause:$pause_tag\"#" \
  -e "s#^( *sandbox = ).*#\\1'localhost:5000/pause:$pause_tag'#" \
  -e "s#^( *config_path = ).*#\\1'/etc/containerd/certs.d'#" \
  -e 's#/opt/cni/bin#/usr/lib/cni#g' \
  "$root/etc/containerd/config.toml.default" >"$root/etc/containerd/config.toml"
rm "$root/etc/containerd/config.toml.default"
for reg in 5000 5001; do
  mkdir -p "$root/etc/containerd/certs.d/localhost:$reg"
  cat >"$root/etc/containerd/certs.d/localhost:$reg/hosts.toml" <<TOML
# localhost:$reg in the guest is the host's loopback registry (qemu user network).
server = "http://10.0.2.2:$reg"

[host."http://10.0.2.2:$reg"]
  capabilities = ["pull", "resolve"]
TOML
done
dump="$(in_root containerd --config /etc/containerd/config.toml config dump)" ||
  die "containerd cannot read the config it was given"
for want in "SystemdCgroup = true" "localhost:5000/pause:$pause_tag" "/usr/lib/cni" \
  "/etc/containerd/certs.d" "restrict_oom_score_adj = true"; do
  grep -qF "$want" <<<"$dump" || die "containerd config: '$want' not in effect (config dump)"
done
in_root systemctl enable containerd.service >&2

# The batch job unit.
install -m 0644 "$here/kubelet-rs-vm-job.service" "$root/etc/systemd/system/"
in_root systemctl enable kubelet-rs-vm-job.service >&2

# What went into the image, for the record.
mkdir -p "$root/usr/share/kubelet-rs-vm"
in_root dpkg-query -W -f '${Package} ${Version}\n' >"$root/usr/share/kubelet-rs-vm/packages.txt"
echo "$suite" >"$root/usr/share/kubelet-rs-vm/suite"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
