//! The etcd reader: the members and their health, asked over the cluster's
//! pooled connections through the dialer, and the alarms etcd raised.

use etcdfleet_api::EtcdCluster;
use kube::ResourceExt;

use super::super::context::Context;
use super::super::plan::observation::EtcdObservation;
use super::adopt::AdoptionReading;
use super::objects::Workload;
use crate::access::{Pki, member_endpoints, observe_members};
use crate::etcd::{Alarm, ClusterClient, ClusterHealth, EtcdConfig};

/// What etcd said.
pub struct EtcdReading {
    pub etcd: EtcdObservation,
    pub health: Option<ClusterHealth>,
    /// The cluster's pooled etcd client, when etcd answered.
    pub client: Option<ClusterClient>,
    pub alarms: Vec<Alarm>,
    pub config: EtcdConfig,
    /// Advertised client URLs of the member pods (the dialer maps them).
    pub endpoints: Vec<String>,
}

/// Asks the members at every ordinal with a pod or in the StatefulSet,
/// and, while the cluster adopts a running etcd, the existing members too
/// (with the TLS the takeover uses, see [`AdoptionReading`]).
pub async fn read(
    cluster: &EtcdCluster,
    w: &Workload<'_>,
    pki: Option<&Pki>,
    (pod_ordinals, statefulset_replicas): (impl Iterator<Item = u32>, u32),
    adoption: Option<&AdoptionReading>,
    ctx: &Context,
) -> EtcdReading {
    let (inputs, names) = (w.inputs, &w.names);
    let mut config = ctx.etcd_config(pki, names, ctx.settings.etcd_deadlines, w.cluster);
    let mut endpoints = member_endpoints(names, inputs.tls, pod_ordinals, statefulset_replicas);
    if let Some(adopting) = adoption {
        endpoints.extend(adopting.endpoints.iter().cloned());
        endpoints.dedup();
        config.tls = adopting.tls.clone();
    }
    let pool_key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let (etcd, health, client) = if inputs.tls && config.tls.is_none() {
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
        let asked = observe_members(
            &pool_key,
            &endpoints,
            &config,
            names,
            inputs.tls,
            &ctx.etcd_clients,
        );
        match asked.await {
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
    let alarms = match &client {
        Some(c) => c.alarms().await.unwrap_or_default(),
        None => Vec::new(),
    };
    EtcdReading {
        etcd,
        health,
        client,
        alarms,
        config,
        endpoints,
    }
}
