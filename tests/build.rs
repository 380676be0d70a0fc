//! Generates the gRPC services of the test CSI driver (`src/csi`) from the
//! `.proto` files of two Go modules, at the versions the repository already
//! pins, fetched with `go mod download` (Go and protoc are prerequisites of
//! the test command; `hack/install-tools.sh` checks both):
//!
//! - the CSI spec (`github.com/container-storage-interface/spec`), at the
//!   version the CSI sidecars' wrapper module resolves
//!   (`hack/upstream/csi-sidecars/go.mod`);
//! - the kubelet's plugin registration API (`k8s.io/kubelet`,
//!   `pkg/apis/pluginregistration/v1`), at the Kubernetes pin's version
//!   (`hack/upstream/kubernetes/go.mod`).
//!
//! Nothing generated is committed.

use std::path::{Path, PathBuf};
use std::process::Command;

const CSI_MODULE: &str = "github.com/container-storage-interface/spec";
const KUBELET_MODULE: &str = "k8s.io/kubelet";

fn main() {
    let upstream = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/upstream");
    let sidecars = upstream.join("csi-sidecars/go.mod");
    let kubernetes = upstream.join("kubernetes/go.mod");
    println!("cargo:rerun-if-changed={}", sidecars.display());
    println!("cargo:rerun-if-changed={}", kubernetes.display());
    let csi = module_dir(CSI_MODULE, &pinned(&sidecars, CSI_MODULE));
    let kubelet = module_dir(KUBELET_MODULE, &pinned(&kubernetes, KUBELET_MODULE));
    let registration = kubelet.join("pkg/apis/pluginregistration/v1");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_protos(
            &[csi.join("csi.proto"), registration.join("api.proto")],
            &[csi, registration],
        )
        .unwrap_or_else(|e| panic!("protoc on the CSI and plugin registration protos: {e}"));
}

/// The version `go.mod` resolves `module` to: its `replace` target when it
/// has one (the Kubernetes wrapper replaces staging modules), else its
/// `require` line.
fn pinned(go_mod: &Path, module: &str) -> String {
    let text = std::fs::read_to_string(go_mod)
        .unwrap_or_else(|e| panic!("reading {}: {e}", go_mod.display()));
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let replaced = text.lines().map(words).find_map(|w| match w.as_slice() {
        [m, arrow, target, v, ..] if m == module && arrow == "=>" && target == module => {
            Some(v.clone())
        }
        _ => None,
    });
    let required = || {
        text.lines().map(words).find_map(|w| match w.as_slice() {
            [m, v, ..] if m == module && v.starts_with('v') => Some(v.clone()),
            [r, m, v, ..] if r == "require" && m == module => Some(v.clone()),
            _ => None,
        })
    };
    replaced
        .or_else(required)
        .unwrap_or_else(|| panic!("{} names no version of {module}", go_mod.display()))
}

/// The module cache directory of `module@version` (`go mod download -json`).
fn module_dir(module: &str, version: &str) -> PathBuf {
    let out = Command::new("go")
        .args(["mod", "download", "-json", &format!("{module}@{version}")])
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .unwrap_or_else(|e| panic!("running go (a prerequisite of the test command): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go mod download {module}@{version}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"Dir\": \""))
        .and_then(|rest| rest.strip_suffix("\","))
        .unwrap_or_else(|| panic!("go mod download {module}@{version} printed no Dir: {text}"));
    PathBuf::from(dir)
}
