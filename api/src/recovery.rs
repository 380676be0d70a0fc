//! Recovery from a permanent loss of quorum: the policy a cluster opts into
//! (`spec.recovery`), and the record of a recovery (`status.lastRecovery`).
//!
//! With `quorumLoss: FromSurvivors`, a cluster whose lost voters are lost
//! for good (by evidence recorded before any step, see the controller's
//! planner) is brought back from the surviving member that holds the most
//! data: the lost members are fenced, that member restarts once with
//! etcd's `--force-new-cluster`, and the cluster grows back through
//! learners. Phases:
//!
//! 1. `Fencing`: the evidence and the chosen survivor are recorded; no lost
//!    member's pod may come back as the old cluster.
//! 2. `ForcingNewCluster`: the chosen member restarts with
//!    `--force-new-cluster`, once (a marker next to its data says it ran).
//! 3. `Regrowing`: the one-member cluster grows back to its size.
//! 4. `Completed`.
//!
//! `FromBackup` does the same while a survivor answers; when no member
//! answers and every voter is lost by the same evidence, it restores the
//! newest `EtcdBackup` of the cluster that verifies again now, into the
//! same cluster (name, PKI, Services kept): `Fencing` records it, the
//! workload's member objects are cleared, `RestoringFromBackup` seeds
//! member 0 from the snapshot as a new cluster, then `Regrowing`.
//!
//! `Manual` (the default) takes no step: a person decides.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Condition type: `True` while a recovery is in progress.
pub const RECOVERING: &str = "Recovering";
/// How long a voter must be down before it can count as lost, when the
/// cluster does not say.
pub const DEFAULT_LOST_AFTER_SECONDS: i32 = 600;
/// The shortest `lostAfterSeconds` accepted: a pod restart or a node
/// reboot takes longer than this to come back, and a shorter wait would
/// make a slow restart look like a loss.
pub const MIN_LOST_AFTER_SECONDS: i32 = 30;

/// Phases of a recovery, in order.
pub mod phase {
    pub const FENCING: &str = "Fencing";
    pub const FORCING: &str = "ForcingNewCluster";
    /// From a backup: member 0 is seeded from the snapshot.
    pub const RESTORING: &str = "RestoringFromBackup";
    pub const REGROWING: &str = "Regrowing";
    pub const COMPLETED: &str = "Completed";
    /// Every phase, for the phase gauge.
    pub const ALL: [&str; 5] = [FENCING, FORCING, RESTORING, REGROWING, COMPLETED];
}

/// What the controller does when a majority of the voters is lost.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum QuorumLossPolicy {
    /// Take no step; report `QuorumLost` with what a person can do.
    #[default]
    Manual,
    /// Recover from the surviving member with the most data (etcd's
    /// `--force-new-cluster`, once), then grow back through learners.
    FromSurvivors,
    /// As `FromSurvivors` while a survivor answers; when no member answers
    /// and every voter is lost, restore the newest backup of the cluster
    /// that verifies, into the same cluster, then grow back.
    FromBackup,
}

impl std::fmt::Display for QuorumLossPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuorumLossPolicy::Manual => "Manual",
            QuorumLossPolicy::FromSurvivors => "FromSurvivors",
            QuorumLossPolicy::FromBackup => "FromBackup",
        })
    }
}

/// `spec.recovery`: what the controller may do on its own when the cluster
/// loses its quorum for good. Templates may set it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// `Manual` (default): no step, a person decides. `FromSurvivors`:
    /// restart the surviving member with the most data as a one-member
    /// cluster, then grow back (the writes only lost members held are lost).
    /// `FromBackup`: the same while a member answers; when none does and
    /// every voter is lost, restore the newest backup that verifies (the
    /// writes after it are lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum_loss: Option<QuorumLossPolicy>,
    /// How long a voter must have been down (not answering, its pod not
    /// Ready) before it can count as lost (default 600, at least 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 30 && self <= 604800").message("lostAfterSeconds must be between 30 and 604800 (a week)"))]
    pub lost_after_seconds: Option<i32>,
}

/// The recovery policy with its defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedRecovery {
    pub quorum_loss: QuorumLossPolicy,
    pub lost_after: std::time::Duration,
}

impl Default for ResolvedRecovery {
    fn default() -> Self {
        ResolvedRecovery {
            quorum_loss: QuorumLossPolicy::Manual,
            lost_after: std::time::Duration::from_secs(DEFAULT_LOST_AFTER_SECONDS as u64),
        }
    }
}

impl RecoverySpec {
    /// The policy with defaults (a value below the minimum, which the
    /// schema refuses, is raised to it).
    pub fn resolve(spec: Option<&RecoverySpec>) -> ResolvedRecovery {
        let spec = spec.cloned().unwrap_or_default();
        let seconds = spec
            .lost_after_seconds
            .unwrap_or(DEFAULT_LOST_AFTER_SECONDS)
            .max(MIN_LOST_AFTER_SECONDS);
        ResolvedRecovery {
            quorum_loss: spec.quorum_loss.unwrap_or_default(),
            lost_after: std::time::Duration::from_secs(seconds as u64),
        }
    }
}

