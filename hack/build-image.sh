#!/usr/bin/env bash
# Builds the controller image (`make image`): the etcdfleet binary, linked
# statically, alone in an OCI image FROM scratch. No base image is pulled and
# no container engine is needed:
#
#   1. cargo builds `etcdfleet` for x86_64-unknown-linux-gnu with
#      `-C target-feature=+crt-static` (glibc's libc.a from libc6-dev; the
#      machines have no musl target). glibc 2.34+ has the `files` and `dns`
#      name services built in, so the static binary resolves names from
#      /etc/hosts and /etc/resolv.conf without any shared library
#      (tests/tests/image.rs proves it in an empty root).
#   2. umoci (Debian package) writes an OCI image layout: an empty image,
#      one layer holding /etcdfleet and /etc/ssl/certs/ca-certificates.crt,
#      the config (entrypoint, user 65532, version labels), tagged
#      v<workspace version>.
#   3. The binary must be static (no PT_INTERP) or the build fails here.
#
# The CA bundle is the Mozilla set of Debian's ca-certificates package
# (/usr/share/ca-certificates/mozilla, concatenated in name order, as
# update-ca-certificates writes it), never the build machine's own
# /etc/ssl/certs, which may hold CAs added locally. It sits where
# rustls-platform-verifier (through openssl-probe) looks first on Linux, so
# the S3 client verifies HTTPS endpoints with no SSL_CERT_FILE; a platform
# that must trust a private CA mounts its own bundle over that path or sets
# SSL_CERT_FILE in the Deployment. The package's version is a label
# (dev.etcdfleet.ca-certificates.version).
#
# Output: target/image/oci (the OCI layout, tag v<version>), readable by
# `skopeo inspect oci:target/image/oci:v<version>` or `umoci stat`;
# target/image/etcdfleet (the binary that went into the layer); and
# target/image/unpacked (the image unpacked again by umoci: rootfs/ holds
# what a container of it sees).
#
#   hack/build-image.sh [--source DIR] [--out DIR] [--tag TAG]
#     --source: the tree to build (default: this repository); the previous
#               release's image is built from a worktree of its commit.
#     --out:    where the layout and binary go (default: <source>/target/image)
#     --tag:    the image tag (default: v<workspace version of the source>)
# CARGO_TARGET_DIR is honoured (the static build has its own triple dir).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/.." && pwd)
out=""
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
  --source) source_dir=$(cd "$2" && pwd); shift 2 ;;
  --out) out=$2; shift 2 ;;
  --tag) tag=$2; shift 2 ;;
  *) echo "usage: $0 [--source DIR] [--out DIR] [--tag TAG]" >&2; exit 2 ;;
  esac
done
fail() { echo "image: FAILED: $*" >&2; exit 1; }

command -v umoci >/dev/null 2>&1 || fail "umoci is missing (Debian package umoci; hack/install-tools.sh installs it)"
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || fail "glibc's static libc.a is missing (Debian package libc6-dev)"
ca_dir=/usr/share/ca-certificates/mozilla
ls "$ca_dir"/*.crt >/dev/null 2>&1 || fail "$ca_dir holds no certificate (Debian package ca-certificates)"
ca_version=$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null) || fail "the ca-certificates package is not installed"

version=$(awk '/^\[workspace.package\]/ {p=1; next} /^\[/ {p=0} p && $1 == "version" {gsub(/"/, "", $3); print $3; exit}' "$source_dir/Cargo.toml")
[ -n "$version" ] || fail "no [workspace.package] version in $source_dir/Cargo.toml"
tag=${tag:-v$version}
out=${out:-$source_dir/target/image}
revision=$(git -C "$source_dir" rev-parse HEAD 2>/dev/null || echo unknown)
# A tree with uncommitted changes is not the commit it names.
[ -z "$(git -C "$source_dir" status --porcelain --untracked-files=no 2>/dev/null)" ] || revision="$revision-dirty"
target=x86_64-unknown-linux-gnu
target_dir=${CARGO_TARGET_DIR:-$source_dir/target}

echo "image: building a static etcdfleet $version ($revision)"
# --target makes RUSTFLAGS apply to the binary only, not to build scripts
# and proc macros (which must stay dynamic).
(cd "$source_dir" && RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --locked --release --target "$target" -p etcdfleet-controllers --bin etcdfleet) ||
  fail "cargo build of the static binary"
binary="$target_dir/$target/release/etcdfleet"
if readelf -l "$binary" | grep -q 'INTERP'; then
  fail "$binary asks for a dynamic loader: it is not static"
fi

mkdir -p "$out"
install -m 0755 "$binary" "$out/etcdfleet.tmp"
strip "$out/etcdfleet.tmp"
mv "$out/etcdfleet.tmp" "$out/etcdfleet"

layout="$out/oci"
bundle=$(mktemp -d)
trap 'rm -rf "$bundle"' EXIT
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$bundle/b" >/dev/null
install -m 0755 "$out/etcdfleet" "$bundle/b/rootfs/etcdfleet"
mkdir -p "$bundle/b/rootfs/etc/ssl/certs"
(LC_ALL=C; for crt in "$ca_dir"/*.crt; do sed -e '$a\' "$crt"; done) >"$bundle/b/rootfs/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$bundle/b/rootfs/etc/ssl/certs/ca-certificates.crt"
umoci repack --image "$layout:$tag" \
  --history.created_by "hack/build-image.sh: /etcdfleet, /etc/ssl/certs/ca-certificates.crt (ca-certificates $ca_version)" "$bundle/b"
umoci config --image "$layout:$tag" \
  --os linux --architecture amd64 \
  --config.entrypoint /etcdfleet --config.cmd run \
  --config.user 65532:65532 --config.workingdir / \
  --config.label "org.opencontainers.image.title=etcdfleet controller" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "dev.etcdfleet.ca-certificates.version=$ca_version" \
  --history.created_by "hack/build-image.sh: entrypoint /etcdfleet"
umoci gc --layout "$layout"
# The test world runs the seeder from the image's own bits: unpacked here
# from the layout (tests/src/image.rs, ImageTable::with_seeder).
rm -rf "$out/unpacked"
umoci unpack --image "$layout:$tag" "$out/unpacked" >/dev/null
size=$(du -sb "$layout/blobs" | cut -f1)
echo "image: etcdfleet/controller:$tag in $layout ($size bytes of blobs; binary $(stat -c %s "$out/etcdfleet") bytes)"
