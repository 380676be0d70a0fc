//! The workload-objects reader: the namespace, Services, TLS Secrets, PDB,
//! members ConfigMap and StatefulSet of one cluster, checked against the
//! inputs they are rendered from (the render contract) and against their
//! owner. Read only.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use kube::api::Api;

use super::super::context::{Error, Result};
use super::super::plan::observation::ForeignObject;
use super::super::plan::step::ObjectKind;
use super::super::resolved::Resolved;
use super::pki::PkiReading;
use crate::access::{Pki, secret_str};
use crate::connector::WorkloadCluster;
use crate::render::{self, Names, RenderInputs};

/// What every reader of one cluster's workload objects shares.
pub struct Workload<'a> {
    pub cluster: &'a WorkloadCluster,
    pub inputs: &'a RenderInputs,
    pub names: Names,
    /// The owner label's value of this cluster's objects.
    pub owner: String,
}

impl<'a> Workload<'a> {
    pub fn new(cluster: &'a WorkloadCluster, inputs: &'a RenderInputs) -> Self {
        Workload {
            cluster,
            inputs,
            names: inputs.names(),
            owner: inputs.owner_label(),
        }
    }

    /// The workload namespace.
    pub fn ns(&self) -> &str {
        &self.inputs.workload_namespace
    }

    /// The namespaced API of `K` in the workload namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.cluster.client.clone(), self.ns())
    }

    /// A workload API failure, naming the server.
    pub fn err(&self) -> impl Fn(kube::Error) -> Error + '_ {
        move |source| Error::WorkloadApi {
            server: self.cluster.server.to_string(),
            source,
        }
    }

    /// Records `obj` as a conflict unless its owner label names this cluster
    /// (see [`check_owner`]).
    fn owned<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        conflicts: &mut Vec<ForeignObject>,
    ) -> bool {
        check_owner(obj, self.ns(), &self.owner, conflicts)
    }
}

/// The objects that are only checked for presence, owner and inputs.
#[derive(Default)]
pub struct StaticObjects {
    /// Missing or out of date, in the order they are written.
    pub stale: Vec<ObjectKind>,
    pub conflicts: Vec<ForeignObject>,
    /// A workload TLS Secret carries a CA certificate.
    pub tls_secret_ca_present: bool,
    /// The members ConfigMap announces members to start from it (anything
    /// but [`render::CLOSED_INITIAL_CLUSTER`]).
    pub announces_members: bool,
}

/// Reads the namespace, TLS Secrets, Services, PDB and members ConfigMap.
pub async fn read_static(w: &Workload<'_>, pki: &PkiReading) -> Result<StaticObjects> {
    let (inputs, names, err) = (w.inputs, &w.names, w.err());
    let mut found = StaticObjects::default();
    let namespaces: Api<Namespace> = Api::all(w.cluster.client.clone());
    if namespaces.get_opt(w.ns()).await.map_err(&err)?.is_none() {
        found.stale.push(ObjectKind::Namespace);
    }
    if inputs.tls {
        read_tls_secrets(w, pki, &mut found).await?;
        read_ca_bundle(w, pki, &mut found).await?;
    }
    let services: Api<Service> = w.api();
    for (kind, name) in [
        (ObjectKind::PeerService, names.peer_service()),
        (ObjectKind::ClientService, names.client_service()),
    ] {
        match services.get_opt(&name).await.map_err(&err)? {
            Some(s) if !w.owned(&s, &mut found.conflicts) => {}
            Some(s) if hash_matches(&s.metadata, &inputs.identity_hash(&format!("{kind:?}"))) => {}
            _ => found.stale.push(kind),
        }
    }
    let pdbs: Api<PodDisruptionBudget> = w.api();
    match pdbs.get_opt(&names.pdb()).await.map_err(&err)? {
        Some(p) if !w.owned(&p, &mut found.conflicts) => {}
        Some(p) if hash_matches(&p.metadata, &inputs.identity_hash("PodDisruptionBudget")) => {}
        _ => found.stale.push(ObjectKind::PodDisruptionBudget),
    }
    let configmaps: Api<ConfigMap> = w.api();
    match configmaps
        .get_opt(&names.members_configmap())
        .await
        .map_err(&err)?
    {
        None => found.stale.push(ObjectKind::MembersConfigMap),
        Some(cm) => {
            if w.owned(&cm, &mut found.conflicts) {
                found.announces_members = announces_members(&cm);
            }
        }
    }
    Ok(found)
}

/// Whether the members ConfigMap names members that may start from it (a
/// member that starts on an empty data directory reads it, see
/// [`render::CLOSED_INITIAL_CLUSTER`]) and was written by a release that
/// closes it ([`render::ANNOUNCEMENT_ANNOTATION`]): an earlier release's is
/// left as it is, since no CR asked for a write.
fn announces_members(cm: &ConfigMap) -> bool {
    let initial = (cm.data.as_ref()).and_then(|d| d.get(render::INITIAL_CLUSTER_KEY));
    let closes = (cm.metadata.annotations.as_ref())
        .and_then(|a| a.get(render::ANNOUNCEMENT_ANNOTATION))
        .is_some_and(|v| v == render::CLOSES_ONCE_STARTED);
    closes && initial.is_some_and(|i| i != render::CLOSED_INITIAL_CLUSTER)
}

