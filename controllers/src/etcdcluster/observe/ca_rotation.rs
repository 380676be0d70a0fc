//! The CA rotation reader: what is asked (the `etcdfleet.dev/rotate-ca`
//! annotation, or the CA's nearing expiry), what status recorded, and
//! which CAs the PKI Secret holds. Read only.

use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::ca_rotation::{
    CANCEL, EXPIRY_REQUEST_PREFIX, RECOVER_CA_ANNOTATION, RECOVER_REQUEST_PREFIX,
    ROTATE_CA_ANNOTATION,
};
use kube::ResourceExt;

use super::super::plan::observation::CaRotationObservation;
use crate::access::Pki;
use crate::pki::remaining_validity;

/// What a rotation decides from; `rotate_before`: the expiry window.
pub fn read(
    cluster: &EtcdCluster,
    pki: Option<&Pki>,
    rotate_before: Option<Duration>,
) -> CaRotationObservation {
    let asked = cluster
        .annotations()
        .get(ROTATE_CA_ANNOTATION)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let cancel_asked = asked.as_deref() == Some(CANCEL);
    let requested = asked
        .filter(|_| !cancel_asked)
        .or_else(|| pki.and_then(|p| expiry_request(p, rotate_before?)));
    let recover_asked = (cluster.annotations().get(RECOVER_CA_ANNOTATION))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(|v| format!("{RECOVER_REQUEST_PREFIX}{v}"));
    CaRotationObservation {
        requested,
        cancel_asked,
        recover_asked,
        record: cluster.status.as_ref().and_then(|s| s.ca_rotation.clone()),
        next_ca: pki.is_some_and(|p| p.next.is_some()),
        previous_ca: pki.is_some_and(|p| p.previous_ca_pem.is_some()),
    }
}

/// `expiry-<fingerprint>` when the CA expires within `window`: one request
/// per CA, so a rotated CA is not rotated again for the same reason.
fn expiry_request(pki: &Pki, window: Duration) -> Option<String> {
    let left = remaining_validity(pki.ca.cert_pem()).ok()?;
    (left < window).then(|| format!("{EXPIRY_REQUEST_PREFIX}{}", fingerprint(pki.ca.cert_pem())))
}

/// The first 6 bytes of the SHA-256 of the CA's PEM, in hex.
fn fingerprint(pem: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, pem.as_bytes());
    digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::CertificateAuthority;

    fn pki(validity_days: u32) -> Pki {
        let ca = CertificateAuthority::generate_with_validity("ca", validity_days).unwrap();
        Pki {
            ca: std::sync::Arc::new(ca),
            client_cert_pem: String::new(),
            client_key_pem: String::new(),
            next: None,
            previous_ca_pem: None,
        }
    }

    fn cluster(annotation: Option<&str>) -> EtcdCluster {
        let mut c = EtcdCluster::new("c", Default::default());
        if let Some(v) = annotation {
            c.annotations_mut()
                .insert(ROTATE_CA_ANNOTATION.into(), v.into());
        }
        c
    }

    #[test]
    fn the_annotation_asks_and_cancel_cancels() {
        let p = pki(3650);
        let asked = read(&cluster(Some("r1")), Some(&p), None);
        assert_eq!(asked.requested.as_deref(), Some("r1"));
        let cancel = read(&cluster(Some("cancel")), Some(&p), None);
        assert!(cancel.cancel_asked && cancel.requested.is_none());
        assert_eq!(read(&cluster(None), Some(&p), None).requested, None);
        let mut lost = cluster(None);
        (lost.annotations_mut()).insert(RECOVER_CA_ANNOTATION.into(), "r2".into());
        let recover = read(&lost, None, None).recover_asked;
        assert_eq!(recover.as_deref(), Some("recover-r2"));
    }

    #[test]
    fn a_ca_within_the_window_asks_once_per_ca() {
        let (near, far) = (pki(20), pki(3650));
        let window = Some(Duration::from_secs(30 * 86400));
        let asked = read(&cluster(None), Some(&near), window).requested.unwrap();
        assert!(asked.starts_with(EXPIRY_REQUEST_PREFIX), "{asked}");
        assert_eq!(
            read(&cluster(None), Some(&near), window).requested,
            Some(asked),
            "the same CA asks with the same id"
        );
        assert_eq!(read(&cluster(None), Some(&far), window).requested, None);
        assert_eq!(read(&cluster(None), Some(&near), None).requested, None);
    }
}
