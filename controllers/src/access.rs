//! How the reconcilers reach what they manage, shared below them: the
//! management API, the workload clusters (the connector), their etcd members
//! (the dialer and the pooled etcd clients), the event recorder and metrics
//! every reconciler reports to, and which clusters this controller owns.
//! Also one cluster's etcd as every reconciler reaches it: its PKI Secret
//! (the CA and the controller's client identity), the etcd configuration
//! built from it, the members' client URLs, and the members' health read
//! over the pooled connections. Reads only; knows no reconciler.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use tracing::warn;

use crate::connector::{WorkloadCluster, WorkloadClusterConnector};
use crate::dialer::EtcdDialer;
use crate::etcd::{
    ClientPool, ClusterClient, ClusterHealth, Deadlines, EtcdConfig, TlsMaterial, observe_through,
};
use crate::metrics::Metrics;
use crate::pki::{CertificateAuthority, PkiError};
use crate::render::{self, Names};
use crate::shard::assign::cluster_key;
use crate::shard::gate::{Gate, Pass};

/// Work on a cluster may not start: it is moving to another shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateClosed;

/// How soon a reconcile refused by a closed gate looks again (the gate
/// reopens within a shard round when the cluster stays or comes back).
pub const GATE_RETRY: Duration = Duration::from_secs(2);

/// Decides whether this controller owns an EtcdCluster (see
/// `crate::config::ControllerConfig::owns`).
pub type OwnerFilter = Arc<dyn Fn(&EtcdCluster) -> bool + Send + Sync>;

/// The access shared by the reconcilers above the cluster reconciler
/// (backups, rollouts): the cluster reconciler's context is one.
pub type SharedAccess = Arc<dyn AsRef<Access> + Send + Sync>;

/// What every reconciler reaches the clusters through, shared by all reconciles.
pub struct Access {
    pub management: Client,
    pub connector: WorkloadClusterConnector,
    pub dialer: Arc<dyn EtcdDialer>,
    /// etcd clients kept between reconciles, one per cluster.
    pub etcd_clients: ClientPool,
    /// Deadlines of etcd calls.
    pub etcd_deadlines: Deadlines,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// Clusters this controller may touch; `None` owns all. The watch is
    /// filtered too; this is the defence in depth.
    pub owner_filter: Option<OwnerFilter>,
    /// Sharded mode: the clusters of this controller's scope whichever
    /// shard reconciles them (what the rollout controller plans over);
    /// `None`: those [`Self::owns`] takes.
    pub scope_filter: Option<OwnerFilter>,
    /// Sharded mode: the gate every reconcile about a cluster passes (work
    /// on a cluster stops before it moves to another shard); `None`
    /// unsharded.
    pub shard_gate: Option<Arc<Gate>>,
    /// The process's shutdown request: a reconcile that has not acted yet
    /// ends when it comes (never requested outside `etcdfleet run`).
    pub shutdown: crate::shutdown::Shutdown,
    /// What tenants' destinations may use beyond what they name (see
    /// [`crate::tenancy`]); the default lends nothing.
    pub fence: Arc<crate::tenancy::Fence>,
    /// Each namespace's share of the reconcile slots (all-namespaces mode;
    /// unbounded otherwise, see [`crate::slots`]).
    pub shares: Arc<crate::slots::Shares>,
}

