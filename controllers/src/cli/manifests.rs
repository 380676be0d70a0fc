//! How `render` and `plan` read manifests: multi-document YAML (and the
//! `List`s `kubectl get -o yaml` prints) into the project's objects, each
//! checked as the API server would check it, and the template chain of a
//! cluster as the controller would fetch it.

use std::fmt;

use etcdfleet_api::template::ResolveError;
use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdBackup, EtcdBackupSchedule, EtcdCluster, EtcdFleetRollout,
    EtcdTemplate, TemplateKind,
};
use kube::ResourceExt;

use super::validate::validate_offline;

/// The objects found in a set of manifests.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub clusters: Vec<EtcdCluster>,
    pub templates: Vec<EtcdTemplate>,
    pub cluster_templates: Vec<ClusterEtcdTemplate>,
    pub rollouts: Vec<EtcdFleetRollout>,
    /// Backup schedules and backups (`plan` says when each schedule's next
    /// restore drill runs).
    pub schedules: Vec<EtcdBackupSchedule>,
    pub backups: Vec<EtcdBackup>,
    /// `kind name` of documents of other kinds, which are skipped.
    pub ignored: Vec<String>,
    /// Objects of the project's kinds that the API server would refuse; the
    /// others are still read, so one bad cluster hides nothing.
    pub invalid: Vec<InvalidObject>,
}

/// An object that fails the validation of its CRD (schema and CEL rules),
/// or holds fields its schema does not declare (a misspelling offline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidObject {
    pub source_name: String,
    pub index: usize,
    /// `EtcdCluster "shop"`.
    pub object: String,
    /// One line per field: `spec.replicas: Invalid value: ...`.
    pub errors: Vec<String>,
}

impl fmt::Display for InvalidObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: document {}: {} is invalid: {}",
            self.source_name,
            self.index,
            self.object,
            self.errors.join("; ")
        )
    }
}

impl Manifests {
    /// Parses a multi-document YAML stream; `List` documents (what
    /// `kubectl get -o yaml` prints) are unpacked. `source_name` names the
    /// stream in errors.
    pub fn parse(yaml: &str, source_name: &str) -> Result<Self, CliError> {
        let mut out = Manifests::default();
        out.add(yaml, source_name)?;
        Ok(out)
    }

    /// Adds the documents of another stream.
    pub fn add(&mut self, yaml: &str, source_name: &str) -> Result<(), CliError> {
        let documents = etcdfleet_api::yaml::documents(yaml).map_err(|e| CliError::Yaml {
            source_name: source_name.to_string(),
            error: e,
        })?;
        for (i, value) in documents.into_iter().enumerate() {
            let index = i + 1;
            self.add_value(value, source_name, index)
                .map_err(|message| CliError::Document {
                    source_name: source_name.to_string(),
                    index,
                    message,
                })?;
        }
        Ok(())
    }

