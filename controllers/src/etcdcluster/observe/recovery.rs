//! What a recovery from a lost quorum reads (`super::super::plan::recovery`
//! decides): the policy and the record of the last recovery, the members
//! down for the policy's `lostAfter` (from the stored `unhealthySince`),
//! the highest revision seen while the cluster had its quorum, and the
//! workload cluster's Nodes — read only when a recovery could start (the
//! policy allows one, none is under way, and fewer than a quorum of the
//! voters are healthy), so a healthy cluster's poll costs no read here.
//! Under `FromBackup`, when no member answers at all, the voters the status
//! lists and the newest backup that verifies (`crate::recovery::backup`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcdfleet_api::recovery::{QuorumLossPolicy, ResolvedRecovery};
use etcdfleet_api::{EtcdCluster, EtcdClusterStatus};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use super::super::context::{Answer, Answers, Context};
use super::super::plan::observation::RecoveryObservation;
use super::history::down_since;
use crate::connector::WorkloadCluster;
use crate::etcd::{ClusterHealth, EtcdConfig, MemberClient, MemberObservation};
use crate::recovery::backup;
use crate::render::Names;

/// Where the members are reached, and how.
pub struct Members<'a> {
    pub names: &'a Names,
    pub health: Option<&'a ClusterHealth>,
    /// Client URLs of the member pods.
    pub endpoints: &'a [String],
    pub config: &'a EtcdConfig,
    /// The member PVCs, by ordinal.
    pub pvcs: &'a BTreeMap<u32, PersistentVolumeClaim>,
}

/// The recovery's observation of one cluster (`key`: `namespace/name`).
pub async fn read(
    (cluster, key, version): (&EtcdCluster, &str, &str),
    policy: ResolvedRecovery,
    status: &EtcdClusterStatus,
    members: Members<'_>,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> RecoveryObservation {
    let health = members.health;
    let record = status.last_recovery.clone();
    let now = Timestamp::now();
    // A cluster that never listed a voter is bootstrapping: it has no
    // quorum to lose, and what its first member says then is no survivor's.
    let could_start = policy.quorum_loss != QuorumLossPolicy::Manual
        && !record.as_ref().is_some_and(|r| r.in_progress())
        && health.is_none_or(|h| !h.has_quorum())
        && !recorded_voters(status).is_empty();
    let (nodes, local_view, pinned) = match could_start {
        true => (
            Some(read_nodes(workload).await),
            Some(local_view(key, status, &members, ctx).await),
            Some(read_pinned(workload, members.pvcs).await),
        ),
        false => (None, None, None),
    };
    let view = health.or(local_view.as_ref().and_then(|v| v.as_ref().ok()));
    let none_answers = could_start && view.is_none();
    let backup = match none_answers && policy.quorum_loss == QuorumLossPolicy::FromBackup {
        true => Some(read_backup(cluster, key, version, ctx).await),
        false => None,
    };
    RecoveryObservation {
        policy,
        record,
        down_since: match view {
            Some(h) => down_since(status, h, policy.lost_after, now),
            None => recorded_down_since(status, policy.lost_after, now),
        },
        nodes,
        last_seen_revision: remember_revision(ctx, key, health),
        local_view,
        pinned,
        recorded_voters: match none_answers {
            true => recorded_voters(status),
            false => Vec::new(),
        },
        backup,
    }
}

/// The voters the status lists (name, id): when no member answers, the
/// membership as last seen.
pub fn recorded_voters(status: &EtcdClusterStatus) -> Vec<(String, u64)> {
    (status.members.iter())
        .filter(|m| !m.learner)
        .filter_map(|m| {
            let id = u64::from_str_radix(m.id.as_deref()?, 16).ok()?;
            Some((m.name.clone(), id))
        })
        .collect()
}

