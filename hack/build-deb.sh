#!/usr/bin/env bash
# Builds the kubelet-rs Debian package (deploy/debian/, deploy/systemd/) and
# prints the path of the .deb.
#
#   hack/build-deb.sh [--binary PATH] [--out DIR] [--compression xz|gzip|zstd|none]
#
# Without --binary it builds `cargo build --release --locked -p kubelet-rs`;
# with it, it packages that binary (CI packages the debug binary its test
# build made). The binary is stripped into the package either way.
#
# The package is assembled with dpkg-deb, Debian's own packager, from a
# staged tree: cargo-deb is not available offline here, and dpkg-deb is what
# every Debian packaging tool ends with. The version is the workspace's
# version and the Kubernetes version the binary implements (read from its
# --version), e.g. 0.1.0+k8s1.35.0-1; the architecture is dpkg's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,10s/^# \{0,1\}//p' "$0" >&2
  exit 2
}

die() {
  echo "hack/build-deb.sh: $*" >&2
  exit 1
}

binary=
out=target/debian
compression=xz
while [ $# -gt 0 ]; do
  case "$1" in
  --binary) binary=${2:?--binary needs a path}; shift 2 ;;
  --out) out=${2:?--out needs a directory}; shift 2 ;;
  --compression) compression=${2:?--compression needs a type}; shift 2 ;;
  -h | --help) usage ;;
  *) echo "hack/build-deb.sh: unknown argument $1" >&2; usage ;;
  esac
done

for tool in dpkg-deb dpkg-shlibdeps strip; do
  command -v "$tool" >/dev/null || die "$tool is needed (apt-get install dpkg-dev binutils)"
done

if [ -z "$binary" ]; then
  cargo build --release --locked -p kubelet-rs >&2
  binary=target/release/kubelet-rs
fi
[ -x "$binary" ] || die "no executable at $binary"

# The workspace version ([workspace.package] in Cargo.toml).
crate_version=$(awk '
  /^\[/ { in_ws = ($0 == "[workspace.package]") }
  in_ws && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)
[ -n "$crate_version" ] || die "no version in Cargo.toml [workspace.package]"

# "Kubernetes v1.35.0+kubelet-rs.0.1.0": the Kubernetes version, and a check
# that the binary is this workspace's version (not a stale build).
version_line=$("$binary" --version) || die "$binary --version failed"
if [[ ! "$version_line" =~ ^Kubernetes\ v([0-9]+\.[0-9]+\.[0-9]+)\+kubelet-rs\.(.+)$ ]]; then
  die "unexpected '$binary --version' output: $version_line"
fi
k8s_version=${BASH_REMATCH[1]}
[ "${BASH_REMATCH[2]}" = "$crate_version" ] ||
  die "$binary is kubelet-rs ${BASH_REMATCH[2]}, the workspace is $crate_version: rebuild it"

# A cargo pre-release (0.2.0-rc.1) sorts before its release in Debian as 0.2.0~rc.1.
deb_version="${crate_version//-/\~}+k8s${k8s_version}-1"
arch=$(dpkg --print-architecture)

stage=$(mktemp -d /tmp/kubelet-rs-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root"

# --- files
install -D -m 0755 "$binary" "$root/usr/bin/kubelet-rs"
strip --strip-unneeded "$root/usr/bin/kubelet-rs"
# Units where upstream's packages (pkgs.k8s.io) have theirs; see
# deploy/debian/diversions for how theirs are set aside.
install -D -m 0644 deploy/systemd/kubelet.service \
  "$root/usr/lib/systemd/system/kubelet.service"
install -D -m 0644 deploy/systemd/kubelet.service.d/10-kubeadm.conf \
  "$root/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"
# The content postinst copies to /etc/default/kubelet (not a conffile: see postinst).
install -D -m 0644 deploy/debian/default-kubelet "$root/usr/share/kubelet-rs/default-kubelet"
install -D -m 0644 deploy/debian/copyright "$root/usr/share/doc/kubelet-rs/copyright"
# The kubelet's directories, as upstream's package has them. dpkg shares
# directories between packages and leaves them when they hold data.
install -d -m 0755 "$root/var/lib/kubelet" "$root/etc/kubernetes/manifests"

# --- control
# dpkg-shlibdeps reads debian/control from its working directory.
mkdir -p "$stage/src/debian"
printf 'Source: kubelet-rs\n\nPackage: kubelet-rs\nArchitecture: any\n' >"$stage/src/debian/control"
shlibs=$(cd "$stage/src" && dpkg-shlibdeps -O "$root/usr/bin/kubelet-rs" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no library dependencies for $binary"

# "path diverted-path" pairs without the comments, for preinst and postrm.
diversions=$(grep -Ev '^[[:space:]]*(#|$)' deploy/debian/diversions)

render() { # template -> stdout, @KEY@ replaced from the exported values
  awk '{
    for (k in ENVIRON) if (k ~ /^DEB_T_/) gsub("@" substr(k, 7) "@", ENVIRON[k])
    print
  }' "$1"
}
export DEB_T_VERSION=$deb_version DEB_T_ARCH=$arch DEB_T_K8S_VERSION=$k8s_version
export DEB_T_SHLIBS_DEPENDS=$shlibs DEB_T_DIVERSIONS=$diversions
export DEB_T_MAINTAINER="${DEBFULLNAME:-kubelet-rs developers} <${DEBEMAIL:-root@localhost}>"
DEB_T_INSTALLED_SIZE=$(du -sk --apparent-size "$root" | cut -f1)
export DEB_T_INSTALLED_SIZE

mkdir -p "$root/DEBIAN"
render deploy/debian/control.in >"$root/DEBIAN/control"
for script in preinst postinst prerm postrm; do
  render "deploy/debian/$script" >"$root/DEBIAN/$script"
  chmod 0755 "$root/DEBIAN/$script"
done
install -m 0644 deploy/debian/triggers "$root/DEBIAN/triggers"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
  LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
if grep -rl '@[A-Z_]*@' "$root/DEBIAN" >/dev/null; then
  die "unreplaced placeholder in $(grep -rl '@[A-Z_]*@' "$root/DEBIAN" | tr '\n' ' ')"
fi

# --- package
mkdir -p "$out"
deb="$out/kubelet-rs_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compression" --build "$root" "$deb" >&2
echo "$deb"
