//! Restore drills (docs/backups.md): on a schedule's policy, its newest
//! successful backup is restored into a scratch one-member etcd of the
//! backup's own version, in a pod of the workload cluster's etcd namespace
//! ([`pod`]), compared with the fingerprint the backup recorded, read,
//! timed, and removed ([`run`]). The pod is the drill's state: whichever
//! controller (restarted, or another replica) reconciles the schedule next
//! finds it and goes on. The result lands on the EtcdBackup first
//! (`status.lastDrill`), then the pod is deleted; the schedule's
//! `lastDrill` is read back from its backups, so a crash between the two
//! loses nothing. Nothing here writes to the live cluster, its etcd or its
//! members' objects.

mod condition;
pub mod pod;
mod run;
pub mod settings;
mod site;
mod start;

pub use settings::{DrillSettings, DrillSlots};
pub use site::{DrillReport, last_drill};
pub use start::candidate;

use etcdfleet_api::drill::Drills;
use etcdfleet_api::{EtcdBackup, EtcdBackupSchedule, EtcdCluster};
use k8s_openapi::jiff::Timestamp;

use crate::backup::context::{Context, Result};
use site::reach;

/// The drill step of one schedule reconcile: goes on with the drill in
/// progress, or starts the next one when it is due and allowed. Problems
/// of the workload cluster or the store are reported, never raised.
pub async fn reconcile(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    cluster: Option<&EtcdCluster>,
    backups: &[EtcdBackup],
    now: Timestamp,
) -> Result<DrillReport> {
    let Some(cluster) = cluster else {
        return Ok(DrillReport::default());
    };
    let defaults = cluster
        .spec
        .config
        .backup
        .as_ref()
        .and_then(|b| b.drill.as_ref());
    let policy = match Drills::resolve(schedule.spec.drill.as_ref(), defaults) {
        Ok(Some(p)) => Some(p),
        Ok(None) => None,
        Err(e) => return Ok(DrillReport::next(format!("invalid drill policy: {e}"))),
    };
    let running = (schedule.status.as_ref()).is_some_and(|s| s.drill_in_progress.is_some());
    match &policy {
        Some(policy) => {
            condition::report(ctx, cluster, policy, last_drill(backups).as_ref(), now).await?
        }
        // No drills, and none this schedule started is left to finish or
        // remove: nothing is read (a schedule reconciles every 30 s).
        None if !running => return Ok(DrillReport::default()),
        None => {}
    }
    let site = match reach(ctx, cluster).await {
        Ok(site) => site,
        Err(why) => return Ok(DrillReport::next(format!("waits: {why}"))),
    };
    let found = match site.pods().get_opt(&site.pod_name).await {
        Ok(found) => found,
        Err(e) => return Ok(DrillReport::next(format!("waits: workload API: {e}"))),
    };
    match (found, policy) {
        (Some(pod), _) => run::go_on(schedule, ctx, &site, &pod, backups, now).await,
        (None, Some(policy)) => {
            start::start_if_due(schedule, ctx, &site, cluster, &policy, backups, now).await
        }
        (None, None) => {
            ctx.drill_slots.end(&site.key);
            Ok(DrillReport::default())
        }
    }
}
