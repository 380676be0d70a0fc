//! Observe step: reads the workload objects and asks etcd about its members.
//! Read only: nothing here writes to any API or to etcd.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::plan::{
    EtcdObservation, FailedStep, ForeignObject, ObjectKind, Observation, PodObservation,
    PvcObservation, StatefulSetObservation,
};
use super::resolve::Resolved;
use super::status::Report;
use super::{Context, Error, Result};
use crate::connector::WorkloadCluster;
use crate::etcd::{ClusterClient, ClusterHealth, EtcdConfig, TlsMaterial, observe_through};
use crate::pki::{CertificateAuthority, remaining_validity};
use crate::render::{self, Names, RenderInputs};

/// Annotation on a member PVC naming the etcd member id (hex) whose data it holds.
pub const PVC_MEMBER_ANNOTATION: &str = "etcdfleet.dev/member-id";
/// Annotation on a member PVC naming the EtcdCluster whose data it holds
/// (the owner label's value; a claim template's labels cannot change, so the
/// owner is recorded here once the member runs).
pub const PVC_OWNER_ANNOTATION: &str = "etcdfleet.dev/owner";
/// Annotation on a member PVC: the etcd version that last ran on its data.
pub const PVC_VERSION_ANNOTATION: &str = "etcdfleet.dev/etcd-version";
/// Keys of the management-side PKI Secret.
pub const PKI_CA_CERT: &str = "ca.crt";
pub const PKI_CA_KEY: &str = "ca.key";
pub const PKI_CLIENT_CERT: &str = "client.crt";
pub const PKI_CLIENT_KEY: &str = "client.key";

/// The CA and the controller's client identity of one etcd cluster.
#[derive(Clone)]
pub struct Pki {
    pub ca: std::sync::Arc<CertificateAuthority>,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

/// Everything observed, raw objects included (for `act`'s preconditions).
pub struct Observed {
    pub planner: Observation,
    pub statefulset: Option<StatefulSet>,
    pub pods: BTreeMap<u32, Pod>,
    pub pvcs: BTreeMap<u32, PersistentVolumeClaim>,
    pub pki: Option<Pki>,
    pub etcd_config: EtcdConfig,
    /// Advertised client URLs of the member pods (the dialer maps them).
    pub endpoints: Vec<String>,
    /// The cluster's pooled etcd client, when etcd answered.
    pub etcd: Option<ClusterClient>,
    pub health: Option<ClusterHealth>,
    /// The workload API server URL (what the dialer needs).
    pub server: String,
    /// Cluster key and input fingerprint, to remember this observation by
    /// if the cluster turns out converged (see [`super::memo`]).
    pub memo_key: (String, u64),
}

impl Observed {
    pub fn names(&self) -> &Names {
        &self.planner.names
    }
}

fn workload_err(server: &str) -> impl Fn(kube::Error) -> Error + '_ {
    move |source| Error::WorkloadApi {
        server: server.to_string(),
        source,
    }
}

