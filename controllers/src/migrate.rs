//! `etcdfleet migrate-storage`: moves every stored etcdfleet object to the
//! CRDs' storage version, so a later release can stop serving the older
//! versions.
//!
//! The API server stores an object in the storage version that was current
//! when the object was last written, and lists every version it ever stored
//! under in the CRD's `status.storedVersions`; it refuses a CRD that drops a
//! version still listed there. So, per CRD:
//!
//! 1. read every object (a list at the storage version) and write each back
//!    unchanged (a PUT carrying its resourceVersion): the API server encodes
//!    it at the storage version. Nothing changes in meaning, and the
//!    controller, which sees only a new resourceVersion with the same
//!    generation and spec, writes nothing to any workload cluster. An object
//!    changed meanwhile (409) is read again and rewritten; one deleted
//!    meanwhile (404) needs nothing;
//! 2. once every object was rewritten, set `status.storedVersions` to the
//!    storage version alone.
//!
//! One more thing names an etcdfleet version: the ownerReference of each
//! cluster's PKI Secret in the management cluster (`<cluster>-etcd-pki`, the
//! only object the controller gives an ownerReference). Releases before
//! v0.2.0 wrote it as `etcdfleet.dev/v1alpha1`. The garbage collector
//! resolves an owner through the reference's apiVersion: once `v1alpha1` is
//! no longer served it can resolve it no more, and retries forever instead of
//! deleting the Secret with its cluster. So each such reference is moved to
//! the storage version too (a metadata-only read and patch; the Secret's data
//! is neither read nor returned).
//!
//! Idempotent: a second run rewrites the objects again and changes nothing
//! more. Needs `config/storage-migration` (its ClusterRole: list/get/update
//! on the etcdfleet kinds, get on their CRDs, patch on their CRDs' status,
//! get/patch on Secrets).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};

/// What one CRD's migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdMigration {
    pub crd: String,
    /// Objects written back at the storage version.
    pub rewritten: usize,
    /// PKI Secrets whose ownerReference moved to the storage version
    /// (EtcdClusters only).
    pub owner_references: usize,
    /// `status.storedVersions` before and after.
    pub stored_before: Vec<String>,
    pub stored_after: Vec<String>,
}