/// With no member answering, the recorded voters down for `lost_after`:
/// since their stored `unhealthySince`, or since no member has answered
/// while their pods failed etcd's health check too
/// (`status.noMemberAnswersSince`; never while the controller is only cut
/// off from Ready pods), whichever is older.
pub fn recorded_down_since(
    status: &EtcdClusterStatus,
    lost_after: Duration,
    now: Timestamp,
) -> BTreeMap<u64, Timestamp> {
    let Some(all_down) = status.no_member_answers_since.as_ref().map(|t| t.0) else {
        return BTreeMap::new();
    };
    (status.members.iter())
        .filter(|m| !m.learner)
        .filter_map(|m| {
            let id = u64::from_str_radix(m.id.as_deref()?, 16).ok()?;
            let unhealthy = m.unhealthy_since.as_ref().map(|t| t.0);
            let since = unhealthy.map_or(all_down, |u| u.min(all_down));
            let down = now.duration_since(since).as_secs_f64();
            (down >= lost_after.as_secs_f64()).then_some((id, since))
        })
        .collect()
}

/// The newest backup that verifies, its verdict remembered per backup (a
/// management API that fails is said as the reason: the recovery waits).
async fn read_backup(
    cluster: &EtcdCluster,
    key: &str,
    version: &str,
    ctx: &Context,
) -> Result<etcdfleet_api::recovery::RecoveryBackup, String> {
    let mut verdicts = (ctx.recovery.backup_verdicts.lock().expect("verdict memory"))
        .get(key)
        .cloned()
        .unwrap_or_default();
    let image = ctx.settings.seeder_image.as_str();
    let found = backup::newest_verified(
        (&ctx.management, &*ctx.fence),
        cluster,
        (version, image),
        &mut verdicts,
    )
    .await
    .map_err(|e| format!("the backups could not be read: {e}"))
    .and_then(|v| v);
    (ctx.recovery.backup_verdicts.lock().expect("verdict memory"))
        .insert(key.to_string(), verdicts);
    found
}

/// How long a member's last answer stands in for it while it does not
/// answer: a member without a quorum fails its liveness probe (etcd's
/// health needs a leader) and is restarted with a growing back-off, so it
/// answers only now and then.
pub const ANSWER_KEPT: Duration = Duration::from_secs(600);

/// The members as the member with the most applied entries lists them in
/// its own store, each with its `Status` if it answered now or within
/// [`ANSWER_KEPT`] (none is healthy: there is no quorum to be healthy
/// with). `Err` says why no member answers. Only members the status
/// records answer for the cluster (a stranger at a member's address, a
/// cluster of its own on an empty volume, is none of its members), and a
/// kept answer stands only while the claim it was read over is the one at
/// that ordinal (a member whose volume was lost and made again answers
/// for nothing it said before).
async fn local_view(
    key: &str,
    status: &EtcdClusterStatus,
    members: &Members<'_>,
    ctx: &Context,
) -> Result<ClusterHealth, String> {
    let asked = futures::future::join_all(members.endpoints.iter().map(|url| async move {
        let member = MemberClient::connect(url, members.config).await?;
        let status = member.status().await?;
        let (_, listed) = member.local_members().await?;
        Ok::<_, crate::etcd::EtcdError>((status, listed))
    }))
    .await;
    let now = Instant::now();
    let recorded: BTreeMap<u64, String> = (recorded_voters(status).into_iter())
        .map(|(name, id)| (id, name))
        .collect();
    let volumes: BTreeMap<u64, String> = (recorded.iter())
        .filter_map(|(id, name)| {
            let pvc = members.pvcs.get(&members.names.ordinal_of(name)?)?;
            Some((*id, pvc.metadata.uid.clone()?))
        })
        .collect();
    let answers = members.endpoints.iter().cloned().zip(asked);
    let mut remembered = ctx.recovery.member_answers.lock().expect("answer memory");
    let kept = remembered.entry(key.to_string()).or_default();
    let errors = remember(kept, answers, &volumes, now);
    view_of(kept, now).ok_or_else(|| errors.join("; "))
}

