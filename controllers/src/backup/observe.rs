//! Observe step of a backup (read only): its cluster, whether the cluster
//! can be backed up now, and whether another backup of it is running here
//! or in any controller.

use std::time::Duration;

use etcdfleet_api::backup::phase;
use etcdfleet_api::conditions::{self, AVAILABLE};
use etcdfleet_api::{EtcdBackup, EtcdBackupStatus, EtcdCluster};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::plan::BackupObservation;
use super::{Context, Error, Result};

/// What one backup reconcile observed.
pub struct Observed {
    /// The backup's cluster (`None`: not found).
    pub cluster: Option<EtcdCluster>,
    /// `namespace/name` of the cluster.
    pub cluster_key: String,
    pub now: Timestamp,
    /// What the planner decides from.
    pub observation: BackupObservation,
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

/// Observes `backup` (whose status is `status`); `None` when its cluster
/// is another controller's (nothing more is read then).
pub async fn observe(
    backup: &EtcdBackup,
    status: &EtcdBackupStatus,
    ctx: &Context,
) -> Result<Option<Observed>> {
    let ns = backup.namespace().unwrap_or_default();
    let cluster_name = &backup.spec.cluster_name;
    let cluster_key = format!("{ns}/{cluster_name}");
    let invalid = etcdfleet_api::names::reference_problem("clusterName", cluster_name);
    let cluster = match invalid {
        Some(_) => None,
        None => Api::<EtcdCluster>::namespaced(ctx.access().management.clone(), &ns)
            .get_opt(cluster_name)
            .await
            .map_err(Error::ManagementApi)?,
    };
    if cluster.as_ref().is_some_and(|c| !ctx.access().owns(c)) {
        return Ok(None);
    }
    let now = ctx.now();
    // Our own `Running` status with no stream here is one a stopped
    // controller left: the planner takes it again as the next attempt.
    let other_running = other_running(backup, ctx, now).await?.or_else(|| {
        ctx.is_busy(&cluster_key)
            .then(|| "another (in this controller)".to_string())
    });
    let observation = BackupObservation {
        phase: status.phase.clone(),
        attempts: status.attempts,
        next_attempt_at: status.next_attempt_at.as_ref().map(|t| t.0),
        now,
        cluster_not_ready: invalid.or_else(|| cluster_not_ready(cluster.as_ref(), cluster_name)),
        other_running,
    };
    Ok(Some(Observed {
        cluster,
        cluster_key,
        now,
        observation,
    }))
}

/// Another backup of the same cluster running (started less than
/// [`stale_after`] ago), by any controller.
async fn other_running(
    backup: &EtcdBackup,
    ctx: &Context,
    now: Timestamp,
) -> Result<Option<String>> {
    let ns = backup.namespace().unwrap_or_default();
    let stale = stale_after(ctx);
    let others = Api::<EtcdBackup>::namespaced(ctx.access().management.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::ManagementApi)?;
    Ok(others
        .items
        .iter()
        .filter(|b| {
            b.name_any() != backup.name_any() && b.spec.cluster_name == backup.spec.cluster_name
        })
        .find(|b| {
            let s = b.status.as_ref();
            s.and_then(|s| s.phase.as_deref()) == Some(phase::RUNNING)
                && s.and_then(|s| s.started_at.as_ref())
                    .is_some_and(|t| now.as_second() - t.0.as_second() < stale.as_secs() as i64)
        })
        .map(|b| b.name_any()))
}
