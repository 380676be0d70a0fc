//! X.509 material for etcd: a certificate authority per etcd cluster, and the
//! leaf certificates it signs (server, peer, client), all handed out as PEM so
//! they can go straight into Kubernetes TLS Secrets or etcd's `--*-file` flags.
//!
//! etcd peers present one certificate in both directions (they dial each other
//! and accept each other), so a [`CertUsage::Peer`] certificate carries both the
//! serverAuth and clientAuth extended key usages. Server certificates also carry
//! clientAuth, because etcd's gRPC gateway dials its own client port with the
//! server certificate.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A failure to build, sign or parse certificate material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("invalid DNS name {name:?} in certificate request: {source}")]
    InvalidDnsName { name: String, source: rcgen::Error },
    #[error("certificate request has no common name")]
    EmptyCommonName,
    #[error("validity must be at least one day")]
    ZeroValidity,
    #[error("could not parse CA material: {0}")]
    InvalidCa(rcgen::Error),
    #[error("signing failed: {0}")]
    Signing(#[from] rcgen::Error),
    #[error("could not parse certificate: {0}")]
    InvalidCertificate(String),
}

impl PkiError {
    /// A short, stable label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            PkiError::InvalidDnsName { .. } => "InvalidDnsName",
            PkiError::EmptyCommonName => "EmptyCommonName",
            PkiError::ZeroValidity => "ZeroValidity",
            PkiError::InvalidCa(_) => "InvalidCa",
            PkiError::Signing(_) => "SigningFailed",
            PkiError::InvalidCertificate(_) => "InvalidCertificate",
        }
    }
}

pub type Result<T, E = PkiError> = std::result::Result<T, E>;

/// What a leaf certificate is for; decides its extended key usages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertUsage {
    /// etcd client port: serverAuth + clientAuth.
    Server,
    /// A client identity (the controller, etcdctl): clientAuth only.
    Client,
    /// etcd peer port, used both ways: serverAuth + clientAuth.
    Peer,
}

/// What to put in one leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usage: CertUsage,
    pub validity_days: u32,
}

impl LeafSpec {
    /// A client identity with the given common name (no SANs).
    pub fn client(common_name: impl Into<String>, validity_days: u32) -> Self {
        LeafSpec {
            common_name: common_name.into(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usage: CertUsage::Client,
            validity_days,
        }
    }
}

/// A signed certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print private keys into logs.
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Default lifetime of a generated CA.
pub const CA_VALIDITY_DAYS: u32 = 3650;

/// A CA able to sign leaf certificates. It is its PEM pair (validated when
/// made), so it can be stored, cloned, and loaded again later
/// ([`CertificateAuthority::from_pem`]) to re-sign.
#[derive(Clone)]
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA (ECDSA P-256) valid for [`CA_VALIDITY_DAYS`].
    pub fn generate(common_name: &str) -> Result<Self> {
        Self::generate_with_validity(common_name, CA_VALIDITY_DAYS)
    }