/// Keeps each answer of a member the status records (`volumes`: its id →
/// the UID of the claim at its ordinal now), then forgets every answer
/// older than [`ANSWER_KEPT`] or read over another claim than the one at
/// that member's ordinal now. Says why each member that did not count did
/// not.
fn remember(
    kept: &mut Answers,
    answers: impl Iterator<Item = (String, AnswerRead)>,
    volumes: &BTreeMap<u64, String>,
    now: Instant,
) -> Vec<String> {
    let mut errors = Vec::new();
    for (url, answer) in answers {
        match answer {
            Ok((s, _)) if !volumes.contains_key(&s.member_id) => errors.push(format!(
                "{url}: member {:x} answered, but it is none of the members the status \
                 records with a volume",
                s.member_id
            )),
            Ok((status, listed)) => {
                let volume = volumes.get(&status.member_id).cloned();
                let answer = Answer {
                    status,
                    members: listed,
                    at: now,
                    volume,
                };
                kept.insert(answer.status.member_id, answer);
            }
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    kept.retain(|id, a| {
        now.duration_since(a.at) < ANSWER_KEPT
            && a.volume.is_some()
            && a.volume.as_ref() == volumes.get(id)
    });
    errors
}

/// A member's answer to `status` and its own member list.
type AnswerRead =
    Result<(crate::etcd::MemberStatus, Vec<crate::etcd::Member>), crate::etcd::EtcdError>;

/// The view of the member with the most applied entries (see [`local_view`]).
fn view_of(answers: &Answers, now: Instant) -> Option<ClusterHealth> {
    let newest = answers
        .values()
        .max_by_key(|a| (a.status.raft_applied_index, a.status.raft_term))?;
    let observations = newest
        .members
        .iter()
        .map(|m| {
            let answer = answers.get(&m.id);
            MemberObservation {
                member: m.clone(),
                healthy: false,
                error: Some(
                    match answer {
                        Some(a) if a.at == now => "answers, but the cluster has no quorum",
                        Some(_) => "answered lately, but the cluster has no quorum",
                        None => "does not answer",
                    }
                    .to_string(),
                ),
                status: answer.map(|a| a.status.clone()),
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

/// The node each member PVC's volume is local to: its bound
/// PersistentVolume's required node affinity naming one node by
/// `kubernetes.io/hostname` (local PVs, host-path and local CSI drivers set
/// it; network volumes do not). An unbound claim has no entry.
async fn read_pinned(
    workload: &WorkloadCluster,
    pvcs: &BTreeMap<u32, PersistentVolumeClaim>,
) -> Result<BTreeMap<u32, Option<String>>, String> {
    let volumes: Api<PersistentVolume> = Api::all(workload.client.clone());
    let mut pinned = BTreeMap::new();
    for (ordinal, pvc) in pvcs {
        let Some(name) = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
            continue;
        };
        let pv = (volumes.get_opt(name).await)
            .map_err(|e| format!("reading PersistentVolume {name}: {e}"))?;
        pinned.insert(*ordinal, pv.as_ref().and_then(local_node));
    }
    Ok(pinned)
}

/// The one node a PersistentVolume is local to, if it is.
fn local_node(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let mut nodes = terms.iter().map(|t| {
        let expressions = t.match_expressions.as_deref().unwrap_or_default();
        let hostname = expressions
            .iter()
            .find(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")?;
        match hostname.values.as_deref() {
            Some([one]) => Some(one.clone()),
            _ => None,
        }
    });
    let first = nodes.next()??;
    nodes
        .all(|n| n.as_deref() == Some(first.as_str()))
        .then_some(first)
}

fn node_ready(node: &Node) -> bool {
    (node.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Keeps the highest revision a member reported while the cluster had its
/// quorum, and answers it.
fn remember_revision(ctx: &Context, key: &str, health: Option<&ClusterHealth>) -> Option<i64> {
    let mut seen = ctx.recovery.last_revisions.lock().expect("revision memory");
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

#[cfg(test)]
mod tests {
    use super::*;
    use etcdfleet_api::MemberStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::SignedDuration;

    fn voter(name: &str, id: u64, since: Option<Timestamp>) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            id: Some(format!("{id:x}")),
            unhealthy_since: since.map(Time),
            ..Default::default()
        }
    }

    fn pv(terms: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}
        }))
        .unwrap()
    }

    fn hostname_in(values: &[&str]) -> serde_json::Value {
        serde_json::json!({"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": values}
        ]})
    }

    #[test]
    fn a_volume_is_local_to_a_node_only_when_its_affinity_names_that_one_node() {
        assert_eq!(
            local_node(&pv(serde_json::json!([hostname_in(&["n1"])]))),
            Some("n1".into())
        );
        assert_eq!(
            local_node(&pv(serde_json::json!([
                hostname_in(&["n1"]),
                hostname_in(&["n1"])
            ]))),
            Some("n1".into())
        );
        for not_local in [
            serde_json::json!([hostname_in(&["n1", "n2"])]),
            serde_json::json!([hostname_in(&["n1"]), hostname_in(&["n2"])]),
            serde_json::json!([{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
            ]}]),
        ] {
            assert_eq!(local_node(&pv(not_local.clone())), None, "{not_local}");
        }
        assert_eq!(local_node(&PersistentVolume::default()), None);
    }

    #[test]
    fn unanswered_voters_are_down_since_no_member_answered_or_earlier_never_without_that() {
        let now = Timestamp::now();
        let hour_ago = now - SignedDuration::from_mins(60);
        let two_hours_ago = now - SignedDuration::from_mins(120);
        let minute_ago = now - SignedDuration::from_mins(1);
        let lost_after = Duration::from_secs(600);
        let mut status = EtcdClusterStatus {
            members: vec![
                voter("c-etcd-0", 10, None),
                voter("c-etcd-1", 11, Some(two_hours_ago)),
                MemberStatus {
                    learner: true,
                    ..voter("c-etcd-2", 12, Some(hour_ago))
                },
            ],
            no_member_answers_since: Some(Time(hour_ago)),
            ..Default::default()
        };
        let down = recorded_down_since(&status, lost_after, now);
        assert_eq!(down, BTreeMap::from([(10, hour_ago), (11, two_hours_ago)]));
        assert_eq!(
            recorded_voters(&status),
            [("c-etcd-0".into(), 10), ("c-etcd-1".into(), 11)]
        );
        // Not yet down for lostAfter: only the member down for longer.
        status.no_member_answers_since = Some(Time(minute_ago));
        let down = recorded_down_since(&status, lost_after, now);
        assert_eq!(down, BTreeMap::from([(11, two_hours_ago)]));
        // Never seen all down (cut off from Ready pods, or not since this
        // release): no clock at all.
        status.no_member_answers_since = None;
        assert!(recorded_down_since(&status, lost_after, now).is_empty());
    }

    fn answered(id: u64) -> AnswerRead {
        let status = crate::etcd::MemberStatus {
            member_id: id,
            cluster_id: 1,
            version: "3.5.1".into(),
            leader: 0,
            raft_index: 50,
            raft_term: 2,
            raft_applied_index: 50,
            revision: 40,
            db_size: 1,
            db_size_in_use: 1,
            is_learner: false,
            errors: vec![],
            storage_version: String::new(),
            downgrade_target: None,
        };
        let me = crate::etcd::Member {
            id,
            name: format!("c-etcd-{}", id - 10),
            peer_urls: vec![],
            client_urls: vec![],
            is_learner: false,
        };
        Ok((status, vec![me]))
    }

    #[test]
    fn an_answer_stands_for_its_member_only_over_the_claim_it_was_read_over_and_strangers_none() {
        let now = Instant::now();
        let mut kept = Answers::new();
        let volumes = BTreeMap::from([(10, "uid-a".to_string()), (11, "uid-b".to_string())]);
        let errors = remember(
            &mut kept,
            [
                ("m0".to_string(), answered(10)),
                ("m2".to_string(), answered(99)),
            ]
            .into_iter(),
            &volumes,
            now,
        );
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), [10]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("member 63 answered, but it is none"),
            "{errors:?}"
        );
        assert!(view_of(&kept, now).is_some());
        // Member 10's volume was lost and its claim made again: what it said
        // over the old claim says nothing now, and nobody answers.
        let remade = BTreeMap::from([(10, "uid-new".to_string()), (11, "uid-b".to_string())]);
        let later = now + Duration::from_secs(1);
        remember(&mut kept, std::iter::empty(), &remade, later);
        assert!(kept.is_empty());
        assert!(view_of(&kept, later).is_none());
        // An answer over the same claim is kept for ANSWER_KEPT, not longer.
        remember(
            &mut kept,
            [("m0".to_string(), answered(10))].into_iter(),
            &volumes,
            now,
        );
        remember(
            &mut kept,
            std::iter::empty(),
            &volumes,
            now + ANSWER_KEPT / 2,
        );
        assert_eq!(kept.len(), 1);
        remember(&mut kept, std::iter::empty(), &volumes, now + ANSWER_KEPT);
        assert!(kept.is_empty());
    }
}
