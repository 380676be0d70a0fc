#!/usr/bin/env bash
# Builds the OCI images the real nodes pull (tests/src/real_node/), each FROM
# scratch with umoci, the way hack/build-image.sh builds the controller's:
#
#   registry.k8s.io/pause:<tag>              /pause, compiled statically with
#                                            gcc from the Kubernetes module's own
#                                            build/pause/linux/pause.c (the
#                                            sandbox image containerd starts
#                                            for every pod)
#   gcr.io/etcd-development/etcd:v<version>  /usr/local/bin/{etcd,etcdctl,etcdutl}
#                                            of each etcd build.sh built (and
#                                            the 3.5.1 binaries install-tools
#                                            unpacks): the names the controller
#                                            renders, so no pod spec is rewritten;
#                                            with the machine's CA bundle at
#                                            /etc/ssl/certs/ca-certificates.crt
#                                            and /tmp, as upstream's distroless
#                                            base has them (the restore seeder
#                                            runs in this image and its HTTP
#                                            client loads the system's CAs)
#
# Each image is one OCI layout under ~/.cache/etcdfleet/images/<key>/oci
# (key: image and version, and the compiler or the cached binaries it was
# made from), with the image's full name in <key>/name, linked as
# .tools/node-images/<image>-<tag>. A second run only checks. Nothing is
# pulled from anywhere: the tests push these layouts into a registry they run
# on loopback, which containerd uses as the mirror of every registry.
#
#   hack/upstream/node-images.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
base=${ETCDFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etcdfleet}
images="$base/images"
links="$root/.tools/node-images"
export GOTOOLCHAIN=local

fail() { echo "node-images: FAILED: $*" >&2; exit 1; }
command -v umoci >/dev/null 2>&1 || fail "umoci is missing (Debian package umoci)"
command -v gcc >/dev/null 2>&1 || fail "gcc is missing (Debian package gcc)"
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca_bundle" ] || fail "$ca_bundle is missing (Debian package ca-certificates)"
mkdir -p "$images" "$links"

