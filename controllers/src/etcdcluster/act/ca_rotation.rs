//! CA rotation in the management-side PKI Secret: the new CA beside the
//! old one, the new one taking over (with the controller's client identity
//! issued from it), the old one dropped, or the new one dropped when the
//! rotation is cancelled. Each is idempotent: taken again after a crash, it
//! finds its work done and changes nothing. What members trust and present
//! follows from the Secret through the workload objects and the roll.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::{Value, json};

use super::super::context::{Error, Result};
use super::target::{CERT_VALIDITY_DAYS, Target};
use crate::access::{
    PKI_CA_CERT, PKI_CA_KEY, PKI_CLIENT_CERT, PKI_CLIENT_KEY, PKI_NEXT_CA_CERT, PKI_NEXT_CA_KEY,
    PKI_PREVIOUS_CA_CERT, Pki, read_pki,
};
use crate::pki::{CertificateAuthority, LeafSpec};

/// Generates the new CA beside the current one (kept if already there).
pub(super) async fn generate_next_ca(on: &Target<'_>) -> Result<()> {
    let pki = fresh_pki(on).await?;
    if pki.next.is_some() {
        return Ok(());
    }
    let request =
        (on.observed.planner.ca_rotation.record.as_ref()).map_or("", |r| r.request_id.as_str());
    let ca =
        CertificateAuthority::generate(&format!("etcdfleet {} ({request})", on.names().cluster))?;
    patch_pki(
        on,
        json!({
            PKI_NEXT_CA_CERT: pem(ca.cert_pem()),
            PKI_NEXT_CA_KEY: pem(ca.key_pem()),
        }),
    )
    .await
}

/// The new CA becomes the cluster's CA; the old one stays trusted as the
/// previous CA; the controller's client identity is issued from the new one.
pub(super) async fn promote_next_ca(on: &Target<'_>) -> Result<()> {
    let pki = fresh_pki(on).await?;
    let Some(next) = pki.next.as_ref() else {
        return match pki.previous_ca_pem {
            Some(_) => Ok(()),
            None => Err(Error::Invalid(
                "CA rotation: the PKI Secret holds no new CA to promote".into(),
            )),
        };
    };
    let client = next.issue(&LeafSpec::client(
        "etcdfleet-controller",
        CERT_VALIDITY_DAYS,
    ))?;
    patch_pki(
        on,
        json!({
            PKI_CA_CERT: pem(next.cert_pem()),
            PKI_CA_KEY: pem(next.key_pem()),
            PKI_PREVIOUS_CA_CERT: pem(pki.ca.cert_pem()),
            PKI_CLIENT_CERT: pem(&client.cert_pem),
            PKI_CLIENT_KEY: pem(&client.key_pem),
            PKI_NEXT_CA_CERT: Value::Null,
            PKI_NEXT_CA_KEY: Value::Null,
        }),
    )
    .await
}

/// Drops the old CA: nothing trusts it any more.
pub(super) async fn drop_previous_ca(on: &Target<'_>) -> Result<()> {
    patch_pki(on, json!({ PKI_PREVIOUS_CA_CERT: Value::Null })).await
}

/// Drops the new CA of a cancelled rotation: the old CA alone again.
pub(super) async fn drop_next_ca(on: &Target<'_>) -> Result<()> {
    patch_pki(
        on,
        json!({ PKI_NEXT_CA_CERT: Value::Null, PKI_NEXT_CA_KEY: Value::Null }),
    )
    .await
}

/// The PKI Secret as it is now (never the memo's copy).
async fn fresh_pki(on: &Target<'_>) -> Result<Pki> {
    read_pki(&on.ctx.management, on.cluster, on.names())
        .await?
        .ok_or_else(|| Error::Invalid("CA rotation: the PKI Secret is missing".into()))
}

fn pem(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// Merge-patches the PKI Secret's data (`null` removes a key).
async fn patch_pki(on: &Target<'_>, data: Value) -> Result<()> {
    Api::<Secret>::namespaced(
        on.ctx.management.clone(),
        &on.cluster.namespace().unwrap_or_default(),
    )
    .patch(
        &on.names().pki_secret(),
        &crate::controller_patch_params(),
        &Patch::Merge(&json!({ "data": data })),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}
