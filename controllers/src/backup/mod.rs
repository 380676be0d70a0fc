//! The EtcdBackup and EtcdBackupSchedule reconcilers. One backup reconcile:
//!
//! ```text
//! observe → the backup, its cluster, other backups of that cluster (read only)
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
pub mod plan;
pub mod schedule;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::backup::phase;
use etcdfleet_api::conditions::{self, AVAILABLE};
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tracing::warn;

use crate::access::Access;
pub use context::{Clock, Context, Error, Result, SharedAccess, system_clock};
use plan::{BackupObservation, BackupPlan};

/// What one backup reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Waiting { why: String, after: Duration },
    Succeeded { object_key: String },
    AttemptFailed { reason: String, message: String },
}

/// A running backup whose start is older than this was left by a controller
/// that stopped mid-stream: it no longer blocks others and is retried.
fn stale_after(ctx: &Context) -> Duration {
    ctx.access().etcd_deadlines.snapshot + Duration::from_secs(120)
}

/// Why `cluster` cannot be backed up now, if it cannot.
pub fn cluster_not_ready(cluster: Option<&EtcdCluster>, name: &str) -> Option<String> {
    let Some(cluster) = cluster else {
        return Some(format!("EtcdCluster {name} not found"));
    };
    let status = cluster.status.as_ref();
    if cluster.spec.template_ref.is_some()
        && (status.and_then(|s| s.template.as_ref()).is_none()
            || cluster
                .annotations()
                .contains_key(etcdfleet_api::template::REBASE_ANNOTATION))
    {
        return Some(format!(
            "EtcdCluster {name} has not resolved its template yet"
        ));
    }
    let available = status.is_some_and(|s| conditions::is_true(&s.conditions, AVAILABLE));
    (!available).then(|| format!("EtcdCluster {name} is not Available"))
}

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(backup: Arc<EtcdBackup>, ctx: Arc<Context>) -> Result<Action> {
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

/// One reconcile of one EtcdBackup.
pub async fn reconcile_backup(backup: &EtcdBackup, ctx: &Context) -> Result<Outcome> {
    let ns = backup.namespace().unwrap_or_default();
    let cluster_name = &backup.spec.cluster_name;
    let cluster_key = format!("{ns}/{cluster_name}");
    let status = backup.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some(phase::SUCCEEDED)
        && let Some(completed) = &status.completed_at
    {
        // Read back on every start, so the age survives restarts and failover.
        let at = std::time::SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(completed.0.as_second()).unwrap_or_default());
        ctx.access()
            .metrics
            .observe_backup_recorded(&cluster_key, at, status.size_bytes);
    }
    if matches!(
        status.phase.as_deref(),
        Some(phase::SUCCEEDED) | Some(phase::FAILED)
    ) {
        return Ok(Outcome::Done);
    }
    let mgmt = &ctx.access().management;

    // observe
    let cluster = Api::<EtcdCluster>::namespaced(mgmt.clone(), &ns)
        .get_opt(cluster_name)
        .await
        .map_err(Error::ManagementApi)?;
    if let Some(c) = &cluster
        && !ctx.access().owns(c)
    {
        return Ok(Outcome::Waiting {
            why: "the cluster is not owned by this controller".into(),
            after: Duration::from_secs(300),
        });
    }
    let now = ctx.now();
    let stale = stale_after(ctx);
    let others = Api::<EtcdBackup>::namespaced(mgmt.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::ManagementApi)?;
    let other_running = others
        .items
        .iter()
        .filter(|b| b.name_any() != backup.name_any() && &b.spec.cluster_name == cluster_name)
        .find(|b| {
            let s = b.status.as_ref();
            s.and_then(|s| s.phase.as_deref()) == Some(phase::RUNNING)
                && s.and_then(|s| s.started_at.as_ref())
                    .is_some_and(|t| now.as_second() - t.0.as_second() < stale.as_secs() as i64)
        })
        .map(|b| b.name_any());
    // Our own `Running` status with no stream here is one a stopped
    // controller left: the planner takes it again as the next attempt.
    let observation = BackupObservation {
        phase: status.phase.clone(),
        attempts: status.attempts,
        next_attempt_at: status.next_attempt_at.as_ref().map(|t| t.0),
        now,
        cluster_not_ready: cluster_not_ready(cluster.as_ref(), cluster_name),
        other_running: other_running.or_else(|| {
            ctx.is_busy(&cluster_key)
                .then(|| "another (in this controller)".to_string())
        }),
    };

    // plan
    match plan::plan_backup(&observation) {
        BackupPlan::Done => Ok(Outcome::Done),
        BackupPlan::Wait { why, after } => {
            status::waiting(backup, ctx, &why).await?;
            Ok(Outcome::Waiting { why, after })
        }
        BackupPlan::Take { attempt } => {
            let Some(_guard) = ctx.claim(&cluster_key) else {
                return Ok(Outcome::Waiting {
                    why: "another backup of this cluster started".into(),
                    after: Duration::from_secs(5),
                });
            };
            let Some(cluster) = cluster else {
                return Ok(Outcome::Done);
            };
            // act
            status::running(backup, ctx, attempt, now).await?;
            let started = std::time::Instant::now();
            let result = act::take(backup, &cluster, ctx, now).await;
            // report
            match result {
                Ok(taken) => {
                    ctx.access().metrics.observe_backup_success(
                        &cluster_key,
                        taken.size_bytes,
                        started.elapsed(),
                    );
                    let key = taken.object_key.clone();
                    status::succeeded(backup, &cluster, ctx, attempt, taken, started.elapsed())
                        .await?;
                    Ok(Outcome::Succeeded { object_key: key })
                }
                Err(e) => {
                    ctx.access()
                        .metrics
                        .observe_backup_failure(&cluster_key, e.reason());
                    status::attempt_failed(backup, &cluster, ctx, attempt, &e).await?;
                    Ok(Outcome::AttemptFailed {
                        reason: e.reason().to_string(),
                        message: e.to_string(),
                    })
                }
            }
        }
    }
}

/// Runs the EtcdBackup and EtcdBackupSchedule controllers (all namespaces,
/// or the given ones) until `shutdown()` resolves. Owner filtering follows
/// the cluster reconciler's: a backup of a cluster another controller owns
/// is left alone.
pub async fn run<C, F, Fut>(cluster_ctx: Arc<C>, namespaces: &[String], shutdown: F)
where
    C: AsRef<Access> + Send + Sync + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    use etcdfleet_api::EtcdBackupSchedule;
    use futures::{FutureExt, StreamExt};
    use kube::runtime::{Controller, watcher};

    use crate::shutdown::drain_if_started;

    let ctx = Arc::new(Context::new(cluster_ctx));
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