fn secret_str(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// Reads the management-side PKI Secret.
pub async fn read_pki(
    management: &kube::Client,
    cluster: &EtcdCluster,
    names: &Names,
) -> Result<Option<Pki>> {
    let api: Api<Secret> =
        Api::namespaced(management.clone(), &cluster.namespace().unwrap_or_default());
    let Some(secret) = api
        .get_opt(&names.pki_secret())
        .await
        .map_err(Error::ManagementApi)?
    else {
        return Ok(None);
    };
    let (Some(cert), Some(key), Some(client_cert), Some(client_key)) = (
        secret_str(&secret, PKI_CA_CERT),
        secret_str(&secret, PKI_CA_KEY),
        secret_str(&secret, PKI_CLIENT_CERT),
        secret_str(&secret, PKI_CLIENT_KEY),
    ) else {
        return Err(Error::Invalid(format!(
            "Secret {} lacks one of {PKI_CA_CERT}, {PKI_CA_KEY}, {PKI_CLIENT_CERT}, {PKI_CLIENT_KEY}",
            names.pki_secret()
        )));
    };
    Ok(Some(Pki {
        ca: std::sync::Arc::new(CertificateAuthority::from_pem(&cert, &key)?),
        client_cert_pem: client_cert,
        client_key_pem: client_key,
    }))
}

fn hash_matches(meta: &kube::api::ObjectMeta, want: &str) -> bool {
    render::carried_hash(meta) == Some(want)
}

/// Records `obj` as a conflict unless its owner label names this cluster.
/// Read before every write: an object at our name that another EtcdCluster
/// (or nobody) holds is never overwritten, adopted or deleted.
fn check_owner<K: Resource<DynamicType = ()>>(
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

/// Observes one cluster.
pub async fn observe(
    cluster: &EtcdCluster,
    resolved: &Resolved,
    workload: &WorkloadCluster,
    ctx: &Context,
    report: &Report,
) -> Result<Observed> {
    let inputs: &RenderInputs = &resolved.inputs;
    let names = inputs.names();
    let ns = &inputs.workload_namespace;
    let client = workload.client.clone();
    let err = workload_err(&workload.server);
    let mut stale = Vec::new();
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let fingerprint = super::memo::fingerprint(inputs, &workload.server);
    let recalled = ctx
        .memo
        .recall(&key, fingerprint, ctx.settings.reread_after);
    let mut conflicts = Vec::new();
    let owner = inputs.owner_label();

    let pki = match &recalled {
        Some(r) => r.pki.clone(),
        None if inputs.tls => read_pki(&ctx.management, cluster, &names).await?,
        None => None,
    };
    let renew_before = ctx.settings.cert_renew_before;
    let fresh_cert = |pem: Option<&str>| {
        pem.is_some_and(|pem| remaining_validity(pem).is_ok_and(|left| left > renew_before))
    };
    if inputs.tls
        && !pki
            .as_ref()
            .is_some_and(|p| fresh_cert(Some(&p.client_cert_pem)))
    {
        stale.push(ObjectKind::Pki);
    }

    // Present, owned and matching at the last converged reconcile: not
    // re-read within `reread_after` (see `memo`).
    let mut tls_secret_ca_present = false;
    if recalled.is_none() {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(ns).await.map_err(&err)?.is_none() {
            stale.push(ObjectKind::Namespace);
        }
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        if inputs.tls {
            for (kind, name) in [
                (ObjectKind::ServerTlsSecret, names.server_tls_secret()),
                (ObjectKind::PeerTlsSecret, names.peer_tls_secret()),
            ] {
                let fresh = match secrets.get_opt(&name).await.map_err(&err)? {
                    Some(s) if !check_owner(&s, ns, &owner, &mut conflicts) => true,
                    Some(s) => {
                        tls_secret_ca_present |= secret_str(&s, "ca.crt").is_some();
                        hash_matches(&s.metadata, &inputs.identity_hash(&format!("{kind:?}")))
                            && pki.as_ref().is_some_and(|p| {
                                secret_str(&s, "ca.crt").as_deref() == Some(p.ca.cert_pem())
                            })
                            && fresh_cert(secret_str(&s, "tls.crt").as_deref())
                    }
                    None => false,
                };
                if !fresh {
                    stale.push(kind);
                }
            }
        }
        for (kind, name) in [
            (ObjectKind::PeerService, names.peer_service()),
            (ObjectKind::ClientService, names.client_service()),
        ] {
            match services.get_opt(&name).await.map_err(&err)? {
                Some(s) if !check_owner(&s, ns, &owner, &mut conflicts) => {}
                Some(s)
                    if hash_matches(&s.metadata, &inputs.identity_hash(&format!("{kind:?}"))) => {}
                _ => stale.push(kind),
            }
        }
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
        match pdbs.get_opt(&names.pdb()).await.map_err(&err)? {
            Some(p) if !check_owner(&p, ns, &owner, &mut conflicts) => {}
            Some(p) if hash_matches(&p.metadata, &inputs.identity_hash("PodDisruptionBudget")) => {}
            _ => stale.push(ObjectKind::PodDisruptionBudget),
        }
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        match configmaps
            .get_opt(&names.members_configmap())
            .await
            .map_err(&err)?
        {
            None => stale.push(ObjectKind::MembersConfigMap),
            Some(cm) => {
                check_owner(&cm, ns, &owner, &mut conflicts);
            }
        }
    }
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let statefulset = statefulsets
        .get_opt(&names.statefulset())
        .await
        .map_err(&err)?;
    let mut storage_change = None;
    if let Some(sts) = &statefulset
        && check_owner(sts, ns, &owner, &mut conflicts)
        && let Some((class, size)) = render::statefulset_storage(sts)
    {
        let want = (
            inputs.storage_class.clone(),
            Some(inputs.storage_size.clone()),
        );
        if (class.clone(), size.clone()) != want {
            storage_change = Some(format!(
                "spec.storage asks for class {:?}, size {}, but the StatefulSet's volumes are class {:?}, size {}",
                inputs.storage_class,
                inputs.storage_size,
                class,
                size.unwrap_or_default()
            ));
        }
    }
    match &statefulset {
        None => stale.push(ObjectKind::StatefulSet),
        Some(sts) if !resolved.hold_statefulset() && render::drift(sts, inputs).is_some() => {
            stale.push(ObjectKind::StatefulSet)
        }
        Some(_) => {}
    }

    let selector = ListParams::default().labels(&render::selector_string(&names));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods: BTreeMap<u32, Pod> = pods
        .list(&selector)
        .await
        .map_err(&err)?
        .items
        .into_iter()
        .filter_map(|p| names.ordinal_of(&p.name_any()).map(|o| (o, p)))
        .collect();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvcs: BTreeMap<u32, PersistentVolumeClaim> = pvcs
        .list(&selector)
        .await
        .map_err(&err)?
        .items
        .into_iter()
        .filter_map(|p| {
            p.name_any()
                .strip_prefix("data-")
                .and_then(|pod| names.ordinal_of(pod))
                .map(|o| (o, p))
        })
        .collect();
    // Pods and PVCs at our names that another EtcdCluster holds (the
    // selector labels are the same for one name in two namespaces): never
    // restarted, deleted or reused. Unlabelled pods and unrecorded PVCs are
    // this cluster's StatefulSet's (older releases did not mark them).
    for (kind, name, theirs) in pods
        .values()
        .map(|p| {
            (
                "Pod",
                p.name_any(),
                render::owner_of(p.meta()).map(str::to_string),
            )
        })
        .chain(pvcs.values().map(|p| {
            (
                "PersistentVolumeClaim",
                p.name_any(),
                p.annotations().get(PVC_OWNER_ANNOTATION).cloned(),
            )
        }))
    {
        if let Some(theirs) = theirs
            && theirs != owner
        {
            conflicts.push(ForeignObject {
                object: format!("{kind}/{ns}/{name}"),
                owner: Some(theirs),
            });
        }
    }

    // etcd
    let etcd_config = EtcdConfig {
        tls: pki.as_ref().map(|p| TlsMaterial {
            ca_pem: p.ca.cert_pem().to_string(),
            client_cert_pem: Some(p.client_cert_pem.clone()),
            client_key_pem: Some(p.client_key_pem.clone()),
            server_name: Some(names.client_service_host()),
        }),
        deadlines: ctx.settings.etcd_deadlines,
        transport: Some(crate::dialer::transport(ctx.dialer.clone(), workload)),
    };
    let sts_replicas = statefulset
        .as_ref()
        .and_then(|s| s.spec.as_ref()?.replicas)
        .unwrap_or(0)
        .max(0) as u32;
    let ordinals: BTreeSet<u32> = pods.keys().copied().chain(0..sts_replicas).collect();
    let endpoints: Vec<String> = ordinals
        .iter()
        .map(|o| names.client_url(*o, inputs.tls))
        .collect();
    let pool_key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let (etcd, health, etcd_client) = if inputs.tls && pki.is_none() {
        (
            EtcdObservation::Unreachable("certificates are being issued".into()),
            None,
            None,
        )
    } else if endpoints.is_empty() {
        (
            EtcdObservation::Unreachable("no member pods".into()),
            None,
            None,
        )
    } else {
        match observe_etcd(&pool_key, &endpoints, &etcd_config, &names, inputs.tls, ctx).await {
            Ok((h, c)) => (EtcdObservation::Observed(h.clone()), Some(h), Some(c)),
            Err(e) => {
                // Start from fresh connections next time: a broken tunnel
                // or a replaced pod may be why etcd did not answer.
                ctx.etcd_clients.evict(&pool_key);
                (EtcdObservation::Unreachable(e), None, None)
            }
        }
    };

    // Alarms, asked of the cluster only when it answers at all.
    let alarms = match &etcd_client {
        Some(c) => c.alarms().await.unwrap_or_default(),
        None => Vec::new(),
    };
    let failed_members = match &health {
        Some(h) => report.failed_members(h, ctx.settings.member_failure_grace),
        None => BTreeSet::new(),
    };
    let failed_long_ago = match &health {
        Some(h) => report.failed_members(
            h,
            ctx.settings.member_failure_grace * super::plan::READY_POD_GRACE_FACTOR,
        ),
        None => BTreeSet::new(),
    };

    // The management-side CA is gone but the workload still trusts one: a
    // lost Secret, not a new cluster (which has neither).
    let old_status = cluster.status.clone().unwrap_or_default();
    let pki_lost =
        inputs.tls && pki.is_none() && (tls_secret_ca_present || !old_status.members.is_empty());
    let last_failure = old_status.last_operation.as_ref().and_then(|op| {
        (op.outcome == "Failed").then(|| FailedStep {
            kind: op.type_.clone(),
            failures: op.failures.unwrap_or(1).max(1) as u32,
            age: op
                .time
                .as_ref()
                .and_then(|t| {
                    Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(t.0)).ok()
                })
                .unwrap_or(Duration::MAX),
            message: op.message.clone().unwrap_or_default(),
        })
    });
    let planner = Observation {
        names: names.clone(),
        tls: inputs.tls,
        desired_replicas: resolved.resolution.spec.replicas.max(1) as u32,
        stale_objects: stale,
        statefulset: statefulset.as_ref().map(|s| StatefulSetObservation {
            replicas: sts_replicas,
            image: render::statefulset_image(s).unwrap_or_default().to_string(),
            template_hash: render::statefulset_template_hash(s).map(str::to_string),
        }),
        pods: pods.iter().map(|(o, p)| (*o, pod_observation(p))).collect(),
        pvcs: pvcs
            .iter()
            .map(|(o, p)| {
                (
                    *o,
                    PvcObservation {
                        member_id: p
                            .annotations()
                            .get(PVC_MEMBER_ANNOTATION)
                            .and_then(|s| u64::from_str_radix(s, 16).ok()),
                        owner_recorded: p.annotations().get(PVC_OWNER_ANNOTATION) == Some(&owner),
                        etcd_version: p.annotations().get(PVC_VERSION_ANNOTATION).cloned(),
                    },
                )
            })
            .collect(),
        etcd,
        failed_members,
        failed_long_ago,
        alarms,
        conflicts,
        pki_lost,
        storage_change,
        requested_version: Some(inputs.version.clone()),
        downgrade_acknowledged: cluster
            .annotations()
            .get(etcdfleet_api::version::DOWNGRADE_ANNOTATION)
            .cloned(),
        version: super::version_change::observe(
            cluster,
            resolved.version_change.as_ref(),
            &pods.values().collect::<Vec<_>>(),
        ),
        known_voters: old_status.members.iter().filter(|m| !m.learner).count() as u32,
        last_failure,
        // Filled by `crate::restore::gate` when the cluster restores.
        restore: Default::default(),
    };
    Ok(Observed {
        planner,
        statefulset,
        pods,
        pvcs,
        pki,
        etcd_config,
        endpoints,
        etcd: etcd_client,
        health,
        server: workload.server.clone(),
        memo_key: (key, fingerprint),
    })
}

fn pod_observation(pod: &Pod) -> PodObservation {
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    PodObservation {
        image: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
        template_hash: pod.annotations().get(render::TEMPLATE_HASH).cloned(),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        ready: container.is_some_and(|c| c.ready),
        restart_count: container.map_or(0, |c| c.restart_count),
        deleting: pod.meta().deletion_timestamp.is_some(),
        ready_means_etcd_healthy: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.readiness_probe.as_ref())
            .and_then(|p| p.http_get.as_ref())
            .is_some_and(|g| g.path.as_deref().is_some_and(|p| p.starts_with("/health"))),
    }
}

