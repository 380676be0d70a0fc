#!/usr/bin/env bash
# Checks the install step from scratch, as on a fresh machine:
#   1. removes what `make test` installs (the Debian packages and .tools/);
#   2. clones the committed HEAD into a temporary directory;
#   3. runs `bash .ci/run` there with an empty cargo target directory.
# It changes the machine (packages are removed, then reinstalled by the run):
# do not run it while other test runs on this machine need etcd.
#
# With --cold, the run also starts without the upstream binaries cached
# outside the clone (ETCDFLEET_CACHE) and without Go's build and module
# caches, as on a machine that never built them: the cold figure.
#
#   ./hack/fresh-machine-check.sh            # uninstall, clone, run CI (upstream cache kept)
#   ./hack/fresh-machine-check.sh --cold     # the same, with empty upstream and Go caches
#   ./hack/fresh-machine-check.sh --uninstall-only
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# Everything hack/install-tools.sh installs (Debian part; PyPI part below),
# and kubernetes-client, which earlier releases of it installed. util-linux
# and iproute2 are part of a minimal Debian system and stay; so do gcc,
# iptables, ca-certificates and containernetworking-plugins (install-tools.sh
# installs them when missing, but other software on the machine uses them).
packages=(protobuf-compiler libprotobuf-dev etcd-server etcd-client kubernetes-client umoci skopeo prometheus
  containerd runc docker-registry)

echo "fresh-machine: removing ${packages[*]} and $root/.tools"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get purge -y -qq "${packages[@]}" >/dev/null 2>&1 || true
"${sudo_cmd[@]}" apt-get autoremove -y -qq >/dev/null 2>&1 || true
rm -rf "$root/.tools"
# moto lives in .tools/moto-venv (removed above); earlier releases of the
# install step put it into the machine's Python: remove that too.
python3 -m pip uninstall -y -q moto flask boto3 botocore >/dev/null 2>&1 || true
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "fresh-machine: $p is still installed" >&2
    exit 1
  fi
done
if command -v protoc >/dev/null 2>&1 || command -v moto_server >/dev/null 2>&1 || [ -e /usr/include/google/protobuf/descriptor.proto ] || [ -e /usr/bin/etcd ]; then
  echo "fresh-machine: protoc, the protobuf includes, etcd or moto_server are still present" >&2
  exit 1
fi
[ "${1:-}" = "--uninstall-only" ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/etcdfleet"
cd "$work/etcdfleet"
echo "fresh-machine: running .ci/run in $work/etcdfleet (HEAD $(git rev-parse --short HEAD)) with an empty target dir"
start=$(date +%s)
cold_env=()
if [ "${1:-}" = "--cold" ]; then
  mkdir -p "$work/cache" "$work/go-build" "$work/go-mod"
  cold_env=(ETCDFLEET_CACHE="$work/cache" GOCACHE="$work/go-build" GOMODCACHE="$work/go-mod")
  echo "fresh-machine: cold: empty upstream, Go build and Go module caches under $work"
fi
env "${cold_env[@]}" CARGO_TARGET_DIR="$work/target" CI=true bash .ci/run </dev/null
# Go marks its module cache read-only; let the trap remove it.
chmod -R u+w "$work" 2>/dev/null || true
echo "fresh-machine: .ci/run passed in $(($(date +%s) - start)) s"
