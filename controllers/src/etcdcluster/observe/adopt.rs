//! The adoption reader (`spec.bootstrap.join`, until the takeover is
//! complete): the join credentials (the existing CA), how the existing
//! members are reached (their client URLs, with TLS verified against each
//! URL's own host, since their certificates name their own hosts), what
//! status recorded of the takeover, the TLS probes of the existing members'
//! ports made before the first change, and, once the last old member has
//! left, which of their objects nothing uses any more. Read only.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::adopt::{AdoptedMember, JOIN_CA_CERT, JOIN_CA_KEY, JoinSpec, parse_id};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::Api;

use super::super::context::{Context, Error, Result};
use super::super::plan::observation::{
    AdoptionObservation, EtcdObservation, ProbedPort, TrustProbe,
};
use super::objects::Workload;
use crate::access::{Pki, secret_str};
use crate::etcd::{ClusterHealth, TlsMaterial, probe_tls};
use crate::pki::{CertUsage, CertificateAuthority, IssuedCert, LeafSpec};
use crate::render::Names;

/// What the adoption reader found.
pub struct AdoptionReading {
    pub observation: AdoptionObservation,
    /// The existing CA from the join credentials, when readable.
    ca: Option<CertificateAuthority>,
    /// The existing members' client URLs still to be asked (the spec's,
    /// less those of members etcdfleet removed).
    pub endpoints: Vec<String>,
    /// TLS to every member while adopting: the existing CA, the
    /// controller's identity (issued from it), each URL's host verified.
    pub tls: Option<TlsMaterial>,
    recorded_members: Vec<AdoptedMember>,
}

/// The join of a cluster whose takeover is not complete, if any.
pub fn join_spec(cluster: &EtcdCluster) -> Option<&JoinSpec> {
    let join = cluster.spec.bootstrap.as_ref()?.join.as_ref()?;
    let done = (cluster.status.as_ref())
        .and_then(|s| s.adoption.as_ref())
        .is_some_and(|a| a.is_completed());
    (!done).then_some(join)
}

/// Reads the existing CA from the join credentials Secret: `Ok(Err(why))`
/// when it cannot be used.
pub async fn read_join_ca(
    management: &kube::Client,
    namespace: &str,
    join: &JoinSpec,
) -> Result<std::result::Result<CertificateAuthority, String>> {
    let Some(name) = &join.credentials_secret_name else {
        return Ok(Err(
            "spec.bootstrap.join.credentialsSecretName is required with TLS".into(),
        ));
    };
    let secret = Api::<Secret>::namespaced(management.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::ManagementApi)?;
    let Some(secret) = secret else {
        return Ok(Err(format!("Secret {namespace}/{name} does not exist")));
    };
    let (Some(cert), Some(key)) = (
        secret_str(&secret, JOIN_CA_CERT),
        secret_str(&secret, JOIN_CA_KEY),
    ) else {
        return Ok(Err(format!(
            "Secret {namespace}/{name} must hold {JOIN_CA_CERT} and {JOIN_CA_KEY} (the existing \
             cluster's CA: etcdfleet issues its members' certificates from it)"
        )));
    };
    Ok(CertificateAuthority::from_pem(&cert, &key)
        .map_err(|e| format!("Secret {namespace}/{name}: {e}")))
}