# Writes an OCI layout <dir>/oci holding <name> (tag = the part after the
# last ':'), whose rootfs is the tree <rootfs>, configured by the remaining
# `umoci config` arguments; <dir> appears only once complete.
write_image() { # <dir> <name> <rootfs> <umoci config args...>
  local dir=$1 name=$2 rootfs=$3 tag bundle
  shift 3
  tag=${name##*:}
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  bundle=$(mktemp -d)
  umoci init --layout "$dir.tmp/oci"
  umoci new --image "$dir.tmp/oci:$tag"
  umoci unpack --image "$dir.tmp/oci:$tag" "$bundle/b" >/dev/null
  cp -a "$rootfs/." "$bundle/b/rootfs/"
  umoci repack --image "$dir.tmp/oci:$tag" --history.created_by "hack/upstream/node-images.sh" "$bundle/b"
  umoci config --image "$dir.tmp/oci:$tag" --os linux --architecture amd64 \
    --history.created_by "hack/upstream/node-images.sh: config" "$@"
  umoci gc --layout "$dir.tmp/oci"
  rm -rf "$bundle"
  echo "$name" >"$dir.tmp/name"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

# A cached image must hold its tag and a non-empty layer.
check_image() { # <dir>
  local dir=$1 name tag
  name=$(cat "$dir/name")
  tag=${name##*:}
  umoci stat --image "$dir/oci:$tag" >/dev/null 2>&1 || fail "$dir/oci has no image $tag"
  echo "node-images: ok $name ($(du -sb "$dir/oci/blobs" | cut -f1) bytes of blobs)"
}

link_image() { # <dir> <link name>
  ln -sfn "$1" "$links/$2.tmp" && mv -T "$links/$2.tmp" "$links/$2"
}

# The sandbox image: the pause binary of the pinned Kubernetes module at the
# tag its Makefile names, statically linked, as the upstream image runs it
# (user 65535).
build_pause() {
  local k8s_version modcache source tag key dir tmp
  k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$here/kubernetes/go.mod")
  modcache=$(cd "$here/kubernetes" && go env GOMODCACHE)
  source="$modcache/k8s.io/kubernetes@$k8s_version/build/pause"
  [ -f "$source/linux/pause.c" ] || (cd "$here/kubernetes" && go mod download k8s.io/kubernetes) ||
    fail "cannot download k8s.io/kubernetes@$k8s_version for pause.c"
  [ -f "$source/linux/pause.c" ] || fail "no $source/linux/pause.c"
  tag=$(awk '$1 == "TAG" { print $3; exit }' "$source/Makefile")
  [ -n "$tag" ] || fail "no TAG in $source/Makefile"
  key="image-pause-$tag-$(sha256sum "$source/linux/pause.c" | cut -c1-12)-gcc$(gcc -dumpversion)"
  dir="$images/$key"
  if [ ! -f "$dir/name" ]; then
    echo "node-images: building registry.k8s.io/pause:$tag from $source/linux/pause.c"
    tmp=$(mktemp -d)
    gcc -Os -Wall -Werror -static -DVERSION="v$tag-etcdfleet" -o "$tmp/pause" "$source/linux/pause.c" ||
      fail "gcc cannot compile $source/linux/pause.c statically"
    strip "$tmp/pause"
    ! readelf -l "$tmp/pause" | grep -q INTERP || fail "pause is not static"
    mkdir -p "$tmp/rootfs" && install -m 0755 "$tmp/pause" "$tmp/rootfs/pause"
    write_image "$dir" "registry.k8s.io/pause:$tag" "$tmp/rootfs" \
      --config.entrypoint /pause --config.user 65535:65535
    rm -rf "$tmp"
  fi
  check_image "$dir"
  link_image "$dir" "pause-$tag"
}

# An etcd image of the binaries in <bindir> (etcd, etcdctl, etcdutl; static):
# /usr/local/bin on PATH, as the upstream image, whose pods run `etcd`.
build_etcd_image() { # <bindir> <version without v>
  local bindir=$1 version=$2 key dir tmp b
  key="image-$(basename "$(readlink -f "$bindir")")-ca$(sha256sum "$ca_bundle" | cut -c1-8)"
  dir="$images/$key"
  if [ ! -f "$dir/name" ]; then
    echo "node-images: building gcr.io/etcd-development/etcd:v$version from $bindir"
    tmp=$(mktemp -d)
    mkdir -p "$tmp/rootfs/usr/local/bin" "$tmp/rootfs/var/etcd" "$tmp/rootfs/tmp" "$tmp/rootfs/etc/ssl/certs"
    chmod 1777 "$tmp/rootfs/tmp"
    install -m 0644 "$ca_bundle" "$tmp/rootfs/etc/ssl/certs/ca-certificates.crt"
    for b in etcd etcdctl etcdutl; do
      ! readelf -l "$bindir/$b" | grep -q INTERP || fail "$bindir/$b is not static: it cannot run FROM scratch"
      install -m 0755 "$bindir/$b" "$tmp/rootfs/usr/local/bin/$b"
    done
    write_image "$dir" "gcr.io/etcd-development/etcd:v$version" "$tmp/rootfs" \
      --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --config.cmd /usr/local/bin/etcd --config.workingdir /var/etcd \
      --config.exposedports 2379/tcp --config.exposedports 2380/tcp
    rm -rf "$tmp"
  fi
  check_image "$dir"
  link_image "$dir" "etcd-v$version"
}

build_pause
for bindir in "$root"/.tools/etcd-v*/; do
  bindir=${bindir%/}
  [ -x "$bindir/etcd" ] || continue
  version=$("$bindir/etcd" --version | sed -n 's/^etcd Version: //p')
  [ -n "$version" ] || fail "$bindir/etcd prints no version"
  build_etcd_image "$bindir" "$version"
done
