//! The backup a recovery from a lost quorum restores (`quorumLoss:
//! FromBackup`, when no member survives): the newest `Succeeded`
//! `EtcdBackup` of the cluster, taken since the `EtcdCluster` was created
//! (a backup of an earlier cluster of the same name is not its data), whose
//! object verifies again now, as a restore's does (`crate::restore::verify`:
//! size, SHA-256, and an etcd the cluster's version may run). A backup that
//! does not verify, or whose last restore drill failed, is skipped for the
//! next newest, and said why. A verdict
//! stands for [`VERDICT_KEPT`]; the seeder checks size and SHA-256 once more
//! as it restores.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcdfleet_api::backup::phase;
use etcdfleet_api::recovery::RecoveryBackup;
use etcdfleet_api::restore::RestoreSource;
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

/// How many of the newest backups are tried before the recovery holds.
pub const TRIED: usize = 3;

/// Each backup's verdict and when it was reached, keyed by `name@sha256`
/// (a backup whose record changed is judged again).
pub type Verdicts = BTreeMap<String, (Result<RecoveryBackup, String>, Instant)>;

/// How long a verdict stands: an object can change in the store after it
/// was read, so it is read again at least this often while it matters.
pub const VERDICT_KEPT: Duration = Duration::from_secs(600);

/// The newest backup of `cluster` that verifies for `version`, or why none
/// does. `verdicts` holds the verdicts already reached. A failure to reach
/// the management API is an error.
pub async fn newest_verified(
    (management, fence): (&kube::Client, &crate::tenancy::Fence),
    cluster: &EtcdCluster,
    (version, seeder_image): (&str, &str),
    verdicts: &mut Verdicts,
) -> Result<Result<RecoveryBackup, String>, kube::Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let backups = Api::<EtcdBackup>::namespaced(management.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    let candidates = candidates(cluster, backups.items);
    if candidates.is_empty() {
        return Ok(Err(format!(
            "no Succeeded EtcdBackup of {} in {ns} taken since it was created",
            cluster.name_any()
        )));
    }
    let mut refused = Vec::new();
    verdicts.retain(|_, (_, at)| at.elapsed() < VERDICT_KEPT);
    for backup in candidates.iter().take(TRIED) {
        if let Some(why) = failed_drill(backup) {
            refused.push(format!("{}: {why}", backup.name_any()));
            continue;
        }
        let key = verdict_key(backup);
        let verdict = match verdicts.get(&key) {
            Some((v, _)) => v.clone(),
            None => {
                let v = verify((management, fence), &ns, backup, (version, seeder_image)).await?;
                verdicts.insert(key, (v.clone(), Instant::now()));
                v
            }
        };
        match verdict {
            Ok(chosen) => return Ok(Ok(chosen)),
            Err(why) => refused.push(format!("{}: {why}", backup.name_any())),
        }
    }
    Ok(Err(format!(
        "none of the {} newest backups verifies ({})",
        refused.len(),
        refused.join("; ")
    )))
}

/// Why a backup whose last restore drill failed is not restored from
/// (docs/backups.md); a drill that could not run does not count against it.
fn failed_drill(backup: &EtcdBackup) -> Option<String> {
    let drill = backup.status.as_ref()?.last_drill.as_ref();
    if etcdfleet_api::drill::fit_for_recovery(drill) {
        return None;
    }
    let drill = drill?;
    Some(format!(
        "its restore drill failed ({}): {}",
        drill.reason.as_deref().unwrap_or("no reason"),
        drill.message
    ))
}

/// The cluster's `Succeeded` backups taken since it was created, newest
/// first.
fn candidates(cluster: &EtcdCluster, backups: Vec<EtcdBackup>) -> Vec<EtcdBackup> {
    let created = cluster.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let completed = |b: &EtcdBackup| {
        (b.status.as_ref())
            .and_then(|s| s.completed_at.as_ref())
            .map(|t| t.0)
    };
    let mut ours: Vec<EtcdBackup> = backups
        .into_iter()
        .filter(|b| b.spec.cluster_name == cluster.name_any())
        .filter(|b| {
            let status = b.status.as_ref();
            status.and_then(|s| s.phase.as_deref()) == Some(phase::SUCCEEDED)
        })
        .filter(|b| match (created, completed(b)) {
            (Some(created), Some(done)) => done >= created,
            _ => false,
        })
        .collect();
    ours.sort_by_key(|b| std::cmp::Reverse((completed(b), b.name_any())));
    ours
}

fn verdict_key(backup: &EtcdBackup) -> String {
    let sha = (backup.status.as_ref()).and_then(|s| s.sha256.as_deref());
    format!("{}@{}", backup.name_any(), sha.unwrap_or(""))
}

/// Reads the backup's object back through the restore's check.
async fn verify(
    (management, fence): (&kube::Client, &crate::tenancy::Fence),
    ns: &str,
    backup: &EtcdBackup,
    (version, seeder_image): (&str, &str),
) -> Result<Result<RecoveryBackup, String>, kube::Error> {
    let source = RestoreSource {
        backup_name: Some(backup.name_any()),
        ..Default::default()
    };
    let verdict =
        crate::restore::verify((management, fence), ns, &source, version, seeder_image).await?;
    let status = backup.status.as_ref();
    Ok(match verdict {
        Ok(snapshot) => Ok(RecoveryBackup {
            name: backup.name_any(),
            revision: status.and_then(|s| s.revision),
            completed_time: status.and_then(|s| s.completed_at.clone()),
            snapshot,
        }),
        Err((refusal, _)) => Err(refusal.message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdfleet_api::{EtcdBackupSpec, EtcdBackupStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    fn backup(name: &str, of: &str, phase: &str, done: Option<i64>) -> EtcdBackup {
        let mut b = EtcdBackup::new(
            name,
            EtcdBackupSpec {
                cluster_name: of.into(),
                destination: None,
            },
        );
        b.status = Some(EtcdBackupStatus {
            phase: Some(phase.into()),
            completed_at: done.map(at),
            ..Default::default()
        });
        b
    }

    #[test]
    fn only_this_clusters_succeeded_backups_since_its_creation_count_newest_first() {
        let mut cluster = EtcdCluster::new("a", Default::default());
        cluster.metadata.creation_timestamp = Some(at(100));
        let found = candidates(
            &cluster,
            vec![
                backup("older", "a", phase::SUCCEEDED, Some(200)),
                backup("newest", "a", phase::SUCCEEDED, Some(300)),
                backup("failed", "a", phase::FAILED, Some(400)),
                backup("running", "a", phase::RUNNING, None),
                backup("another-cluster", "b", phase::SUCCEEDED, Some(500)),
                backup("an-earlier-a", "a", phase::SUCCEEDED, Some(50)),
            ],
        );
        let names: Vec<String> = found.iter().map(|b| b.name_any()).collect();
        assert_eq!(names, ["newest", "older"]);
    }
}
