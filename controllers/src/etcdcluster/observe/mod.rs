//! Observe stage: a few readers, one per source, each with its own output,
//! and the planner's observation assembled from them ([`assemble`], the
//! one assembler `etcdfleet plan` uses too). Read only: nothing here writes
//! to any API or to etcd.
//!
//! - [`pki`]: the management-side CA and client identity ([`pki::PkiReading`]);
//! - [`objects`]: the workload objects against the render contract
//!   ([`objects::StaticObjects`], [`objects::StatefulSetReading`]);
//! - [`volumes`]: the member pods and volumes ([`volumes::PodsAndVolumes`]);
//! - [`etcd`]: the members, their health and alarms ([`etcd::EtcdReading`]);
//! - [`version`]: what the version rules read (the accepted change of minor,
//!   the backup destination and its snapshot, the v2 store in the pods);
//! - [`adopt`]: a running etcd being taken over ([`adopt::AdoptionReading`]);
//! - [`ca_rotation`]: a rotation of the CA asked for or under way;
//! - [`history`]: what the stored status remembers (failure grace, the last
//!   step), judged on a live read of the EtcdCluster when a member is down;
//! - [`restore`]: the snapshot of a cluster that restores, before its first
//!   write;
//! - [`recovery`]: what a recovery from a lost quorum decides from (the
//!   workload's Nodes only when one could start).

pub mod adopt;
pub mod assemble;
pub mod ca_rotation;
pub mod etcd;
pub mod history;
pub mod objects;
pub mod pki;
pub mod recovery;
pub mod restore;
pub mod spare_nodes;
pub mod storage;
pub mod version;
pub mod volumes;

use std::collections::BTreeMap;

use etcdfleet_api::restore::RestoreRecord;
use etcdfleet_api::{EtcdCluster, EtcdClusterStatus};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;

pub use crate::access::{PKI_CA_CERT, PKI_CA_KEY, PKI_CLIENT_CERT, PKI_CLIENT_KEY, Pki, read_pki};
pub use volumes::{PVC_MEMBER_ANNOTATION, PVC_OWNER_ANNOTATION, PVC_VERSION_ANNOTATION};

use super::context::{Context, Error, Result, cluster_key};
use super::plan::adopt::{AdoptionState, adoption_state};
use super::plan::observation::{Observation, StatefulSetObservation};
use super::plan::step::ObjectKind;
use super::resolved::Resolved;
use crate::access::statefulset_replicas;
use crate::connector::WorkloadCluster;
use crate::etcd::{ClusterClient, ClusterHealth, EtcdConfig};
use crate::render::{self, Names};
use assemble::{ObjectsReading, Readings};
use history::History;
use objects::{StatefulSetReading, StaticObjects, Workload};

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
    /// The objects the memo covers were not read (a converged cluster's
    /// poll): their presence and owner are what the last converged
    /// reconcile saw. Nothing may be written on such an observation.
    pub trusted_memo: bool,
    /// A restoring cluster's snapshot, verified this reconcile: what its
    /// seeder is rendered from.
    pub restore_record: Option<RestoreRecord>,
}

impl Observed {
    /// Closes the pooled connections to the members whose pod is going or
    /// not yet up (deleting, gone, not running or not ready). etcd's
    /// graceful shutdown waits about a second for a connected client to
    /// leave: a connection that a poll opened to a member whose pod was just
    /// deleted (its process not yet signalled), if kept, would hold its
    /// restart back by that much. Such members are reached on a fresh
    /// connection at each poll until their pod is up.
    pub async fn let_go_of_members_in_transition(&self, tls: bool) {
        let Some(etcd) = &self.etcd else { return };
        let replicas = crate::access::statefulset_replicas(self.statefulset.as_ref());
        let pods = &self.planner.pods;
        let ordinals: std::collections::BTreeSet<u32> =
            pods.keys().copied().chain(0..replicas).collect();
        for ordinal in ordinals {
            let up = pods
                .get(&ordinal)
                .is_some_and(|p| p.running && p.ready && !p.deleting);
            if up {
                continue;
            }
            let url = self.names().client_url(ordinal, tls);
            if let Err(e) = etcd.disconnect(&url).await {
                tracing::debug!(error = %e, member = %url, "could not close the connection to a member in transition");
            }
        }
    }

