//! The EtcdBackup and EtcdBackupSchedule reconcilers. One backup reconcile:
//!
//! ```text
//! observe → its cluster, other backups of that cluster (read only, `observe`)
//! plan    → take now, wait (backoff, another backup running), or done (pure, `plan`)
//! act     → stream a snapshot from a healthy member into a multipart upload,
//!           verify it, store the metadata object (`act`)
//! report  → status, conditions, events, metrics (`status`)
//! ```
//!
//! A backup only reads from etcd: it never takes a member down and never
//! changes membership, so it does not count against quorum guards.

pub mod act;
pub mod context;
pub mod drill;
pub mod observe;
pub mod plan;
pub mod schedule;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::backup::phase;
use etcdfleet_api::{EtcdBackup, EtcdBackupStatus, EtcdCluster};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::warn;

use crate::access::Access;
pub use context::{Clock, Context, Error, Result, SharedAccess, system_clock};
use observe::Observed;
pub use observe::cluster_not_ready;
use plan::BackupPlan;

/// What one backup reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Waiting { why: String, after: Duration },
    Succeeded { object_key: String },
    AttemptFailed { reason: String, message: String },
}

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(backup: Arc<EtcdBackup>, ctx: Arc<Context>) -> Result<Action> {
    // Sharded: no work on a cluster that is moving to another shard.
    let namespace = backup.namespace().unwrap_or_default();
    let Ok(_pass) = ctx.access().enter(&namespace, &backup.spec.cluster_name) else {
        return Ok(Action::requeue(crate::access::GATE_RETRY));
    };
    Ok(match reconcile_backup(&backup, &ctx).await? {
        Outcome::Done => Action::await_change(),
        Outcome::Waiting { after, .. } => Action::requeue(after.max(Duration::from_millis(200))),
        Outcome::Succeeded { .. } => Action::await_change(),
        Outcome::AttemptFailed { .. } => Action::requeue(Duration::from_secs(1)),
    })
}

