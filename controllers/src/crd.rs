//! The CustomResourceDefinitions of etcdfleet, rendered from the Rust types in
//! `etcdfleet-api`. `crdgen` prints or writes them (`make crds`), and a test
//! fails when the committed `config/crd/` differs from what this renders.

use std::io;
use std::path::{Path, PathBuf};

use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdBackup, EtcdBackupSchedule, EtcdCluster, EtcdFleetRollout,
    EtcdTemplate,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// First lines of every generated file.
pub const GENERATED_HEADER: &str = "# Generated from the Rust types in api/ by `make crds` \
(controllers/src/bin/crdgen.rs). Do not edit by hand.\n";

/// Name of the kustomization that lists the CRD files.
pub const KUSTOMIZATION_FILE: &str = "kustomization.yaml";

/// Every CRD etcdfleet serves, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        EtcdCluster::crd(),
        EtcdTemplate::crd(),
        ClusterEtcdTemplate::crd(),
        EtcdBackup::crd(),
        EtcdBackupSchedule::crd(),
        EtcdFleetRollout::crd(),
    ]
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
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(crd)
}

/// The files of `config/crd/`: one per CRD (with the generated-file header)
/// and the kustomization listing them.
pub fn render_files() -> Result<Vec<GeneratedFile>, serde_yaml::Error> {
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
pub fn render_stream() -> Result<String, serde_yaml::Error> {
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