    pub fn names(&self) -> &Names {
        &self.planner.names
    }
}

/// Observes one cluster: each reader in turn, then the planner's view.
pub async fn observe(
    cluster: &EtcdCluster,
    resolved: &Resolved,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> Result<Observed> {
    let inputs = &resolved.inputs;
    let key = cluster_key(cluster);
    let fingerprint = super::memo::fingerprint(inputs, &workload.server);
    let recalled = ctx
        .memo
        .recall(&key, fingerprint, ctx.settings.reread_after);
    let trusted_memo = recalled.is_some();
    let w = Workload::new(workload, inputs);

    let pki = pki::read(cluster, inputs, recalled.as_ref(), ctx).await?;
    // Present, owned and matching at the last converged reconcile: not
    // re-read within `reread_after` (see `memo`).
    let objects = match recalled {
        Some(_) => StaticObjects::default(),
        None => objects::read_static(&w, &pki).await?,
    };
    let statefulset = objects::read_statefulset(&w, resolved).await?;
    let members = volumes::read(&w).await?;
    let sts_replicas = statefulset_replicas(statefulset.statefulset.as_ref());
    let mut adoption = adopt::read(cluster, &w, pki.pki.as_ref(), ctx).await?;
    if let Some(reading) = adoption.as_mut() {
        reading.observation.spec_version = resolved.resolution.spec.version.to_string();
    }
    let etcd = etcd::read(
        cluster,
        &w,
        pki.pki.as_ref(),
        (members.pods.keys().copied(), sts_replicas),
        adoption.as_ref(),
        ctx,
    )
    .await;
    let status = remembered(cluster, etcd.health.as_ref(), ctx).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let grace = ctx.settings.member_failure_grace;
    let history = History::of(&status, (etcd.health.as_ref(), &w.names), grace, now);
    let bootstrapped = statefulset.statefulset.is_some() || history.known_voters > 0;
    let restore = restore::read(cluster, &inputs.version, bootstrapped, &members.pvcs, ctx).await?;
    let members_reached = recovery::Members {
        names: &w.names,
        health: etcd.health.as_ref(),
        endpoints: &etcd.endpoints,
        config: &etcd.config,
        pvcs: &members.pvcs,
    };
    let policy = resolved.resolution.spec.recovery;
    // Boxed: the survivors' answers would grow every reconcile's future.
    let who = (cluster, key.as_str(), inputs.version.as_str());
    let read = recovery::read(who, policy, &status, members_reached, workload, ctx);
    let recovery = Box::pin(read).await;
    let sts = statefulset.statefulset.as_ref();
    let at = storage::Waits::of(now, &ctx.settings);
    let (mut claims, storage) = storage::read(workload, inputs, sts, &members.pvcs, at).await;

    let readings = Readings {
        names: w.names.clone(),
        tls: inputs.tls,
        desired_replicas: resolved.resolution.spec.replicas.max(1) as u32,
        objects: ObjectsReading {
            stale: stale_objects(&pki, &objects, &statefulset),
            conflicts: [
                objects.conflicts,
                statefulset.conflicts.clone(),
                members.conflicts.clone(),
            ]
            .concat(),
            tls_secret_ca_present: objects.tls_secret_ca_present,
            announces_members: objects.announces_members,
            pki_present: pki.pki.is_some(),
        },
        statefulset: (statefulset.statefulset.as_ref()).map(statefulset_observation),
        pods: (members.pods.iter())
            .map(|(o, p)| (*o, volumes::pod_observation(p, now)))
            .collect(),
        pvcs: (members.pvcs.iter())
            .map(|(o, p)| (*o, volumes::pvc_observation(p, &w.owner, claims.remove(o))))
            .collect(),
        etcd: etcd.etcd,
        alarms: etcd.alarms,
        storage,
        requested_version: Some(inputs.version.clone()),
        downgrade_acknowledged: cluster
            .annotations()
            .get(etcdfleet_api::version::DOWNGRADE_ANNOTATION)
            .cloned(),
        version: version::observe(
            cluster,
            resolved.version_change.as_ref(),
            &members.pods.values().collect::<Vec<_>>(),
        ),
        history,
        restore: restore.as_ref().map(|r| r.gate.clone()).unwrap_or_default(),
        ca_rotation: ca_rotation::read(cluster, pki.pki.as_ref(), ctx.settings.ca_rotate_before),
        recovery,
    };
    let planner = with_adoption(assemble::assemble(readings), adoption.as_mut(), &w, ctx).await;
    Ok(Observed {
        planner,
        statefulset: statefulset.statefulset,
        pods: members.pods,
        pvcs: members.pvcs,
        pki: pki.pki,
        etcd_config: etcd.config,
        endpoints: etcd.endpoints,
        etcd: etcd.client,
        health: etcd.health,
        server: workload.server.clone(),
        memo_key: (key, fingerprint),
        trusted_memo,
        restore_record: restore.and_then(|r| r.record),
    })
}

/// The StatefulSet as the planner sees it.
fn statefulset_observation(s: &StatefulSet) -> StatefulSetObservation {
    StatefulSetObservation {
        replicas: statefulset_replicas(Some(s)),
        image: render::statefulset_image(s).unwrap_or_default().to_string(),
        template_hash: render::statefulset_template_hash(s).map(str::to_string),
        forcing: s
            .spec
            .template
            .spec
            .as_ref()
            .and_then(crate::recovery::forced_by),
        template_seen: s.status.as_ref().and_then(|st| st.observed_generation)
            >= s.metadata.generation,
        deleting: s.metadata.deletion_timestamp.is_some(),
    }
}

/// The status whose memory the planner judges: the copy this reconcile
/// started from, or, while a member is down, a live read of the
/// EtcdCluster. A watch may deliver a copy late, and a failure grace
/// judged on a late copy could remove a member that failed a moment ago.
/// A cluster with every member healthy costs no read here.
async fn remembered(
    cluster: &EtcdCluster,
    health: Option<&ClusterHealth>,
    ctx: &Context,
) -> Result<EtcdClusterStatus> {
    let copy = cluster.status.clone().unwrap_or_default();
    if !health.is_some_and(|h| h.members().iter().any(|m| !m.healthy)) {
        return Ok(copy);
    }
    let api: kube::Api<EtcdCluster> = kube::Api::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let live = api
        .get(&cluster.name_any())
        .await
        .map_err(Error::ManagementApi)?;
    Ok(live.status.unwrap_or_default())
}

/// The adoption's observation, with the TLS probes of the existing members
/// before the first change, and their objects nothing uses any more once
/// the last one has left.
async fn with_adoption(
    mut planner: Observation,
    adoption: Option<&mut adopt::AdoptionReading>,
    w: &Workload<'_>,
    ctx: &Context,
) -> Observation {
    let Some(reading) = adoption else {
        return planner;
    };
    planner.adoption = Some(reading.observation.clone());
    match adoption_state(&planner) {
        Some(AdoptionState::Refused(_) | AdoptionState::Ready) => {
            reading.probe(&planner.etcd, &planner.names, w, ctx).await;
        }
        Some(AdoptionState::Completed) => reading.read_deletable(w).await,
        _ => return planner,
    }
    planner.adoption = Some(reading.observation.clone());
    planner
}

/// Workload objects missing or out of date, in the order they are written.
fn stale_objects(
    pki: &pki::PkiReading,
    objects: &StaticObjects,
    statefulset: &StatefulSetReading,
) -> Vec<ObjectKind> {
    let pki = pki.stale.then_some(ObjectKind::Pki);
    let sts = statefulset.stale.then_some(ObjectKind::StatefulSet);
    pki.into_iter()
        .chain(objects.stale.iter().copied())
        .chain(sts)
        .collect()
}