/// `error_policy` for the `Controller`.
pub fn error_policy(backup: Arc<EtcdBackup>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(backup = %backup.name_any(), error = %err, "backup reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// One reconcile of one EtcdBackup: observe, plan, and when the plan takes
/// the snapshot, act and report.
pub async fn reconcile_backup(backup: &EtcdBackup, ctx: &Context) -> Result<Outcome> {
    let status = backup.status.clone().unwrap_or_default();
    report_recorded(backup, &status, ctx);
    if matches!(
        status.phase.as_deref(),
        Some(phase::SUCCEEDED) | Some(phase::FAILED)
    ) {
        return Ok(Outcome::Done);
    }
    let Some(observed) = observe::observe(backup, &status, ctx).await? else {
        // Sharded, the cluster may move to this replica's shard any time.
        let after = if ctx.access().sharded() { 10 } else { 300 };
        return Ok(Outcome::Waiting {
            why: "the cluster is not owned by this controller".into(),
            after: Duration::from_secs(after),
        });
    };
    match plan::plan_backup(&observed.observation) {
        BackupPlan::Done => Ok(Outcome::Done),
        BackupPlan::Wait { why, after } => {
            status::waiting(backup, ctx, &why).await?;
            Ok(Outcome::Waiting { why, after })
        }
        BackupPlan::Take { attempt } => take(backup, ctx, observed, attempt).await,
    }
}

/// The size and time of a backup that succeeded, for its cluster's
/// metrics: read back on every start, so the age survives restarts and
/// failover.
fn report_recorded(backup: &EtcdBackup, status: &EtcdBackupStatus, ctx: &Context) {
    if status.phase.as_deref() != Some(phase::SUCCEEDED) {
        return;
    }
    let Some(completed) = &status.completed_at else {
        return;
    };
    let cluster_key = format!(
        "{}/{}",
        backup.namespace().unwrap_or_default(),
        backup.spec.cluster_name
    );
    let at = std::time::SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(completed.0.as_second()).unwrap_or_default());
    ctx.access()
        .metrics
        .observe_backup_recorded(&cluster_key, at, status.size_bytes);
}

/// Act: attempt `attempt` streams the snapshot, with this cluster claimed
/// in this controller for as long as it runs; then report.
async fn take(
    backup: &EtcdBackup,
    ctx: &Context,
    observed: Observed,
    attempt: i32,
) -> Result<Outcome> {
    let Some(_guard) = ctx.claim(&observed.cluster_key) else {
        return Ok(Outcome::Waiting {
            why: "another backup of this cluster started".into(),
            after: Duration::from_secs(5),
        });
    };
    let Some(cluster) = observed.cluster else {
        return Ok(Outcome::Done);
    };
    status::running(backup, ctx, attempt, observed.now).await?;
    let started = std::time::Instant::now();
    let taken = act::take(backup, &cluster, ctx, observed.now).await;
    let took = started.elapsed();
    report(
        backup,
        &cluster,
        ctx,
        &observed.cluster_key,
        attempt,
        taken,
        took,
    )
    .await
}

/// Report an attempt: metrics, then the status and its event.
async fn report(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    ctx: &Context,
    cluster_key: &str,
    attempt: i32,
    taken: std::result::Result<act::Taken, act::BackupError>,
    took: Duration,
) -> Result<Outcome> {
    let metrics = &ctx.access().metrics;
    match taken {
        Ok(taken) => {
            metrics.observe_backup_success(cluster_key, taken.size_bytes, took);
            let object_key = taken.object_key.clone();
            status::succeeded(backup, cluster, ctx, attempt, taken, took).await?;
            Ok(Outcome::Succeeded { object_key })
        }
        Err(e) => {
            metrics.observe_backup_failure(cluster_key, e.reason());
            status::attempt_failed(backup, cluster, ctx, attempt, &e).await?;
            Ok(Outcome::AttemptFailed {
                reason: e.reason().to_string(),
                message: e.to_string(),
            })
        }
    }
}

/// Runs the EtcdBackup and EtcdBackupSchedule controllers (all namespaces,
/// or the given ones) until `shutdown()` resolves. Owner filtering follows
/// the cluster reconciler's: a backup of a cluster another controller owns
/// is left alone.
pub async fn run<C, F, Fut>(
    cluster_ctx: Arc<C>,
    namespaces: &[String],
    drills: drill::DrillSettings,
    shutdown: F,
) where
    C: AsRef<Access> + Send + Sync + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    use etcdfleet_api::EtcdBackupSchedule;
    use futures::{FutureExt, StreamExt};
    use kube::runtime::{Controller, watcher};

    use crate::shutdown::drain_if_started;

    let ctx = Arc::new(Context::new(cluster_ctx).with_drills(drills));
    let client = ctx.access().management.clone();
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let mut runs = Vec::new();
    for ns in scopes {
        let backups: Api<EtcdBackup> = match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let schedules: Api<EtcdBackupSchedule> = match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let backups =
            Controller::new(backups, watcher::Config::default()).graceful_shutdown_on(shutdown());
        let store = backups.store();
        let run = backups
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|r| async move {
                if let Err(e) = r {
                    warn!(error = %e, "backup reconcile failed");
                }
            });
        runs.push(FutureExt::boxed(drain_if_started(run, store, shutdown())));
        let schedules =
            Controller::new(schedules, watcher::Config::default()).graceful_shutdown_on(shutdown());
        let store = schedules.store();
        let run = schedules
            .run(schedule::reconcile, schedule::error_policy, ctx.clone())
            .for_each(|r| async move {
                if let Err(e) = r {
                    warn!(error = %e, "backup schedule reconcile failed");
                }
            });
        runs.push(FutureExt::boxed(drain_if_started(run, store, shutdown())));
    }
    futures::future::join_all(runs).await;
}
