//! The CustomResourceDefinitions of etcdfleet, rendered from the Rust types in
//! `etcdfleet-api`, with a bound on every string, list and map
//! ([`bounds`]). `crdgen` prints or writes them (`make crds`), and a test
//! fails when the committed `config/crd/` differs from what this renders.

pub mod bounds;

use std::io;
use std::path::{Path, PathBuf};

use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdBackup, EtcdBackupSchedule, EtcdCluster, EtcdFleetRollout,
    EtcdTemplate, yaml,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// First lines of every generated file.
pub const GENERATED_HEADER: &str = "# Generated from the Rust types in api/ by `make crds` \
(controllers/src/bin/crdgen.rs). Do not edit by hand.\n";

/// Name of the kustomization that lists the CRD files.
pub const KUSTOMIZATION_FILE: &str = "kustomization.yaml";

/// Every CRD etcdfleet serves, in a fixed order: the storage version
/// ([`etcdfleet_api::VERSION`]) and, with the same schema, every version of
/// [`etcdfleet_api::ALSO_SERVED`] (served, not stored, deprecated).
pub fn crds() -> Vec<CustomResourceDefinition> {
    storage_version_crds()
        .into_iter()
        .map(|crd| with_also_served(crd, etcdfleet_api::ALSO_SERVED))
        .collect()
}

/// The CRDs serving only the storage version: what a release that no
/// longer serves the older versions installs (after `migrate-storage`).
pub fn storage_version_crds() -> Vec<CustomResourceDefinition> {
    [
        EtcdCluster::crd(),
        EtcdTemplate::crd(),
        ClusterEtcdTemplate::crd(),
        EtcdBackup::crd(),
        EtcdBackupSchedule::crd(),
        EtcdFleetRollout::crd(),
    ]
    .into_iter()
    .map(bounded)
    .collect()
}

/// `crd` with a bound on every string, list and map of its schemas
/// ([`bounds`]).
fn bounded(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(schema) = version.schema.as_mut() else {
            continue;
        };
        let Some(props) = schema.open_api_v3_schema.take() else {
            continue;
        };
        let mut json = serde_json::to_value(&props).expect("a schema is JSON");
        bounds::bound(&mut json);
        schema.open_api_v3_schema =
            Some(serde_json::from_value(json).expect("a bounded schema is a schema"));
    }
    crd
}

/// `crd` (one version, the storage version) with `versions` served beside
/// it under the identical schema. Identical schemas need no conversion
/// webhook (`conversion: None`: the API server only rewrites `apiVersion`).
pub fn with_also_served(
    mut crd: CustomResourceDefinition,
    versions: &[&str],
) -> CustomResourceDefinition {
    let storage = crd.spec.versions[0].clone();
    let kind = crd.spec.names.kind.clone();
    // A kind whose storage version is itself one of them (a kind new at
    // that version) has no older version to serve.
    for version in versions.iter().filter(|v| **v != storage.name) {
        let mut older = storage.clone();
        older.name = version.to_string();
        older.storage = false;
        older.deprecated = Some(true);
        older.deprecation_warning = Some(format!(
            "{}/{version} {kind} is deprecated; use {}/{}",
            etcdfleet_api::GROUP,
            etcdfleet_api::GROUP,
            storage.name
        ));
        crd.spec.versions.push(older);
    }
    crd
}

/// One generated file: its name in the CRD directory and its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFile {
    pub file_name: String,
    pub content: String,
}

/// `<plural>.<group>.yaml`, e.g. `etcdclusters.etcdfleet.dev.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or_default())
}

/// One CRD as YAML, without header.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, yaml::WriteError> {
    yaml::to_string(crd)
}

/// The files of `config/crd/`: one per CRD (with the generated-file header)
/// and the kustomization listing them.
pub fn render_files() -> Result<Vec<GeneratedFile>, yaml::WriteError> {
    let crds = crds();
    let mut files = Vec::with_capacity(crds.len() + 1);
    let mut kustomization = format!(
        "{GENERATED_HEADER}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for crd in &crds {
        let file_name = file_name(crd);
        kustomization.push_str(&format!("- {file_name}\n"));
        files.push(GeneratedFile {
            content: format!("{GENERATED_HEADER}{}", to_yaml(crd)?),
            file_name,
        });
    }
    files.push(GeneratedFile {
        file_name: KUSTOMIZATION_FILE.to_string(),
        content: kustomization,
    });
    Ok(files)
}

/// All CRDs as one multi-document YAML stream (what `crdgen` prints).
pub fn render_stream() -> Result<String, yaml::WriteError> {
    let mut out = String::from(GENERATED_HEADER);
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&to_yaml(&crd)?);
    }
    Ok(out)
}

/// Writes `render_files()` into `dir` (created if missing); returns the paths written.
pub fn write_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| io_context(e, dir))?;
    let mut written = Vec::new();
    for file in render_files()? {
        let path = dir.join(&file.file_name);
        std::fs::write(&path, &file.content).map_err(|e| io_context(e, &path))?;
        written.push(path);
    }
    Ok(written)
}

fn io_context(err: io::Error, path: &Path) -> anyhow::Error {
    anyhow::anyhow!("{}: {err}", path.display())
}