    fn add_value(
        &mut self,
        value: serde_json::Value,
        source_name: &str,
        index: usize,
    ) -> Result<(), String> {
        if value.is_null() {
            return Ok(());
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or("no kind")?
            .to_string();
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        let typed = |e: serde_json::Error| format!("{kind} {name:?}: {e}");
        match kind.as_str() {
            "List"
            | "EtcdClusterList"
            | "EtcdTemplateList"
            | "ClusterEtcdTemplateList"
            | "EtcdFleetRolloutList"
            | "EtcdBackupScheduleList"
            | "EtcdBackupList" => {
                let items = value
                    .get("items")
                    .and_then(|i| i.as_array())
                    .cloned()
                    .unwrap_or_default();
                for item in items {
                    self.add_value(item, source_name, index)?;
                }
            }
            "EtcdCluster"
            | "EtcdTemplate"
            | "ClusterEtcdTemplate"
            | "EtcdFleetRollout"
            | "EtcdBackupSchedule"
            | "EtcdBackup" => {
                let invalid = |errors: Vec<String>| InvalidObject {
                    source_name: source_name.to_string(),
                    index,
                    object: format!("{kind} {name:?}"),
                    errors,
                };
                let json = value;
                if let Err(errors) = validate_offline(&kind, &json) {
                    self.invalid.push(invalid(errors));
                    return Ok(());
                }
                let added = match kind.as_str() {
                    "EtcdCluster" => serde_json::from_value(json).map(|c| self.clusters.push(c)),
                    "EtcdTemplate" => serde_json::from_value(json).map(|t| self.templates.push(t)),
                    "EtcdFleetRollout" => {
                        serde_json::from_value(json).map(|r| self.rollouts.push(r))
                    }
                    "EtcdBackupSchedule" => {
                        serde_json::from_value(json).map(|s| self.schedules.push(s))
                    }
                    "EtcdBackup" => serde_json::from_value(json).map(|b| self.backups.push(b)),
                    _ => serde_json::from_value(json).map(|t| self.cluster_templates.push(t)),
                };
                if let Err(e) = added {
                    self.invalid.push(invalid(vec![typed(e)]));
                }
            }
            _ => self.ignored.push(format!("{kind} {name}")),
        }
        Ok(())
    }

    pub fn extend(&mut self, other: Manifests) {
        self.clusters.extend(other.clusters);
        self.templates.extend(other.templates);
        self.cluster_templates.extend(other.cluster_templates);
        self.rollouts.extend(other.rollouts);
        self.schedules.extend(other.schedules);
        self.backups.extend(other.backups);
        self.ignored.extend(other.ignored);
        self.invalid.extend(other.invalid);
    }

    fn cluster_template(&self, name: &str) -> Option<&ClusterEtcdTemplate> {
        self.cluster_templates.iter().find(|t| t.name_any() == name)
    }

    /// A namespaced template of that name in the cluster's namespace (a
    /// template without a namespace in the file matches any).
    fn template(&self, name: &str, namespace: Option<&str>) -> Option<&EtcdTemplate> {
        self.templates.iter().find(|t| {
            t.name_any() == name
                && (t.namespace().is_none()
                    || namespace.is_none()
                    || t.namespace().as_deref() == namespace)
        })
    }

    /// The template chain of a cluster, as the controller would fetch it.
    pub fn templates_for(
        &self,
        cluster: &EtcdCluster,
    ) -> Result<(Option<&ClusterEtcdTemplate>, Option<&EtcdTemplate>), ResolveError> {
        let Some(template_ref) = &cluster.spec.template_ref else {
            return Ok((None, None));
        };
        let not_found = |kind, name: &str| ResolveError::TemplateNotFound {
            kind,
            name: name.to_string(),
        };
        match template_ref.kind {
            TemplateKind::ClusterEtcdTemplate => self
                .cluster_template(&template_ref.name)
                .map(|ct| (Some(ct), None))
                .ok_or_else(|| not_found(TemplateKind::ClusterEtcdTemplate, &template_ref.name)),
            TemplateKind::EtcdTemplate => {
                let ns = cluster.namespace();
                let t = self
                    .template(&template_ref.name, ns.as_deref())
                    .ok_or_else(|| not_found(TemplateKind::EtcdTemplate, &template_ref.name))?;
                match &t.spec.base_template {
                    Some(base) => self
                        .cluster_template(base)
                        .map(|ct| (Some(ct), Some(t)))
                        .ok_or_else(|| not_found(TemplateKind::ClusterEtcdTemplate, base)),
                    None => Ok((None, Some(t))),
                }
            }
        }
    }
}

/// Bad input files.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Not YAML: nothing of the stream is used.
    #[error("{source_name}: {error}")]
    Yaml {
        source_name: String,
        #[source]
        error: etcdfleet_api::yaml::YamlError,
    },
    #[error("{source_name}: document {index}: {message}")]
    Document {
        source_name: String,
        index: usize,
        message: String,
    },
    #[error("{0}: no EtcdCluster found")]
    NoCluster(String),
    #[error("EtcdCluster {cluster}: {error}")]
    Resolve {
        cluster: String,
        #[source]
        error: ResolveError,
    },
    /// The version policy refuses the resolved version (what `plan`
    /// reports as `VersionAccepted=False`): nothing is rendered for it.
    #[error("EtcdCluster {cluster}: spec.version: {error}")]
    Version {
        cluster: String,
        #[source]
        error: Box<etcdfleet_api::version::VersionRejection>,
    },
}

/// `namespace/name` of a cluster (its name alone when it has no namespace).
pub(crate) fn cluster_id(cluster: &EtcdCluster) -> String {
    match cluster.namespace() {
        Some(ns) => format!("{ns}/{}", cluster.name_any()),
        None => cluster.name_any(),
    }
}
