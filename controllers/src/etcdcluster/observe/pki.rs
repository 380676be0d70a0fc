//! The PKI reader: the management-side CA and the controller's client
//! identity of one cluster, trusted from the memo while the cluster stays
//! converged, and whether it must be (re)issued.

use etcdfleet_api::EtcdCluster;

use super::super::context::{Context, Result};
use super::super::memo::Remembered;
use crate::access::{Pki, read_pki};
use crate::pki::{not_after, remaining_validity};
use crate::render::RenderInputs;

/// What the PKI reader found.
pub struct PkiReading {
    pub pki: Option<Pki>,
    /// TLS is on and the controller's client certificate is missing or
    /// expires within the renewal window: the PKI is (re)issued.
    pub stale: bool,
    /// Leaf certificates expiring within this long are renewed.
    pub renew_before: std::time::Duration,
}

impl PkiReading {
    /// Whether a leaf certificate is present and far enough from expiry.
    pub fn fresh_cert(&self, pem: Option<&str>) -> bool {
        pem.is_some_and(|pem| remaining_validity(pem).is_ok_and(|left| left > self.renew_before))
    }
}

/// Reads the PKI of `cluster` (or recalls it from the memo).
pub async fn read(
    cluster: &EtcdCluster,
    inputs: &RenderInputs,
    recalled: Option<&Remembered>,
    ctx: &Context,
) -> Result<PkiReading> {
    let names = inputs.names();
    let pki = match recalled {
        Some(r) => r.pki.clone(),
        None if inputs.tls => read_pki(&ctx.management, cluster, &names).await?,
        None => None,
    };
    let mut reading = PkiReading {
        pki,
        stale: false,
        renew_before: ctx.settings.cert_renew_before,
    };
    let client_cert = reading.pki.as_ref().map(|p| p.client_cert_pem.as_str());
    reading.stale = inputs.tls && !reading.fresh_cert(client_cert);
    let key = format!("{}/{}", inputs.owner_namespace, inputs.name);
    let ca = reading.pki.as_ref().map(|p| p.ca.cert_pem());
    for (certificate, pem) in [("ca", ca), ("client", client_cert)] {
        let at = pem.and_then(|pem| not_after(pem).ok());
        ctx.metrics.set_certificate_expiry(&key, certificate, at);
    }
    Ok(reading)
}
