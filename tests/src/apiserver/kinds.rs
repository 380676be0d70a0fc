//! The kinds a test API server serves: the built-ins the project uses and
//! every CRD of the shipped `config/crd/` directory.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// Where a scale subresource reads and writes replicas.
#[derive(Debug, Clone)]
pub struct ScalePaths {
    /// JSON pointer, e.g. `/spec/replicas`.
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// One served resource.
#[derive(Debug, Clone)]
pub struct Kind {
    pub group: String,
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
    pub status: bool,
    pub scale: Option<ScalePaths>,
    /// The CustomResourceDefinition this kind comes from.
    pub crd: Option<Value>,
    /// Its validation, prepared once (the schemas, the CEL rules compiled):
    /// the store serves one request at a time, and redoing both per write
    /// held it long enough for other clients' requests to time out.
    pub validator: Option<std::sync::Arc<etcdfleet_api::validation::PreparedCrd>>,
}

impl Kind {
    /// Whether a request for `group`/`version`/`resource` reaches this
    /// kind: its own version, or another version its CRD serves.
    pub fn serves(&self, group: &str, version: &str, resource: &str) -> bool {
        if self.group != group || self.resource != resource {
            return false;
        }
        self.version == version
            || self.crd.as_ref().is_some_and(|crd| {
                crd["spec"]["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v["name"] == version && v["served"].as_bool().unwrap_or(true))
            })
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `statefulsets.apps`, `secrets`: how the API server names a resource in messages.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// `StatefulSet.apps`, `Secret`: how the API server names a kind in 422s.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    fn builtin(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool) -> Kind {
        Kind {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            kind: kind.into(),
            namespaced,
            status: false,
            scale: None,
            crd: None,
            validator: None,
        }
    }

    fn with_status(mut self) -> Kind {
        self.status = true;
        self
    }
}

/// `.spec.replicas` → `/spec/replicas`.
fn json_path_to_pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |acc, seg| format!("{acc}/{seg}"))
}

/// The built-in kinds the controller, the workload runtime and the tests use.
pub fn builtins() -> Vec<Kind> {
    let mut statefulsets =
        Kind::builtin("apps", "v1", "statefulsets", "StatefulSet", true).with_status();
    statefulsets.scale = Some(ScalePaths {
        spec_replicas: "/spec/replicas".into(),
        status_replicas: "/status/replicas".into(),
        label_selector: None,
    });
    vec![
        Kind::builtin("", "v1", "namespaces", "Namespace", false).with_status(),
        Kind::builtin("", "v1", "secrets", "Secret", true),
        Kind::builtin("", "v1", "configmaps", "ConfigMap", true),
        Kind::builtin("", "v1", "services", "Service", true).with_status(),
        Kind::builtin("", "v1", "pods", "Pod", true).with_status(),
        Kind::builtin(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
        )
        .with_status(),
        Kind::builtin("", "v1", "events", "Event", true),
        Kind::builtin("", "v1", "nodes", "Node", false).with_status(),
        Kind::builtin("", "v1", "persistentvolumes", "PersistentVolume", false).with_status(),
        Kind::builtin(
            "storage.k8s.io",
            "v1",
            "storageclasses",
            "StorageClass",
            false,
        ),
        statefulsets,
        Kind::builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
        )
        .with_status(),
        Kind::builtin("coordination.k8s.io", "v1", "leases", "Lease", true),
        Kind::builtin("events.k8s.io", "v1", "events", "Event", true),
    ]
}

/// The kind of a CustomResourceDefinition's storage version. Its other
/// served versions (same schema, no conversion webhook) reach the same
/// objects ([`Kind::serves`]); objects are answered at the storage version
/// (a real API server would convert them to the version asked for: the
/// real tier tests that).
pub fn from_crd(crd: &Value) -> Vec<Kind> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    let kind = spec["names"]["kind"].as_str().unwrap_or_default();
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let validator = serde_json::from_value(crd.clone())
        .ok()
        .map(|parsed| std::sync::Arc::new(etcdfleet_api::validation::PreparedCrd::new(parsed)));
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool().unwrap_or(true) && v["storage"].as_bool().unwrap_or(true))
        .map(|v| {
            let sub = &v["subresources"];
            Kind {
                group: group.into(),
                version: v["name"].as_str().unwrap_or_default().into(),
                resource: plural.into(),
                kind: kind.into(),
                namespaced,
                status: sub.get("status").is_some(),
                scale: sub.get("scale").map(|s| ScalePaths {
                    spec_replicas: json_path_to_pointer(
                        s["specReplicasPath"].as_str().unwrap_or(".spec.replicas"),
                    ),
                    status_replicas: json_path_to_pointer(
                        s["statusReplicasPath"]
                            .as_str()
                            .unwrap_or(".status.replicas"),
                    ),
                    label_selector: s["labelSelectorPath"].as_str().map(json_path_to_pointer),
                }),
                crd: Some(crd.clone()),
                validator: validator.clone(),
            }
        })
        .collect()
}

/// Every CustomResourceDefinition in the YAML files of `dir` (other
/// documents, such as a kustomization, are skipped).
pub fn load_crds(dir: &Path) -> Result<Vec<Value>> {
    Ok(yaml_documents(dir)?
        .into_iter()
        .filter(|doc| doc["kind"] == "CustomResourceDefinition")
        .collect())
}

/// The repository's `config/` directory (the shipped manifests).
pub fn config_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config")
}

/// Every YAML document of every file in `dir`, in file order.
pub fn yaml_documents(dir: &Path) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        docs.extend(
            etcdfleet_api::yaml::documents(&text)
                .with_context(|| format!("parsing {}", path.display()))?,
        );
    }
    Ok(docs)
}