impl std::fmt::Display for CrdMigration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} object(s) rewritten; storedVersions [{}] -> [{}]",
            self.crd,
            self.rewritten,
            self.stored_before.join(", "),
            self.stored_after.join(", ")
        )?;
        if self.owner_references > 0 {
            write!(
                f,
                "; {} PKI Secret ownerReference(s) moved",
                self.owner_references
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("CRD {crd}: {source}")]
    Api {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {0} has no storage version")]
    NoStorageVersion(String),
    #[error("{kind} {name}: still conflicting after {attempts} attempts")]
    Conflicts {
        kind: String,
        name: String,
        attempts: u32,
    },
}

/// Attempts per object when it keeps changing under the migration.
const ATTEMPTS: u32 = 5;

/// A client from `kubeconfig`, or in-cluster / `$KUBECONFIG`, with ring as
/// the TLS provider (as `run`).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Migrates every etcdfleet CRD served at more than one version (see the
/// module docs), in the order of [`crate::crd::crds`]. A kind with one
/// version (EtcdFleetRollout, new at v1alpha1) has nothing stored at
/// another, and the migrator's RBAC names only the kinds it migrates.
pub async fn migrate_storage(client: &Client) -> Result<Vec<CrdMigration>, MigrateError> {
    let mut report = Vec::new();
    for crd in crate::crd::crds()
        .into_iter()
        .filter(|c| c.spec.versions.len() > 1)
    {
        let name = crd.metadata.name.clone().unwrap_or_default();
        report.push(migrate_crd(client, &name).await?);
    }
    Ok(report)
}

/// Migrates the objects of one CRD (and, for EtcdClusters, their PKI
/// Secrets' ownerReferences), then trims its `storedVersions`.
pub async fn migrate_crd(client: &Client, name: &str) -> Result<CrdMigration, MigrateError> {
    let api_error = |source| MigrateError::Api {
        crd: name.to_string(),
        source,
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(name).await.map_err(api_error)?;
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .ok_or_else(|| MigrateError::NoStorageVersion(name.to_string()))?
        .name
        .clone();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &storage, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let objects: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let (mut rewritten, mut owner_references) = (0, 0);
    for object in objects
        .list(&ListParams::default())
        .await
        .map_err(api_error)?
    {
        if resource.kind == "EtcdCluster" && move_pki_owner(client, &object, &resource).await? {
            owner_references += 1;
        }
        if rewrite(client, &resource, object, name).await? {
            rewritten += 1;
        }
    }
    let stored_before = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let stored_after = vec![storage];
    if stored_before != stored_after {
        let patch = serde_json::json!({ "status": { "storedVersions": stored_after } });
        crds.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
    }
    Ok(CrdMigration {
        crd: name.to_string(),
        rewritten,
        owner_references,
        stored_before,
        stored_after,
    })
}

/// Writes `object` back unchanged (a PUT with its resourceVersion). True if
/// written; false if it was deleted meanwhile. A conflict reads it again.
async fn rewrite(
    client: &Client,
    resource: &ApiResource,
    mut object: DynamicObject,
    crd: &str,
) -> Result<bool, MigrateError> {
    let api: Api<DynamicObject> = match object.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let name = object.name_any();
    let api_error = |source| MigrateError::Api {
        crd: crd.to_string(),
        source,
    };
    for _ in 0..ATTEMPTS {
        match api.replace(&name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(kube::Error::Api(e)) if e.code == 409 => match api.get_opt(&name).await {
                Ok(Some(fresh)) => object = fresh,
                Ok(None) => return Ok(false),
                Err(source) => return Err(api_error(source)),
            },
            Err(source) => return Err(api_error(source)),
        }
    }
    Err(MigrateError::Conflicts {
        kind: resource.kind.clone(),
        name,
        attempts: ATTEMPTS,
    })
}

/// Moves the ownerReference of `cluster`'s PKI Secret to `resource`'s
/// version (the storage version) if it names another etcdfleet version.
/// True if it was moved. Reads and writes the Secret's metadata only; the
/// patch carries the resourceVersion it read, so a concurrent change is a
/// conflict, read again.
async fn move_pki_owner(
    client: &Client,
    cluster: &DynamicObject,
    resource: &ApiResource,
) -> Result<bool, MigrateError> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = crate::render::Names::new(&cluster.name_any(), &ns).pki_secret();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let api_error = |source| MigrateError::Api {
        crd: format!("{} (Secret {ns}/{name})", resource.plural),
        source,
    };
    for _ in 0..ATTEMPTS {
        let Some(meta) = secrets.get_metadata_opt(&name).await.map_err(api_error)? else {
            return Ok(false);
        };
        let Some(moved) = owner_references_at(&meta.metadata, cluster, resource) else {
            return Ok(false);
        };
        let patch = serde_json::json!({ "metadata": {
            "resourceVersion": meta.metadata.resource_version,
            "ownerReferences": moved,
        }});
        match secrets
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(source) => return Err(api_error(source)),
        }
    }
    Err(MigrateError::Conflicts {
        kind: "Secret".into(),
        name: format!("{ns}/{name}"),
        attempts: ATTEMPTS,
    })
}

/// `meta`'s ownerReferences with the one naming `cluster` (by UID) moved to
/// `resource`'s apiVersion, or `None` when none needs moving.
fn owner_references_at(
    meta: &kube::api::ObjectMeta,
    cluster: &DynamicObject,
    resource: &ApiResource,
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>> {
    let mut references = meta.owner_references.clone()?;
    let uid = cluster.uid()?;
    let stale = references.iter_mut().find(|r| {
        r.uid == uid && r.kind == resource.kind && r.api_version != resource.api_version
    })?;
    stale.api_version = resource.api_version.clone();
    Some(references)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn cluster(uid: &str) -> (DynamicObject, ApiResource) {
        let gvk = GroupVersionKind::gvk("etcdfleet.dev", "v1beta1", "EtcdCluster");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "etcdclusters");
        let mut object = DynamicObject::new("shop", &resource).within("team-a");
        object.metadata.uid = Some(uid.into());
        (object, resource)
    }

    fn owned_by(api_version: &str, uid: &str) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: "EtcdCluster".into(),
                name: "shop".into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_reference_to_this_cluster_at_another_version_moves() {
        let (c, r) = cluster("u1");
        let moved = owner_references_at(&owned_by("etcdfleet.dev/v1alpha1", "u1"), &c, &r)
            .expect("the v1alpha1 reference moves");
        assert_eq!(moved[0].api_version, "etcdfleet.dev/v1beta1");
        assert_eq!(moved[0].uid, "u1");
        assert_eq!(moved[0].controller, Some(true));
        // Already at the storage version, another owner, or no owner at all.
        assert!(owner_references_at(&owned_by("etcdfleet.dev/v1beta1", "u1"), &c, &r).is_none());
        assert!(owner_references_at(&owned_by("etcdfleet.dev/v1alpha1", "u2"), &c, &r).is_none());
        assert!(owner_references_at(&Default::default(), &c, &r).is_none());
    }
}