/// A surviving voter as it answered when the recovery started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurvivorRecord {
    /// Member (and pod) name.
    pub name: String,
    /// etcd member id, hexadecimal.
    pub id: String,
    /// The store revision it had applied.
    pub revision: i64,
    /// The raft index it had applied.
    pub raft_applied_index: i64,
}

/// A voter counted as lost, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LostMemberRecord {
    /// Member (and pod) name.
    pub name: String,
    /// etcd member id, hexadecimal.
    pub id: String,
    /// Each fact that made it count as lost, as observed.
    pub evidence: Vec<String>,
}

/// `status.lastRecovery`: the last (or current) recovery from a loss of quorum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// Names this recovery (the chosen member's id and applied index).
    pub id: String,
    /// The policy it ran under (`FromSurvivors`).
    pub policy: String,
    /// `Fencing`, `ForcingNewCluster`, `Regrowing` or `Completed`.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_time: Option<Time>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    /// The member the cluster was recovered from (pod name); from a
    /// backup, the member seeded from it.
    pub member: String,
    /// Its etcd member id, hexadecimal (etcd keeps it, and the cluster id);
    /// empty for a recovery from a backup (a restore makes new ids).
    #[serde(default)]
    pub member_id: String,
    /// The backup recovered from, when no member survived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<RecoveryBackup>,
    /// The revision the recovered cluster kept: the chosen member's, or the
    /// backup's.
    pub kept_revision: i64,
    /// The highest revision the controller saw before the loss, if it saw
    /// the cluster since it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_revision: Option<i64>,
    /// What may be lost, as a person reads it: the revisions after
    /// `keptRevision` up to `lastSeenRevision`, and writes acknowledged
    /// by the lost majority after the controller last looked.
    pub loss_window: String,
    /// Every voter that answered when the recovery started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<SurvivorRecord>,
    /// Every voter counted as lost, with its evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostMemberRecord>,
}

/// The backup a recovery restored: the newest `Succeeded` `EtcdBackup` of
/// the cluster whose object verified again (size, SHA-256, the etcd that
/// wrote it) when the recovery began.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryBackup {
    /// The `EtcdBackup`'s name.
    pub name: String,
    /// The revision the backup recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// When the backup completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    /// The verified snapshot member 0 is seeded from.
    pub snapshot: crate::restore::RestoreRecord,
}

impl RecoveryStatus {
    /// Whether the recovery is under way.
    pub fn in_progress(&self) -> bool {
        self.phase != phase::COMPLETED
    }
}

/// The loss window as a person reads it.
pub fn loss_window(kept_revision: i64, last_seen_revision: Option<i64>) -> String {
    match last_seen_revision {
        Some(seen) if seen > kept_revision => format!(
            "revisions {} to {seen} (seen by the controller before the loss) are lost, with any \
             write the lost members acknowledged after the controller last looked",
            kept_revision + 1
        ),
        Some(_) => format!(
            "nothing the controller saw is lost (it saw revision {kept_revision} or older); \
             writes the lost members acknowledged after it last looked are"
        ),
        None => format!(
            "the controller did not see the cluster before the loss: writes after revision \
             {kept_revision} that only the lost members held are lost"
        ),
    }
}

/// The loss window of a recovery from a backup taken at `taken` (as a
/// person reads it).
pub fn backup_loss_window(
    backup_revision: i64,
    taken: Option<&str>,
    last_seen_revision: Option<i64>,
) -> String {
    let taken = taken.map(|t| format!(" taken {t}")).unwrap_or_default();
    let seen = match last_seen_revision {
        Some(seen) if seen > backup_revision => {
            format!(" (the controller saw up to revision {seen})")
        }
        _ => String::new(),
    };
    format!(
        "every write after the backup{taken} at revision {backup_revision} is lost{seen}; \
         revision numbers of the restored cluster continue from the backup's"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_defaults_to_manual_and_ten_minutes() {
        let r = RecoverySpec::resolve(None);
        assert_eq!(r.quorum_loss, QuorumLossPolicy::Manual);
        assert_eq!(r.lost_after.as_secs(), 600);
        let r = RecoverySpec::resolve(Some(&RecoverySpec {
            quorum_loss: Some(QuorumLossPolicy::FromSurvivors),
            lost_after_seconds: Some(5),
        }));
        assert_eq!(r.quorum_loss, QuorumLossPolicy::FromSurvivors);
        assert_eq!(r.lost_after.as_secs(), 30, "raised to the minimum");
    }

    #[test]
    fn the_loss_window_names_the_revisions_past_the_kept_one() {
        assert!(loss_window(100, Some(120)).starts_with("revisions 101 to 120"));
        assert!(loss_window(100, Some(90)).starts_with("nothing the controller saw"));
        assert!(loss_window(100, None).contains("after revision 100"));
        let w = backup_loss_window(100, Some("2026-11-27T10:00:00Z"), Some(150));
        assert!(w.starts_with("every write after the backup taken 2026-11-27T10:00:00Z"));
        assert!(w.contains("revision 100 is lost (the controller saw up to revision 150)"));
    }
}