    pub fn generate_with_validity(common_name: &str, validity_days: u32) -> Result<Self> {
        if common_name.trim().is_empty() {
            return Err(PkiError::EmptyCommonName);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, validity_days)?;
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Loads a CA previously produced by [`generate`](Self::generate) (or any
    /// CA certificate with its PKCS#8 key) so it can sign again.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let ca = CertificateAuthority {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        };
        ca.issuer()?;
        Ok(ca)
    }

    /// A CA known by its certificate alone (its key is lost): it is
    /// trusted and verifies, but cannot sign ([`issue`](Self::issue) fails
    /// with `InvalidCa`).
    pub fn verify_only(cert_pem: &str) -> Result<Self> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| PkiError::InvalidCertificate(e.to_string()))?;
        pem.parse_x509()
            .map_err(|e| PkiError::InvalidCertificate(e.to_string()))?;
        Ok(CertificateAuthority {
            cert_pem: cert_pem.to_string(),
            key_pem: String::new(),
        })
    }

    /// Whether it holds its key (see [`verify_only`](Self::verify_only)).
    pub fn can_sign(&self) -> bool {
        !self.key_pem.is_empty()
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(PkiError::InvalidCa)?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(PkiError::InvalidCa)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Signs a fresh key pair for `spec`.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCert> {
        if spec.common_name.trim().is_empty() {
            return Err(PkiError::EmptyCommonName);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&spec.common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match spec.usage {
            CertUsage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            CertUsage::Server | CertUsage::Peer => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        for dns in &spec.dns_names {
            let ia5 = dns
                .clone()
                .try_into()
                .map_err(|source| PkiError::InvalidDnsName {
                    name: dns.clone(),
                    source,
                })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(spec.ip_addresses.iter().copied().map(SanType::IpAddress));
        set_validity(&mut params, spec.validity_days)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// How long the certificate in `cert_pem` stays valid from now (zero once it
/// expired), read from its `notAfter`.
pub fn remaining_validity(cert_pem: &str) -> Result<std::time::Duration> {
    let not_after = not_after(cert_pem)?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    Ok(std::time::Duration::from_secs(
        u64::try_from(not_after - now).unwrap_or_default(),
    ))
}

/// The `notAfter` of the (first) certificate in `cert_pem`, in Unix seconds.
pub fn not_after(cert_pem: &str) -> Result<i64> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| PkiError::InvalidCertificate(e.to_string()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| PkiError::InvalidCertificate(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp())
}

/// Whether the certificate in `cert_pem` was signed by the CA in `ca_pem`
/// (its signature verifies with the CA's key). Unparsable input is `false`.
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> bool {
    let parse = |pem: &str| {
        x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .ok()
            .map(|(_, p)| p)
    };
    let (Some(leaf), Some(ca)) = (parse(cert_pem), parse(ca_pem)) else {
        return false;
    };
    match (leaf.parse_x509(), ca.parse_x509()) {
        (Ok(leaf), Ok(ca)) => leaf.verify_signature(Some(ca.public_key())).is_ok(),
        _ => false,
    }
}

fn set_validity(params: &mut CertificateParams, days: u32) -> Result<()> {
    if days == 0 {
        return Err(PkiError::ZeroValidity);
    }
    // Backdate a little so a clock that is slightly behind still accepts it.
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(i64::from(days));
    Ok(())
}

#[cfg(test)]
mod renewal_tests {
    use super::*;

    #[test]
    fn remaining_validity_reads_not_after() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let leaf = ca.issue(&LeafSpec::client("c", 10)).unwrap();
        let left = remaining_validity(&leaf.cert_pem).unwrap();
        let ten_days = std::time::Duration::from_secs(10 * 86400);
        assert!(
            left <= ten_days && left > ten_days - std::time::Duration::from_secs(60),
            "{left:?}"
        );
        assert!(remaining_validity("not a certificate").is_err());
    }

    #[test]
    fn a_leaf_is_issued_by_its_ca_only() {
        let (old, new) = (
            CertificateAuthority::generate("ca").unwrap(),
            CertificateAuthority::generate("ca").unwrap(),
        );
        let leaf = old.issue(&LeafSpec::client("c", 10)).unwrap();
        assert!(issued_by(&leaf.cert_pem, old.cert_pem()));
        assert!(!issued_by(&leaf.cert_pem, new.cert_pem()));
        assert!(!issued_by("junk", old.cert_pem()));
        let keyless = CertificateAuthority::verify_only(old.cert_pem()).unwrap();
        assert!(!keyless.can_sign() && old.can_sign());
        let refused = keyless.issue(&LeafSpec::client("c", 1)).unwrap_err();
        assert_eq!(refused.reason(), "InvalidCa");
        assert!(CertificateAuthority::verify_only("junk").is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::pem::parse_x509_pem;

    fn parse(pem: &str) -> x509_parser::pem::Pem {
        let (rest, pem) = parse_x509_pem(pem.as_bytes()).expect("valid PEM");
        assert!(rest.iter().all(|b| b.is_ascii_whitespace()));
        pem
    }

    fn server_spec() -> LeafSpec {
        LeafSpec {
            common_name: "etcd-0".into(),
            dns_names: vec![
                "prod-etcd-0.prod-etcd.ns.svc".into(),
                "*.prod-etcd.ns.svc".into(),
                "localhost".into(),
            ],
            ip_addresses: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            usage: CertUsage::Peer,
            validity_days: 365,
        }
    }

    #[test]
    fn ca_is_a_self_signed_ca_with_cert_sign_usage() {
        let ca = CertificateAuthority::generate("etcdfleet test CA").unwrap();
        let pem = parse(ca.cert_pem());
        let cert = pem.parse_x509().unwrap();
        assert_eq!(cert.subject(), cert.issuer());
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "etcdfleet test CA");
        let bc = cert.basic_constraints().unwrap().unwrap().value;
        assert!(bc.ca);
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign());
        cert.verify_signature(None)
            .expect("self-signed signature verifies");
        assert!(ca.key_pem().contains("PRIVATE KEY"));
    }

    #[test]
    fn peer_cert_carries_sans_both_ekus_and_is_signed_by_the_ca() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let issued = ca.issue(&server_spec()).unwrap();
        let leaf_pem = parse(&issued.cert_pem);
        let leaf = leaf_pem.parse_x509().unwrap();
        let ca_pem = parse(ca.cert_pem());
        let ca_cert = ca_pem.parse_x509().unwrap();

        assert_eq!(leaf.issuer(), ca_cert.subject());
        leaf.verify_signature(Some(ca_cert.public_key()))
            .expect("leaf signed by CA key");
        assert!(!leaf.basic_constraints().unwrap().unwrap().value.ca);

        let san = leaf.subject_alternative_name().unwrap().unwrap().value;
        let dns: Vec<&str> = san
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::DNSName(d) => Some(*d),
                _ => None,
            })
            .collect();
        assert_eq!(
            dns,
            [
                "prod-etcd-0.prod-etcd.ns.svc",
                "*.prod-etcd.ns.svc",
                "localhost"
            ]
        );
        let ips: Vec<&[u8]> = san
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::IPAddress(ip) => Some(*ip),
                _ => None,
            })
            .collect();
        assert_eq!(ips.len(), 2);
        assert_eq!(ips[0], [127, 0, 0, 1]);
        assert_eq!(ips[1].len(), 16);

        let eku = leaf.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        let validity = leaf.validity().time_to_expiration().unwrap();
        assert!(validity.whole_days() >= 364 && validity.whole_days() <= 365);
    }

    #[test]
    fn server_cert_has_both_ekus_and_client_cert_only_client_auth() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let mut spec = server_spec();
        spec.usage = CertUsage::Server;
        let server = ca.issue(&spec).unwrap();
        let pem = parse(&server.cert_pem);
        let cert = pem.parse_x509().unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);

        let client = ca
            .issue(&LeafSpec::client("etcdfleet-controller", 30))
            .unwrap();
        let pem = parse(&client.cert_pem);
        let cert = pem.parse_x509().unwrap();
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "etcdfleet-controller");
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(cert.subject_alternative_name().unwrap().is_none());
    }

    #[test]
    fn ca_reloaded_from_pem_signs_certs_that_verify_against_the_original() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let reloaded = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(reloaded.cert_pem(), ca.cert_pem());
        let issued = reloaded.issue(&LeafSpec::client("later", 1)).unwrap();
        let leaf_pem = parse(&issued.cert_pem);
        let leaf = leaf_pem.parse_x509().unwrap();
        let ca_pem = parse(ca.cert_pem());
        let ca_cert = ca_pem.parse_x509().unwrap();
        assert_eq!(leaf.issuer(), ca_cert.subject());
        leaf.verify_signature(Some(ca_cert.public_key())).unwrap();
    }

    #[test]
    fn bad_requests_are_typed_errors() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        let mut spec = server_spec();
        spec.validity_days = 0;
        assert_eq!(ca.issue(&spec).unwrap_err().reason(), "ZeroValidity");
        let mut spec = server_spec();
        spec.common_name = " ".into();
        assert_eq!(ca.issue(&spec).unwrap_err().reason(), "EmptyCommonName");
        let mut spec = server_spec();
        spec.dns_names = vec!["bad name\u{e9}".into()];
        assert_eq!(ca.issue(&spec).unwrap_err().reason(), "InvalidDnsName");
        assert_eq!(
            CertificateAuthority::from_pem("not pem", "not a key")
                .unwrap_err()
                .reason(),
            "InvalidCa"
        );
        assert!(format!("{:?}", ca.issue(&server_spec()).unwrap()).contains("<redacted>"));
    }
}