/// Member list through any pod, then status and health of every member
/// through its own client URL, concurrently, all over the cluster's pooled
/// connections.
async fn observe_etcd(
    pool_key: &str,
    endpoints: &[String],
    config: &EtcdConfig,
    names: &Names,
    tls: bool,
    ctx: &Context,
) -> std::result::Result<(ClusterHealth, ClusterClient), String> {
    let client = ctx
        .etcd_clients
        .get(pool_key, endpoints, config)
        .await
        .map_err(|e| e.to_string())?;
    let client_ref = &client;
    // A fresh (linearizable) member list from whichever member answers first,
    // over the cluster's pooled connections.
    let attempts = endpoints.iter().map(|ep| {
        Box::pin(async move {
            let member = client_ref.member(ep).await.map_err(|e| e.to_string())?;
            tokio::time::timeout(
                config.deadlines.request + Duration::from_secs(1),
                member.fresh_members(),
            )
            .await
            .map_err(|_| format!("{ep}: member list timed out"))?
            .map_err(|e| e.to_string())
        })
    });
    let (_answered_by, members) = futures::future::select_ok(attempts)
        .await
        .map(|(ok, _)| ok)?;
    let observations = futures::future::join_all(members.into_iter().map(|member| async move {
        let advertised = member.client_urls.first().cloned().or_else(|| {
            member
                .peer_urls
                .first()
                .and_then(|u| names.ordinal_of_peer_url(u))
                .map(|o| names.client_url(o, tls))
        });
        match advertised {
            Some(url) if member.is_started() => {
                observe_through(member, client_ref.member(&url).await).await
            }
            Some(_) => {
                crate::etcd::MemberObservation::unreachable(member, "member has not started")
            }
            None => crate::etcd::MemberObservation::unreachable(member, "member has no known URL"),
        }
    }))
    .await;
    Ok((ClusterHealth::new(observations), client))
}
