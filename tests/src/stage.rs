//! The shipped stage overlays (`config/stages/<stage>`) as `kubectl
//! kustomize` renders them: what a platform team applies, read back by the
//! tests that check the manifests and by the end-to-end run under a stage's
//! own RBAC.

use std::path::Path;

use etcdfleet_api::yaml;
use serde_json::Value;

/// The documents `kubectl kustomize dir` renders (`$KUBECTL`, default the
/// kubectl the test command builds, `.tools/kubernetes/kubectl`); `None`
/// (after printing SKIPPED, or failing under ETCDFLEET_REQUIRE_ETCD=1, which
/// CI sets for the whole tool set) when no kubectl is installed.
pub fn kustomize(dir: &Path) -> Option<Vec<Value>> {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| {
        crate::control_plane::KubeBinaries::locate()
            .kubectl()
            .display()
            .to_string()
    });
    let output = match std::process::Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            let msg = format!(
                "SKIPPED: kubectl kustomize is not available ({e}); run hack/install-tools.sh"
            );
            println!("{msg}");
            assert!(
                std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() != Ok("1"),
                "{msg}"
            );
            return None;
        }
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    Some(yaml::documents(&text).expect("kustomize prints YAML"))
}

/// The RBAC documents of a rendered overlay (Roles, ClusterRoles and their
/// bindings), as one multi-document YAML for
/// [`ApiServer::add_rbac_yaml`](crate::apiserver::ApiServer::add_rbac_yaml).
pub fn rbac_yaml(docs: &[Value]) -> String {
    docs.iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding")
            )
        })
        .map(|d| yaml::to_string(d).expect("YAML value serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The controller configuration file the overlay's generated ConfigMap
/// carries (`config.yaml`).
pub fn controller_config(docs: &[Value]) -> Option<String> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some("ConfigMap"))
        .find_map(|d| d["data"]["config.yaml"].as_str().map(str::to_string))
}