/// Reads what an adopting cluster needs (`None`: it does not adopt).
pub async fn read(
    cluster: &EtcdCluster,
    w: &Workload<'_>,
    pki: Option<&Pki>,
    ctx: &Context,
) -> Result<Option<AdoptionReading>> {
    let Some(join) = join_spec(cluster) else {
        return Ok(None);
    };
    let ns = cluster.namespace().unwrap_or_default();
    let ca = match w.inputs.tls {
        true => read_join_ca(&ctx.management, &ns, join).await?,
        false => Err(String::new()),
    };
    let credentials = match (&ca, w.inputs.tls, pki) {
        (_, false, _) | (Ok(_), true, None) => Ok(()),
        (Ok(ca), true, Some(p)) if ca.cert_pem() == p.ca.cert_pem() => Ok(()),
        (Ok(_), true, Some(_)) => Err(format!(
            "the PKI Secret {} holds another CA than the join credentials; delete it (it is \
             not this cluster's) or name the credentials of the CA it holds",
            w.names.pki_secret()
        )),
        (Err(why), true, _) => Err(why.clone()),
    };
    let stored = (cluster.status.as_ref()).and_then(|s| s.adoption.clone());
    let recorded_members = stored
        .as_ref()
        .map(|a| a.existing_members.clone())
        .unwrap_or_default();
    let retired: BTreeSet<u64> = stored
        .as_ref()
        .map(|a| a.retired_ids().into_iter().collect())
        .unwrap_or_default();
    let gone: BTreeSet<&String> = recorded_members
        .iter()
        .filter(|m| parse_id(&m.id).is_some_and(|id| retired.contains(&id)))
        .flat_map(|m| &m.client_urls)
        .collect();
    let endpoints: Vec<String> = (join.endpoints.iter())
        .filter(|e| !gone.contains(e))
        .cloned()
        .collect();
    let ca = ca.ok();
    let tls = w.inputs.tls.then(|| member_tls(ca.as_ref(), pki)).flatten();
    Ok(Some(AdoptionReading {
        observation: AdoptionObservation {
            credentials,
            ca_imported: pki.is_some(),
            endpoints: join.endpoints.clone(),
            spec_version: w.inputs.version.clone(),
            recorded: stored
                .as_ref()
                .map(|a| a.existing_ids().into_iter().collect())
                .unwrap_or_default(),
            retired,
            probes: Vec::new(),
            deletable: Vec::new(),
        },
        ca,
        endpoints,
        tls,
        recorded_members,
    }))
}

/// TLS to every member while adopting: the CA that signed the existing
/// members' certificates (this cluster's once imported), the controller's
/// identity from the PKI Secret (or, before it exists, one issued in
/// memory from the existing CA), each URL's own host verified.
fn member_tls(ca: Option<&CertificateAuthority>, pki: Option<&Pki>) -> Option<TlsMaterial> {
    let (ca_pem, client) = match (pki, ca) {
        (Some(p), _) => (
            p.ca.cert_pem().to_string(),
            IssuedCert {
                cert_pem: p.client_cert_pem.clone(),
                key_pem: p.client_key_pem.clone(),
            },
        ),
        (None, Some(ca)) => (ca.cert_pem().to_string(), client_identity(ca).ok()?),
        (None, None) => return None,
    };
    Some(TlsMaterial {
        ca_pem,
        client_cert_pem: Some(client.cert_pem),
        client_key_pem: Some(client.key_pem),
        server_name: None,
    })
}

/// The controller's client identity, issued in memory from `ca`.
fn client_identity(
    ca: &CertificateAuthority,
) -> std::result::Result<IssuedCert, crate::pki::PkiError> {
    ca.issue(&LeafSpec::client("etcdfleet-controller", 1))
}

/// The peer certificate this cluster's members will present, issued in
/// memory from `ca` (as the peer TLS Secret will be).
fn peer_identity(
    ca: &CertificateAuthority,
    names: &Names,
) -> std::result::Result<IssuedCert, crate::pki::PkiError> {
    ca.issue(&LeafSpec {
        common_name: "etcd-peer".into(),
        dns_names: names.member_dns_names(),
        ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        usage: CertUsage::Peer,
        validity_days: 1,
    })
}