/// The server and peer TLS Secrets: owned, rendered from these inputs,
/// issued by the cluster's CA and not about to expire.
async fn read_tls_secrets(
    w: &Workload<'_>,
    pki: &PkiReading,
    found: &mut StaticObjects,
) -> Result<()> {
    let (inputs, names, err) = (w.inputs, &w.names, w.err());
    let secrets: Api<Secret> = w.api();
    for (kind, name) in [
        (ObjectKind::ServerTlsSecret, names.server_tls_secret()),
        (ObjectKind::PeerTlsSecret, names.peer_tls_secret()),
    ] {
        let fresh = match secrets.get_opt(&name).await.map_err(&err)? {
            Some(s) if !w.owned(&s, &mut found.conflicts) => true,
            Some(s) => {
                found.tls_secret_ca_present |= secret_str(&s, "ca.crt").is_some();
                hash_matches(&s.metadata, &inputs.identity_hash(&format!("{kind:?}")))
                    && pki.pki.as_ref().is_some_and(|p| issued_here(&s, p))
                    && pki.fresh_cert(secret_str(&s, "tls.crt").as_deref())
            }
            None => false,
        };
        if !fresh {
            found.stale.push(kind);
        }
    }
    Ok(())
}

/// A TLS Secret carries the CAs members trust now (the bundle, during a
/// rotation) and a certificate the current CA issued.
fn issued_here(secret: &Secret, pki: &Pki) -> bool {
    secret_str(secret, "ca.crt").as_deref() == Some(pki.trust_bundle().as_str())
        && secret_str(secret, "tls.crt")
            .is_some_and(|cert| crate::pki::issued_by(&cert, pki.ca.cert_pem()))
}

/// The CA bundle ConfigMap, once a rotation was asked for: owned and
/// holding the CAs trusted now.
async fn read_ca_bundle(
    w: &Workload<'_>,
    pki: &PkiReading,
    found: &mut StaticObjects,
) -> Result<()> {
    let Some(p) = pki.pki.as_ref().filter(|_| w.inputs.publish_ca_bundle) else {
        return Ok(());
    };
    let api: Api<ConfigMap> = w.api();
    let fresh = match api
        .get_opt(&w.names.ca_bundle_configmap())
        .await
        .map_err(w.err())?
    {
        Some(cm) if !w.owned(&cm, &mut found.conflicts) => true,
        Some(cm) => {
            cm.data.as_ref().and_then(|d| d.get(render::CA_BUNDLE_KEY)) == Some(&p.trust_bundle())
        }
        None => false,
    };
    if !fresh {
        found.stale.push(ObjectKind::CaBundleConfigMap);
    }
    Ok(())
}

/// The StatefulSet as the readers found it.
pub struct StatefulSetReading {
    pub statefulset: Option<StatefulSet>,
    /// Missing, or drifted from its inputs (while a version change is not
    /// rejected).
    pub stale: bool,
    pub conflicts: Vec<ForeignObject>,
}

/// Reads the StatefulSet (every reconcile: it changes on its own).
pub async fn read_statefulset(w: &Workload<'_>, resolved: &Resolved) -> Result<StatefulSetReading> {
    let inputs = w.inputs;
    let statefulsets: Api<StatefulSet> = w.api();
    let statefulset = statefulsets
        .get_opt(&w.names.statefulset())
        .await
        .map_err(w.err())?;
    let mut conflicts = Vec::new();
    if let Some(sts) = &statefulset {
        w.owned(sts, &mut conflicts);
    }
    // A StatefulSet whose claim template differs from spec.storage is
    // never rewritten (claim templates are immutable): the storage rules
    // re-create it once the volumes have grown, or refuse the change.
    let stale = match &statefulset {
        None => true,
        Some(sts) => {
            let storage_differs = render::statefulset_storage(sts).is_some_and(|(class, size)| {
                (class, size)
                    != (
                        inputs.storage_class.clone(),
                        Some(inputs.storage_size.clone()),
                    )
            });
            !resolved.hold_statefulset() && !storage_differs && render::drift(sts, inputs).is_some()
        }
    };
    Ok(StatefulSetReading {
        statefulset,
        stale,
        conflicts,
    })
}

fn hash_matches(meta: &kube::api::ObjectMeta, want: &str) -> bool {
    render::carried_hash(meta) == Some(want)
}

/// Records `obj` as a conflict unless its owner label names this cluster.
/// Read before every write: an object at our name that another EtcdCluster
/// (or nobody) holds is never overwritten, adopted or deleted.
pub fn check_owner<K: Resource<DynamicType = ()>>(
    obj: &K,
    ns: &str,
    owner: &str,
    conflicts: &mut Vec<ForeignObject>,
) -> bool {
    let theirs = render::owner_of(obj.meta());
    if theirs == Some(owner) {
        return true;
    }
    conflicts.push(ForeignObject {
        object: format!(
            "{}/{ns}/{}",
            K::kind(&()),
            obj.meta().name.as_deref().unwrap_or("")
        ),
        owner: theirs.map(str::to_string),
    });
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configmap(initial: &str, annotated: bool) -> ConfigMap {
        let mut cm = ConfigMap {
            data: Some([(render::INITIAL_CLUSTER_KEY.to_string(), initial.to_string())].into()),
            ..Default::default()
        };
        if annotated {
            cm.metadata.annotations = Some(
                [(
                    render::ANNOUNCEMENT_ANNOTATION.to_string(),
                    render::CLOSES_ONCE_STARTED.to_string(),
                )]
                .into(),
            );
        }
        cm
    }

    #[test]
    fn only_an_announcement_this_release_wrote_is_closed() {
        let open = "shop-etcd-0=https://shop-etcd-0.shop-etcd-peer:2380";
        assert!(announces_members(&configmap(open, true)));
        // An earlier release's announcement: closing it would write into a
        // workload cluster that no CR asked to change.
        assert!(!announces_members(&configmap(open, false)));
        assert!(!announces_members(&configmap(
            render::CLOSED_INITIAL_CLUSTER,
            true
        )));
    }
}
