//! The management-side PKI of one cluster: its CA and the controller's
//! client identity, created once and renewed before they expire.

use std::collections::BTreeMap;

use etcdfleet_api::EtcdCluster;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PostParams};
use kube::{Resource, ResourceExt};

use super::super::context::{Context, Error, Result};
use super::target::CERT_VALIDITY_DAYS;
use crate::access::{PKI_CA_CERT, PKI_CA_KEY, PKI_CLIENT_CERT, PKI_CLIENT_KEY, Pki};
use crate::pki::{CertificateAuthority, LeafSpec};
use crate::render::Names;

/// Reissues the controller's client certificate (same CA) in the PKI Secret.
pub(super) async fn renew_client_identity(
    cluster: &EtcdCluster,
    ctx: &Context,
    names: &Names,
    pki: &Pki,
) -> Result<()> {
    let client = pki.ca.issue(&LeafSpec::client(
        "etcdfleet-controller",
        CERT_VALIDITY_DAYS,
    ))?;
    let patch = serde_json::json!({
        "data": {
            PKI_CLIENT_CERT: ByteString(client.cert_pem.into_bytes()),
            PKI_CLIENT_KEY: ByteString(client.key_pem.into_bytes()),
        }
    });
    Api::<Secret>::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    )
    .patch(
        &names.pki_secret(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}

/// Creates the management-side PKI Secret: a CA for this etcd cluster and the
/// controller's client identity. Owned by the EtcdCluster (same cluster).
pub(super) async fn create_pki(cluster: &EtcdCluster, ctx: &Context, names: &Names) -> Result<()> {
    let ca = CertificateAuthority::generate(&format!("etcdfleet {}", names.cluster))?;
    create_pki_with(cluster, ctx, names, &ca).await
}

/// Creates the management-side PKI Secret with `ca` (generated, or the
/// CA of an adopted etcd) and the controller's client identity issued
/// from it. An existing Secret is kept.
pub(super) async fn create_pki_with(
    cluster: &EtcdCluster,
    ctx: &Context,
    names: &Names,
    ca: &CertificateAuthority,
) -> Result<()> {
    let client = ca.issue(&LeafSpec::client(
        "etcdfleet-controller",
        CERT_VALIDITY_DAYS,
    ))?;
    let data = [
        (PKI_CA_CERT, ca.cert_pem()),
        (PKI_CA_KEY, ca.key_pem()),
        (PKI_CLIENT_CERT, client.cert_pem.as_str()),
        (PKI_CLIENT_KEY, client.key_pem.as_str()),
    ];
    create_pki_secret(cluster, ctx, names, &data).await
}

/// Creates the management-side PKI Secret with `data`, owned by the
/// EtcdCluster. An existing Secret is kept.
pub(super) async fn create_pki_secret(
    cluster: &EtcdCluster,
    ctx: &Context,
    names: &Names,
    data: &[(&str, &str)],
) -> Result<()> {
    let owner = OwnerReference {
        api_version: EtcdCluster::api_version(&()).into_owned(),
        kind: "EtcdCluster".into(),
        name: cluster.name_any(),
        uid: cluster.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names.pki_secret()),
            namespace: cluster.namespace(),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "etcdfleet".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Another reconcile created it first: keep theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::ManagementApi(e)),
    }
}
