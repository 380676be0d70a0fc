//! CA rotation in the management-side PKI Secret: the new CA beside the
//! old one, the new one taking over (with the controller's client identity
//! issued from it), the old one dropped, or the new one dropped when the
//! rotation is cancelled. Each is idempotent: taken again after a crash, it
//! finds its work done and changes nothing. What members trust and present
//! follows from the Secret through the workload objects and the roll.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::super::context::{Error, Result};
use super::target::{CERT_VALIDITY_DAYS, Target};
use crate::access::{
    PKI_CA_CERT, PKI_CA_KEY, PKI_CLIENT_CERT, PKI_CLIENT_KEY, PKI_NEXT_CA_CERT, PKI_NEXT_CA_KEY,
    PKI_PREVIOUS_CA_CERT, Pki, read_pki, secret_str,
};
use crate::etcd::ClusterClient;
use crate::pki::{CertificateAuthority, IssuedCert, LeafSpec, issued_by};
use crate::render;

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

/// Rebuilds a lost PKI Secret from the members' current trust: the CA in
/// this cluster's own server TLS Secret (no key), accepted only when the
/// Secret's certificate verifies against it and the members answer a client
/// presenting that certificate while trusting only that CA. A new CA is
/// generated beside it; the rotation goes on from `Trusting`.
pub(super) async fn recover_ca(on: &Target<'_>) -> Result<()> {
    let (old_ca, leaf) = members_trust(on).await?;
    let next =
        CertificateAuthority::generate(&format!("etcdfleet {} (recovered)", on.names().cluster))?;
    let pki = Pki {
        ca: std::sync::Arc::new(CertificateAuthority::verify_only(&old_ca)?),
        client_cert_pem: leaf.cert_pem.clone(),
        client_key_pem: leaf.key_pem.clone(),
        next: None,
        previous_ca_pem: None,
    };
    members_answer(on, &pki).await?;
    let data = [
        (PKI_CA_CERT, old_ca.as_str()),
        (PKI_NEXT_CA_CERT, next.cert_pem()),
        (PKI_NEXT_CA_KEY, next.key_pem()),
        (PKI_CLIENT_CERT, leaf.cert_pem.as_str()),
        (PKI_CLIENT_KEY, leaf.key_pem.as_str()),
    ];
    super::pki::create_pki_secret(on.cluster, on.ctx, on.names(), &data).await
}

/// The CA and the certificate of this cluster's own server TLS Secret (its
/// owner label names this cluster), when the CA issued that certificate.
async fn members_trust(on: &Target<'_>) -> Result<(String, IssuedCert)> {
    let name = on.names().server_tls_secret();
    let refused = |why: &str| Error::Invalid(format!("CA recovery: Secret {name} {why}"));
    let secret = (on.api::<Secret>().get_opt(&name).await)
        .map_err(|e| on.err(e))?
        .ok_or_else(|| refused("is missing"))?;
    if render::owner_of(secret.meta()) != Some(on.inputs.owner_label().as_str()) {
        return Err(refused("is not this cluster's"));
    }
    let field = |key: &str| secret_str(&secret, key);
    let (Some(ca), Some(cert_pem), Some(key_pem)) =
        (field("ca.crt"), field("tls.crt"), field("tls.key"))
    else {
        return Err(refused("lacks ca.crt, tls.crt or tls.key"));
    };
    if !issued_by(&cert_pem, &ca) {
        return Err(refused("holds a certificate its CA did not issue"));
    }
    Ok((ca, IssuedCert { cert_pem, key_pem }))
}

/// The members answer a client that trusts only the recovered CA and
/// presents the recovered certificate.
async fn members_answer(on: &Target<'_>, pki: &Pki) -> Result<()> {
    let deadlines = on.ctx.settings.etcd_deadlines;
    let config = on
        .ctx
        .etcd_config(Some(pki), on.names(), deadlines, on.workload);
    let client = ClusterClient::connect(&on.observed.endpoints, &config).await?;
    let listed = tokio::time::timeout(deadlines.request, client.list_members()).await;
    match listed {
        Ok(Ok(members)) if !members.is_empty() => Ok(()),
        Ok(Ok(_)) => Err(Error::Invalid("CA recovery: no member listed".into())),
        Ok(Err(e)) => Err(Error::Invalid(format!(
            "CA recovery: the members do not accept the recovered CA: {e}"
        ))),
        Err(_) => Err(Error::Invalid(
            "CA recovery: no member answered with the recovered CA".into(),
        )),
    }
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
