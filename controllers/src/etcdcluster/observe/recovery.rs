//! What a recovery from a lost quorum reads (`super::super::plan::recovery`
//! decides): the policy and the record of the last recovery, the members
//! down for the policy's `lostAfter` (from the stored `unhealthySince`),
//! the highest revision seen while the cluster had its quorum, and the
//! workload cluster's Nodes — read only when a recovery could start (the
//! policy allows one, none is under way, and fewer than a quorum of the
//! voters are healthy), so a healthy cluster's poll costs no read here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcdfleet_api::EtcdClusterStatus;
use etcdfleet_api::recovery::{QuorumLossPolicy, ResolvedRecovery};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use super::super::context::{Answers, Context};
use super::super::plan::observation::RecoveryObservation;
use super::history::down_since;
use crate::connector::WorkloadCluster;
use crate::etcd::{ClusterHealth, EtcdConfig, MemberClient, MemberObservation};

/// Where the members are reached, and how.
pub struct Members<'a> {
    pub health: Option<&'a ClusterHealth>,
    /// Client URLs of the member pods.
    pub endpoints: &'a [String],
    pub config: &'a EtcdConfig,
}

/// The recovery's observation of one cluster (`key`: `namespace/name`).
pub async fn read(
    key: &str,
    policy: ResolvedRecovery,
    status: &EtcdClusterStatus,
    members: Members<'_>,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> RecoveryObservation {
    let health = members.health;
    let record = status.last_recovery.clone();
    let now = Timestamp::now();
    let could_start = policy.quorum_loss != QuorumLossPolicy::Manual
        && !record.as_ref().is_some_and(|r| r.in_progress())
        && health.is_none_or(|h| !h.has_quorum());
    let (nodes, local_view) = match could_start {
        true => (
            Some(read_nodes(workload).await),
            Some(local_view(key, members.endpoints, members.config, ctx).await),
        ),
        false => (None, None),
    };
    let down = health
        .or(local_view.as_ref().and_then(|v| v.as_ref().ok()))
        .map(|h| down_since(status, h, policy.lost_after, now))
        .unwrap_or_default();
    RecoveryObservation {
        policy,
        record,
        down_since: down,
        nodes,
        last_seen_revision: remember_revision(ctx, key, health),
        local_view,
    }
}

/// How long a member's last answer stands in for it while it does not
/// answer: a member without a quorum fails its liveness probe (etcd's
/// health needs a leader) and is restarted with a growing back-off, so it
/// answers only now and then.
pub const ANSWER_KEPT: Duration = Duration::from_secs(600);

/// The members as the member with the most applied entries lists them in
/// its own store, each with its `Status` if it answered now or within
/// [`ANSWER_KEPT`] (none is healthy: there is no quorum to be healthy
/// with). `Err` says why no member answers.
async fn local_view(
    key: &str,
    endpoints: &[String],
    config: &EtcdConfig,
    ctx: &Context,
) -> Result<ClusterHealth, String> {
    let asked = futures::future::join_all(endpoints.iter().map(|url| async move {
        let member = MemberClient::connect(url, config).await?;
        let status = member.status().await?;
        let (_, members) = member.local_members().await?;
        Ok::<_, crate::etcd::EtcdError>((status, members))
    }))
    .await;
    let now = Instant::now();
    let mut remembered = ctx.member_answers.lock().expect("answer memory");
    let kept = remembered.entry(key.to_string()).or_default();
    let mut errors = Vec::new();
    for (url, answer) in endpoints.iter().zip(asked) {
        match answer {
            Ok((status, members)) => {
                kept.insert(status.member_id, (status, members, now));
            }
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    kept.retain(|_, (_, _, at)| now.duration_since(*at) < ANSWER_KEPT);
    view_of(kept, now).ok_or_else(|| errors.join("; "))
}

/// The view of the member with the most applied entries (see [`local_view`]).
fn view_of(answers: &Answers, now: Instant) -> Option<ClusterHealth> {
    let (_, membership, _) = answers
        .values()
        .max_by_key(|(s, _, _)| (s.raft_applied_index, s.raft_term))?;
    let observations = membership
        .iter()
        .map(|m| {
            let answer = answers.get(&m.id);
            MemberObservation {
                member: m.clone(),
                healthy: false,
                error: Some(
                    match answer {
                        Some((_, _, at)) if *at == now => "answers, but the cluster has no quorum",
                        Some(_) => "answered lately, but the cluster has no quorum",
                        None => "does not answer",
                    }
                    .to_string(),
                ),
                status: answer.map(|(s, _, _)| s.clone()),
            }
        })
        .collect();
    Some(ClusterHealth::new(observations))
}

/// The workload cluster's Nodes, name → Ready.
async fn read_nodes(workload: &WorkloadCluster) -> Result<BTreeMap<String, bool>, String> {
    let nodes: Api<Node> = Api::all(workload.client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing Nodes: {e}"))?;
    Ok(list
        .items
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, node_ready(n))))
        .collect())
}

fn node_ready(node: &Node) -> bool {
    (node.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Keeps the highest revision a member reported while the cluster had its
/// quorum, and answers it.
fn remember_revision(ctx: &Context, key: &str, health: Option<&ClusterHealth>) -> Option<i64> {
    let mut seen = ctx.last_revisions.lock().expect("revision memory");
    if let Some(h) = health.filter(|h| h.has_quorum()) {
        let highest = (h.members().iter())
            .filter_map(|m| m.status.as_ref().map(|s| s.revision))
            .max();
        // No key allocated on a converged poll: only a first sight inserts.
        match (highest, seen.get_mut(key)) {
            (Some(r), Some(kept)) => *kept = (*kept).max(r),
            (Some(r), None) => {
                seen.insert(key.to_string(), r);
            }
            (None, _) => {}
        }
    }
    seen.get(key).copied()
}