impl AdoptionReading {
    /// Probes the existing members' client ports (the spec's endpoints)
    /// and peer ports (their peer URLs, as etcd lists them): made before
    /// the first change only, when the credentials hold a CA.
    pub async fn probe(
        &mut self,
        etcd: &EtcdObservation,
        names: &Names,
        w: &Workload<'_>,
        ctx: &Context,
    ) {
        let (Some(ca), Some(client)) = (&self.ca, &self.tls) else {
            return;
        };
        let Ok(peer) = peer_identity(ca, names) else {
            return;
        };
        let peer = TlsMaterial {
            client_cert_pem: Some(peer.cert_pem),
            client_key_pem: Some(peer.key_pem),
            ..client.clone()
        };
        let mut urls: Vec<(String, ProbedPort)> = (self.observation.endpoints.iter())
            .map(|u| (u.clone(), ProbedPort::Client))
            .collect();
        if let EtcdObservation::Observed(health) = etcd {
            urls.extend(peer_urls(health).into_iter().map(|u| (u, ProbedPort::Peer)));
        }
        let transport = crate::dialer::transport(ctx.dialer.clone(), w.cluster);
        // A probe opens a new connection (through a new tunnel by default),
        // shakes hands and asks once.
        let d = &ctx.settings.etcd_deadlines;
        let within = d.connect + d.request;
        let probes = urls.into_iter().map(|(url, port)| {
            let material = if port == ProbedPort::Peer {
                &peer
            } else {
                client
            };
            let transport = &transport;
            async move {
                let result = probe_tls(&url, material, transport, within)
                    .await
                    .map(|a| a.asked_for_certificate);
                TrustProbe { url, port, result }
            }
        });
        self.observation.probes = futures::future::join_all(probes).await;
    }

    /// Lists the old members' objects nothing uses any more (read once the
    /// last one has left): each recorded member's pod (as its URL names
    /// it), its owner (a StatefulSet), its volumes, and its Service.
    pub async fn read_deletable(&mut self, w: &Workload<'_>) {
        let mut found = BTreeSet::new();
        for member in &self.recorded_members {
            let Some((pod, service, ns)) = member
                .client_urls
                .iter()
                .chain(&member.peer_urls)
                .find_map(|u| pod_of_url(u))
            else {
                continue;
            };
            found.insert(format!("Service/{ns}/{service}"));
            let pods: Api<Pod> = Api::namespaced(w.cluster.client.clone(), &ns);
            let Ok(Some(p)) = pods.get_opt(&pod).await else {
                continue;
            };
            let owner = p
                .owner_references()
                .iter()
                .find(|o| o.kind == "StatefulSet")
                .map(|o| format!("StatefulSet/{ns}/{}", o.name));
            found.insert(owner.unwrap_or_else(|| format!("Pod/{ns}/{pod}")));
            let claims = (p.spec.iter())
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| format!("PersistentVolumeClaim/{ns}/{}", c.claim_name));
            found.extend(claims);
        }
        self.observation.deletable = found.into_iter().collect();
    }
}

/// The peer URLs of every member etcd lists.
fn peer_urls(health: &ClusterHealth) -> Vec<String> {
    health
        .members()
        .iter()
        .flat_map(|m| m.member.peer_urls.iter().cloned())
        .filter(|u| u.starts_with("https://"))
        .collect()
}

/// `(pod, service, namespace)` of a URL `scheme://<pod>.<service>.<namespace>.svc...`.
fn pod_of_url(url: &str) -> Option<(String, String, String)> {
    let host = url.split("://").nth(1)?.split([':', '/']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    (labels.len() >= 4 && labels[3] == "svc").then(|| {
        (
            labels[0].to_string(),
            labels[1].to_string(),
            labels[2].to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::pod_of_url;

    #[test]
    fn a_member_url_names_its_pod_service_and_namespace() {
        assert_eq!(
            pod_of_url("https://legacy-etcd-1.legacy-etcd.etcd-system.svc:2379"),
            Some((
                "legacy-etcd-1".into(),
                "legacy-etcd".into(),
                "etcd-system".into()
            ))
        );
        assert_eq!(pod_of_url("https://10.0.0.1:2379"), None);
    }
}