impl Access {
    pub fn new(
        management: Client,
        connector: WorkloadClusterConnector,
        dialer: Arc<dyn EtcdDialer>,
        etcd_deadlines: Deadlines,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(
            management.clone(),
            Reporter {
                controller: "etcdfleet-controller".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Access {
            management,
            connector,
            dialer,
            etcd_clients: ClientPool::default(),
            etcd_deadlines,
            metrics,
            recorder,
            owner_filter: None,
            scope_filter: None,
            shard_gate: None,
            shutdown: Default::default(),
            fence: Default::default(),
            shares: Default::default(),
        }
    }

    /// Whether this controller may touch `cluster` (see [`OwnerFilter`]).
    pub fn owns(&self, cluster: &EtcdCluster) -> bool {
        self.owner_filter.as_ref().is_none_or(|owns| owns(cluster))
    }

    /// Whether `cluster` is in this controller's scope, whichever shard
    /// reconciles it (see [`Self::scope_filter`]).
    pub fn in_scope(&self, cluster: &EtcdCluster) -> bool {
        match &self.scope_filter {
            Some(in_scope) => in_scope(cluster),
            None => self.owns(cluster),
        }
    }

    /// Work on cluster `cluster` of `namespace` may start: a pass to hold until
    /// it ends (none unsharded), or `Err` while the cluster is moving to
    /// another shard.
    pub fn enter(&self, namespace: &str, cluster: &str) -> Result<Option<Pass>, GateClosed> {
        match &self.shard_gate {
            None => Ok(None),
            Some(gate) => gate
                .enter(&cluster_key(namespace, cluster))
                .map(Some)
                .ok_or(GateClosed),
        }
    }

    /// Whether this replica shares the fleet with others (sharded mode).
    pub fn sharded(&self) -> bool {
        self.shard_gate.is_some()
    }

    /// Publishes an event about a cluster; a failure to publish is logged,
    /// never fatal.
    pub async fn publish(&self, cluster: &EtcdCluster, type_: EventType, reason: &str, note: &str) {
        self.publish_about(&cluster.object_ref(&()), type_, reason, note)
            .await
    }

    /// Publishes an event about any object (a cluster-scoped one's event
    /// goes to the `default` namespace); a failure to publish is logged.
    pub async fn publish_about(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(etcdfleet_api::conditions::bounded(
                note.to_string(),
                etcdfleet_api::conditions::EVENT_NOTE_LIMIT,
            )),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            warn!(error = %e, "failed to publish event");
        }
    }

    /// The etcd configuration of one cluster: its TLS material (verified
    /// against the client Service name), these deadlines, and the dialer's
    /// transport into `workload`.
    pub fn etcd_config(
        &self,
        pki: Option<&Pki>,
        names: &Names,
        deadlines: Deadlines,
        workload: &WorkloadCluster,
    ) -> EtcdConfig {
        EtcdConfig {
            tls: pki.map(|p| TlsMaterial {
                ca_pem: p.trust_bundle(),
                client_cert_pem: Some(p.client_cert_pem.clone()),
                client_key_pem: Some(p.client_key_pem.clone()),
                server_name: Some(names.client_service_host()),
            }),
            deadlines,
            transport: Some(crate::dialer::transport(self.dialer.clone(), workload)),
        }
    }
}

/// Failures of reaching a cluster, each with the reconcilers' short reason.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("management API: {0}")]
    ManagementApi(#[source] kube::Error),
    #[error("workload API of {server}: {source}")]
    WorkloadApi {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("certificates: {0}")]
    Pki(#[from] PkiError),
    #[error("{0}")]
    Invalid(String),
}

impl AccessError {
    pub fn reason(&self) -> &'static str {
        match self {
            AccessError::ManagementApi(_) => "ManagementAPIError",
            AccessError::WorkloadApi { .. } => "WorkloadAPIError",
            AccessError::Pki(e) => e.reason(),
            AccessError::Invalid(_) => "InvalidObject",
        }
    }
}

/// Keys of the management-side PKI Secret.
pub const PKI_CA_CERT: &str = "ca.crt";
pub const PKI_CA_KEY: &str = "ca.key";
pub const PKI_CLIENT_CERT: &str = "client.crt";
pub const PKI_CLIENT_KEY: &str = "client.key";
/// The CA a rotation introduces, kept beside the current one until it
/// takes over (see `etcdfleet_api::ca_rotation`).
pub const PKI_NEXT_CA_CERT: &str = "ca-next.crt";
pub const PKI_NEXT_CA_KEY: &str = "ca-next.key";
/// The CA a rotation replaced, still trusted until the rotation completes.
pub const PKI_PREVIOUS_CA_CERT: &str = "ca-previous.crt";

/// The CA and the controller's client identity of one etcd cluster.
#[derive(Clone)]
pub struct Pki {
    pub ca: std::sync::Arc<CertificateAuthority>,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// A rotation's new CA, before it takes over.
    pub next: Option<std::sync::Arc<CertificateAuthority>>,
    /// The CA a rotation replaced, until the rotation completes.
    pub previous_ca_pem: Option<String>,
}

impl Pki {
    /// Every CA members and the controller trust now, oldest first: the
    /// previous CA, the current one, the next one.
    /// Without a rotation in progress it is the CA's own PEM, unchanged.
    pub fn trust_bundle(&self) -> String {
        if self.next.is_none() && self.previous_ca_pem.is_none() {
            return self.ca.cert_pem().to_string();
        }
        let next = self.next.as_ref().map(|n| n.cert_pem());
        [
            self.previous_ca_pem.as_deref(),
            Some(self.ca.cert_pem()),
            next,
        ]
        .into_iter()
        .flatten()
        .map(|pem| format!("{}\n", pem.trim_end()))
        .collect()
    }
}

pub fn secret_str(secret: &Secret, key: &str) -> Option<String> {
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
) -> Result<Option<Pki>, AccessError> {
    let api: Api<Secret> =
        Api::namespaced(management.clone(), &cluster.namespace().unwrap_or_default());
    let Some(secret) = api
        .get_opt(&names.pki_secret())
        .await
        .map_err(AccessError::ManagementApi)?
    else {
        return Ok(None);
    };
    let lacks = || {
        AccessError::Invalid(format!(
            "Secret {} lacks one of {PKI_CA_CERT}, {PKI_CA_KEY}, {PKI_CLIENT_CERT}, {PKI_CLIENT_KEY}",
            names.pki_secret()
        ))
    };
    let (Some(cert), Some(client_cert), Some(client_key)) = (
        secret_str(&secret, PKI_CA_CERT),
        secret_str(&secret, PKI_CLIENT_CERT),
        secret_str(&secret, PKI_CLIENT_KEY),
    ) else {
        return Err(lacks());
    };
    let next = match (
        secret_str(&secret, PKI_NEXT_CA_CERT),
        secret_str(&secret, PKI_NEXT_CA_KEY),
    ) {
        (Some(cert), Some(key)) => Some(std::sync::Arc::new(CertificateAuthority::from_pem(
            &cert, &key,
        )?)),
        _ => None,
    };
    // Without its key only while a recovery rotates that CA away.
    let ca = match (secret_str(&secret, PKI_CA_KEY), &next) {
        (Some(key), _) => CertificateAuthority::from_pem(&cert, &key)?,
        (None, Some(_)) => CertificateAuthority::verify_only(&cert)?,
        (None, None) => return Err(lacks()),
    };
    Ok(Some(Pki {
        ca: std::sync::Arc::new(ca),
        client_cert_pem: client_cert,
        client_key_pem: client_key,
        next,
        previous_ca_pem: secret_str(&secret, PKI_PREVIOUS_CA_CERT),
    }))
}

/// The client URLs of a cluster's members: every ordinal with a pod, and
/// every ordinal the StatefulSet runs.
pub fn member_endpoints(
    names: &Names,
    tls: bool,
    pod_ordinals: impl Iterator<Item = u32>,
    statefulset_replicas: u32,
) -> Vec<String> {
    let ordinals: BTreeSet<u32> = pod_ordinals.chain(0..statefulset_replicas).collect();
    ordinals.iter().map(|o| names.client_url(*o, tls)).collect()
}

/// The replicas a StatefulSet asks for (0 when it says nothing).
pub fn statefulset_replicas(statefulset: Option<&StatefulSet>) -> u32 {
    statefulset
        .and_then(|s| s.spec.replicas)
        .unwrap_or(0)
        .max(0) as u32
}

/// The member pods of a cluster, by ordinal.
pub async fn member_pods(
    workload: &WorkloadCluster,
    names: &Names,
) -> Result<BTreeMap<u32, Pod>, AccessError> {
    let selector = ListParams::default().labels(&render::selector_string(names));
    let pods: Api<Pod> = Api::namespaced(workload.client.clone(), &names.namespace);
    Ok(pods
        .list(&selector)
        .await
        .map_err(|source| workload_error(workload, source))?
        .items
        .into_iter()
        .filter_map(|p| names.ordinal_of(&p.name_any()).map(|o| (o, p)))
        .collect())
}

/// A workload API failure, naming the server.
pub fn workload_error(workload: &WorkloadCluster, source: kube::Error) -> AccessError {
    AccessError::WorkloadApi {
        server: workload.server.clone(),
        source,
    }
}

/// One cluster's etcd as a reader of it (a backup) reaches it: the members'
/// health and the configuration that reaches each member.
pub struct ReachedEtcd {
    pub health: ClusterHealth,
    pub config: EtcdConfig,
}

/// Reaches the etcd of `cluster`, whose members run in `names.namespace` of
/// `workload`: the PKI from the management Secret (when `tls`), the members'
/// client URLs from the StatefulSet and its pods, then the members' health
/// over the cluster's pooled connections. `Ok(Err(why))`: etcd did not answer.
pub async fn reach_etcd(
    access: &Access,
    cluster: &EtcdCluster,
    workload: &WorkloadCluster,
    names: &Names,
    tls: bool,
) -> Result<Result<ReachedEtcd, String>, AccessError> {
    let pki = match tls {
        true => read_pki(&access.management, cluster, names).await?,
        false => None,
    };
    if tls && pki.is_none() {
        return Ok(Err("certificates are being issued".into()));
    }
    let statefulsets: Api<StatefulSet> = Api::namespaced(workload.client.clone(), &names.namespace);
    let statefulset = statefulsets
        .get_opt(&names.statefulset())
        .await
        .map_err(|source| workload_error(workload, source))?;
    let pods = member_pods(workload, names).await?;
    let endpoints = member_endpoints(
        names,
        tls,
        pods.keys().copied(),
        statefulset_replicas(statefulset.as_ref()),
    );
    if endpoints.is_empty() {
        return Ok(Err("no member pods".into()));
    }
    let config = access.etcd_config(pki.as_ref(), names, access.etcd_deadlines, workload);
    let pool_key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    match observe_members(
        &pool_key,
        &endpoints,
        &config,
        names,
        tls,
        &access.etcd_clients,
    )
    .await
    {
        Ok((health, _)) => Ok(Ok(ReachedEtcd { health, config })),
        Err(e) => {
            // Start from fresh connections next time.
            access.etcd_clients.evict(&pool_key);
            Ok(Err(e))
        }
    }
}

/// Member list through any pod, then status and health of every member
/// through its own client URL, concurrently, all over the cluster's pooled
/// connections.
pub async fn observe_members(
    pool_key: &str,
    endpoints: &[String],
    config: &EtcdConfig,
    names: &Names,
    tls: bool,
    pool: &ClientPool,
) -> Result<(ClusterHealth, ClusterClient), String> {
    let client = pool
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
