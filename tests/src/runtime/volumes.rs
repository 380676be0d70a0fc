//! A container's volumes on the host: the directory behind each
//! `persistentVolumeClaim` (the runtime's own per PVC, or the host path of
//! the PV it is bound to in node mode), ConfigMap, Secret and `projected`
//! files written as the kubelet writes them, `emptyDir` per pod; the
//! (source, mountPath) pairs a process is bind-mounted with; and the removal
//! of PVC directories whose claim is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    SecretVolumeSource,
};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::env::field_value;
use super::state::{Inner, Mode, PodKey, State, Waiting};

impl Inner {
    pub(super) fn pvc_dir(&self, namespace: &str, pvc: &str) -> PathBuf {
        self.root.join("pvc").join(namespace).join(pvc)
    }

    /// The host directory behind PVC `ns/name`: the runtime's own directory
    /// (emulated), or the host path of the PV the claim is bound to (node
    /// mode; `None` while it is unbound).
    pub(super) async fn claim_dir(
        &self,
        ns: &str,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<PathBuf>> {
        match self.mode {
            // Unbound (its class does not provision): no volume yet.
            Mode::Emulated
                if claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_ref())
                    .is_none() =>
            {
                Ok(None)
            }
            Mode::Emulated => Ok(Some(self.pvc_dir(ns, &claim.name_any()))),
            Mode::Nodes(_) => {
                let Some(volume) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
                    return Ok(None);
                };
                let pv = Api::<PersistentVolume>::all(self.client.clone())
                    .get_opt(&volume)
                    .await?;
                let path = pv
                    .and_then(|pv| pv.spec?.host_path)
                    .map(|h| PathBuf::from(h.path));
                if let Some(p) = &path {
                    self.host_volumes.lock().expect("lock").insert(p.clone());
                }
                Ok(path)
            }
        }
    }

    /// Host directories for each volume mount, as (source, mountPath) pairs
    /// ordered parents first, plus the PVCs used.
    pub(super) async fn prepare_volumes(
        &self,
        pod: &Pod,
        container: &Container,
        pod_dir: &Path,
    ) -> std::result::Result<(Vec<(PathBuf, PathBuf)>, Vec<PodKey>), Waiting> {
        let ns = pod.namespace().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let mut mounts = Vec::new();
        let mut claims = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .ok_or_else(|| mount_error(format!("volume {:?} is not defined", mount.name)))?;
            let local = pod_dir.join("volumes").join(&volume.name);
            let source = if let Some(pvc) = &volume.persistent_volume_claim {
                claims.push((ns.clone(), pvc.claim_name.clone()));
                self.claim_volume(&ns, &pvc.claim_name).await?
            } else if let Some(cm) = &volume.config_map {
                let data = self.config_map_files(&ns, cm).await?;
                write_key_files(&local, &data, cm.items.as_deref(), cm.default_mode)
                    .map_err(io_error)?;
                local
            } else if let Some(secret) = &volume.secret {
                let data = self.secret_files(&ns, secret).await?;
                write_key_files(&local, &data, secret.items.as_deref(), secret.default_mode)
                    .map_err(io_error)?;
                local
            } else if volume.empty_dir.is_some() {
                local
            } else if let Some(projected) = &volume.projected {
                let data = self
                    .projected_files(pod, projected)
                    .await
                    .map_err(|e| mount_error(format!("{e:#}")))?;
                write_key_files(&local, &data, None, projected.default_mode).map_err(io_error)?;
                local
            } else {
                return Err(mount_error(format!(
                    "volume {:?}: only persistentVolumeClaim, configMap, secret, emptyDir and projected are supported",
                    volume.name
                )));
            };
            let source = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => source.join(sub),
                None => source,
            };
            fs::create_dir_all(&source).map_err(io_error)?;
            let target = PathBuf::from(&mount.mount_path);
            if !target.exists() {
                fs::create_dir_all(&target).map_err(io_error)?;
            }
            mounts.push((source, target));
        }
        mounts.sort_by_key(|(_, target)| target.components().count());
        Ok((mounts, claims))
    }

    /// The host directory of claim `ns/name`, ready to mount (see
    /// [`claim_dir`](Self::claim_dir)).
    async fn claim_volume(&self, ns: &str, name: &str) -> std::result::Result<PathBuf, Waiting> {
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| mount_error(e.to_string()))?
            .ok_or_else(|| mount_error(format!("persistentvolumeclaim {name:?} not found")))?;
        let dir = self
            .claim_dir(ns, &claim)
            .await
            .map_err(|e| mount_error(format!("{e:#}")))?
            .ok_or_else(|| {
                mount_error(format!(
                    "persistentvolumeclaim {name:?} is not bound to a host-path volume"
                ))
            })?;
        // A PVC recreated under the same name is a new volume (a new PV
        // in a real cluster): the old one's data must not show through.
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let marker = dir.with_extension("uid");
        if matches!(self.mode, Mode::Emulated)
            && fs::read_to_string(&marker).ok().as_deref() != Some(uid.as_str())
        {
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(io_error)?;
            }
            fs::create_dir_all(dir.parent().unwrap_or(&dir)).map_err(io_error)?;
            fs::write(&marker, &uid).map_err(io_error)?;
        }
        Ok(dir)
    }

    /// The files of a `configMap` volume: its `data` and `binaryData` keys.
    async fn config_map_files(
        &self,
        ns: &str,
        source: &ConfigMapVolumeSource,
    ) -> std::result::Result<BTreeMap<String, Vec<u8>>, Waiting> {
        match self.config_map(ns, &source.name).await {
            Ok(Some(cm)) => {
                let mut d: BTreeMap<String, Vec<u8>> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                d.extend(
                    cm.binary_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0)),
                );
                Ok(d)
            }
            Ok(None) if source.optional == Some(true) => Ok(BTreeMap::new()),
            Ok(None) => Err(mount_error(format!(
                "configmap {:?} not found",
                source.name
            ))),
            Err(e) => Err(mount_error(e.to_string())),
        }
    }

    /// The files of a `secret` volume.
    async fn secret_files(
        &self,
        ns: &str,
        source: &SecretVolumeSource,
    ) -> std::result::Result<BTreeMap<String, Vec<u8>>, Waiting> {
        let name = source.secret_name.clone().unwrap_or_default();
        match self.secret_data(ns, &name).await {
            Ok(Some(d)) => Ok(d),
            Ok(None) if source.optional == Some(true) => Ok(BTreeMap::new()),
            Ok(None) => Err(mount_error(format!("secret {name:?} not found"))),
            Err(e) => Err(mount_error(e.to_string())),
        }
    }

    /// The files of a `projected` volume: ConfigMap keys and downward-API
    /// fields as the kubelet writes them, and a ServiceAccount token (node
    /// mode: a real one; emulated: empty, the in-memory API issues none).
    async fn projected_files(
        &self,
        pod: &Pod,
        projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let ns = pod.namespace().unwrap_or_default();
        let mut files = BTreeMap::new();
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let value = match self.mode {
                    Mode::Nodes(_) => self.pod_token(pod, token).await?,
                    Mode::Emulated => String::new(),
                };
                files.insert(token.path.clone(), value.into_bytes());
            }
            if let Some(cm) = &source.config_map {
                let data = self.config_map(&ns, &cm.name).await?.and_then(|c| c.data);
                if data.is_none() && cm.optional != Some(true) {
                    bail!("configmap {:?} not found", cm.name);
                }
                for item in cm.items.iter().flatten() {
                    if let Some(v) = data.as_ref().and_then(|d| d.get(&item.key)) {
                        files.insert(item.path.clone(), v.clone().into_bytes());
                    }
                }
            }
            for item in source
                .downward_api
                .iter()
                .flat_map(|d| d.items.iter().flatten())
            {
                if let Some(field) = &item.field_ref {
                    let value = field_value(pod, &field.field_path, Ipv4Addr::UNSPECIFIED);
                    files.insert(item.path.clone(), value.unwrap_or_default().into_bytes());
                }
            }
        }
        Ok(files)
    }

    /// Node mode: a token of the pod's ServiceAccount bound to the pod
    /// (`TokenRequest`), as the kubelet mounts it.
    async fn pod_token(
        &self,
        pod: &Pod,
        source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ) -> Result<String> {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::ServiceAccount;
        let ns = pod.namespace().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request: TokenRequest = serde_json::from_value(json!({ "spec": {
            "audiences": source.audience.iter().collect::<Vec<_>>(),
            "expirationSeconds": source.expiration_seconds.unwrap_or(3607),
            "boundObjectRef": { "kind": "Pod", "apiVersion": "v1", "name": pod.name_any(), "uid": pod.uid() },
        }}))?;
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &ns)
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token for ServiceAccount {ns}/{account}"))?;
        answer.status.and_then(|s| s.token).with_context(|| {
            format!("the TokenRequest for ServiceAccount {ns}/{account} answered no token")
        })
    }

    pub(super) async fn collect_pvc_dirs(&self, state: &mut State) -> Result<()> {
        let existing: BTreeSet<PodKey> = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        let in_use: BTreeSet<&PodKey> = state.pods.values().flat_map(|r| r.claims.iter()).collect();
        let gone: Vec<PodKey> = state
            .pvc_dirs
            .iter()
            .filter(|k| !existing.contains(*k) && !in_use.contains(k))
            .cloned()
            .collect();
        for key in gone {
            let dir = self.pvc_dir(&key.0, &key.1);
            if dir.exists() {
                fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            }
            let _ = fs::remove_file(dir.with_extension("uid"));
            state.pvc_dirs.remove(&key);
        }
        Ok(())
    }
}

/// Why a volume cannot be mounted (yet): the container stays creating.
fn mount_error(message: String) -> Waiting {
    Waiting::new("ContainerCreating", message)
}

fn io_error(e: std::io::Error) -> Waiting {
    Waiting::new("ContainerCreating", e.to_string())
}

/// Writes a configMap/secret volume: all keys, or only `items` (key → path).
fn write_key_files(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) -> std::io::Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    let files: Vec<(String, &Vec<u8>, Option<i32>)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|i| data.get(&i.key).map(|v| (i.path.clone(), v, i.mode)))
            .collect(),
        None => data.iter().map(|(k, v)| (k.clone(), v, None)).collect(),
    };
    for (path, value, mode) in files {
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, value)?;
        let mode = mode.or(default_mode).unwrap_or(0o644) as u32;
        fs::set_permissions(&file, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
