#!/usr/bin/env bash
# Builds the upstream binaries the tests run from the committed wrapper
# modules in this directory, with `go build` from the Go module proxy, and
# links each set into .tools/:
#
#   kubernetes/       kube-apiserver, kube-controller-manager, kube-scheduler,
#                     kubectl, kubelet  -> .tools/kubernetes
#   kubernetes-*/     the same for another pin (only when asked: build.sh kubernetes-oldest)
#   etcd-*/           etcd, etcdctl, etcdutl -> .tools/<dir>
#   coredns/          coredns with the plugins the real nodes' cluster DNS
#                     uses (its own main.go) -> .tools/coredns
#   csi-sidecars/     csi-provisioner, csi-resizer: the sidecars of the test
#                     CSI driver (tests/src/csi) -> .tools/csi-sidecars
#
# Binaries are cached outside the clone, keyed by the module version and the
# Go version (ETCDFLEET_CACHE, default ~/.cache/etcdfleet/upstream), so a
# second run on the same machine only checks them. Each binary must print
# the version its module pins, or the build fails here.
#
#   hack/upstream/build.sh            the default set (kubernetes, every etcd-*)
#   hack/upstream/build.sh <dir>...   only those wrapper directories
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${ETCDFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etcdfleet}/upstream
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
gover=$(go env GOVERSION)

fail() { echo "upstream: FAILED: $*" >&2; exit 1; }

# The version a wrapper pins: the require line of its main upstream module.
pinned() { # <dir> <module>
  awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$here/$1/go.mod"
}

check_version() { # <binary> <expected text> <args...>
  local bin=$1 want=$2 out
  shift 2
  out=$("$bin" "$@" 2>&1) || fail "$bin $* exited non-zero: $(echo "$out" | tail -1)"
  grep -qF -- "$want" <<<"$out" || fail "$bin $* says '$(head -1 <<<"$out")', expected $want"
  echo "upstream: ok $(basename "$bin"): $(head -1 <<<"$out")"
}

build_kubernetes() { # <dir>
  local dir=$1 version out minor ldflags pkg missing=()
  version=$(pinned "$dir" k8s.io/kubernetes)
  [ -n "$version" ] || fail "$dir/go.mod requires no k8s.io/kubernetes"
  out="$cache/kubernetes-$version-$gover"
  # Binaries are added one by one to the cached set: a cache built before
  # kubelet joined the set gets kubelet alone (about 5 more minutes, cold).
  for pkg in "${kubernetes_binaries[@]}"; do
    [ -f "$out/.complete" ] && [ -x "$out/$pkg" ] || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "upstream: building ${missing[*]} of Kubernetes $version with $gover into $out (cold: about 20 minutes on 2 cores)"
    minor=${version#v1.}; minor=${minor%%.*}
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    mkdir -p "$out"
    for pkg in "${missing[@]}"; do
      (cd "$here/$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$pkg.tmp" "k8s.io/kubernetes/cmd/$pkg") ||
        fail "go build k8s.io/kubernetes/cmd/$pkg ($dir)"
      mv "$out/$pkg.tmp" "$out/$pkg"
    done
    touch "$out/.complete"
  fi
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    check_version "$out/$b" "Kubernetes $version" --version
  done
  check_version "$out/kubectl" "Client Version: $version" version --client
  link "$out" "$dir"
}

build_etcd() { # <dir>
  local dir=$1 version out
  version=$(pinned "$dir" go.etcd.io/etcd/server/v3)
  [ -n "$version" ] || fail "$dir/go.mod requires no go.etcd.io/etcd/server/v3"
  out="$cache/etcd-$version-$gover"
  if [ ! -f "$out/.complete" ]; then
    echo "upstream: building etcd $version with $gover into $out"
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "$here/$dir" &&
      go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3 &&
      go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3 &&
      go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcdutl" go.etcd.io/etcd/etcdutl/v3) ||
      fail "go build of etcd $version ($dir)"
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
  fi
  check_version "$out/etcd" "etcd Version: ${version#v}" --version
  check_version "$out/etcdctl" "etcdctl version: ${version#v}" version
  check_version "$out/etcdutl" "etcdutl version: ${version#v}" version
  link "$out" "etcd-$version"
}

# CoreDNS from the committed wrapper (its main.go links only the plugins the
# real nodes' Corefile names), static like the other binaries.
build_coredns() { # <dir>
  local dir=$1 version out
  version=$(pinned "$dir" github.com/coredns/coredns)
  [ -n "$version" ] || fail "$dir/go.mod requires no github.com/coredns/coredns"
  # main.go's plugin list is part of the key.
  out="$cache/coredns-$version-$(sha256sum "$here/$dir/main.go" | cut -c1-12)-$gover"
  if [ ! -f "$out/.complete" ]; then
    echo "upstream: building CoreDNS $version with $gover into $out"
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "$here/$dir" && go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$version" \
      -o "$out.tmp/coredns" .) || fail "go build of CoreDNS $version ($dir)"
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
  fi
  check_version "$out/coredns" "CoreDNS-${version#v}" -version
  check_version "$out/coredns" "kubernetes" -plugins
  link "$out" coredns
}

# The CSI sidecars the test CSI driver runs with (tests/src/csi/deploy.rs),
# each with the version its release tag names.
build_csi_sidecars() { # <dir>
  local dir=$1 provisioner resizer out
  provisioner=$(pinned "$dir" github.com/kubernetes-csi/external-provisioner/v5)
  resizer=$(pinned "$dir" github.com/kubernetes-csi/external-resizer)
  [ -n "$provisioner" ] && [ -n "$resizer" ] || fail "$dir/go.mod must require both sidecars"
  out="$cache/csi-sidecars-provisioner-$provisioner-resizer-$resizer-$gover"
  if [ ! -f "$out/.complete" ]; then
    echo "upstream: building csi-provisioner $provisioner and csi-resizer $resizer with $gover into $out"
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "$here/$dir" &&
      go build -trimpath -ldflags "-s -w -X main.version=$provisioner" -o "$out.tmp/csi-provisioner" \
        github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner &&
      go build -trimpath -ldflags "-s -w -X main.version=$resizer" -o "$out.tmp/csi-resizer" \
        github.com/kubernetes-csi/external-resizer/cmd/csi-resizer) ||
      fail "go build of the CSI sidecars ($dir)"
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
  fi
  check_version "$out/csi-provisioner" "$provisioner" --version
  check_version "$out/csi-resizer" "$resizer" --version
  link "$out" csi-sidecars
}

# .tools/<name> -> the cached directory (replaced atomically).
link() { # <target> <name>
  mkdir -p "$root/.tools"
  ln -sfn "$1" "$root/.tools/$2.tmp" && mv -T "$root/.tools/$2.tmp" "$root/.tools/$2"
}

kubernetes_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
dirs=("$@")
if [ ${#dirs[@]} -eq 0 ]; then
  dirs=(kubernetes coredns csi-sidecars)
  for d in "$here"/etcd-*/; do dirs+=("$(basename "$d")"); done
fi
command -v go >/dev/null 2>&1 || fail "go is not installed (the machines come with Go 1.26)"
for d in "${dirs[@]}"; do
  [ -f "$here/$d/go.mod" ] || fail "no wrapper module $here/$d"
  case "$d" in
  kubernetes*) build_kubernetes "$d" ;;
  etcd-*) build_etcd "$d" ;;
  coredns) build_coredns "$d" ;;
  csi-sidecars) build_csi_sidecars "$d" ;;
  *) fail "unknown wrapper $d" ;;
  esac
done
