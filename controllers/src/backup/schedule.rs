//! The EtcdBackupSchedule reconciler: creates an `EtcdBackup` when a
//! scheduled time has come (after a controller restart, at most one
//! catch-up: the newest missed time), prunes backups beyond retention (the
//! objects first, then the `EtcdBackup`), and reports last success, last
//! failure and next run. One step per reconcile.

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::backup::{
    BackupConfigError, BackupRecord, CLUSTER_LABEL, CronSchedule, Retention, SCHEDULE_LABEL,
    SCHEDULED_TIME_ANNOTATION, condition, due_run, metadata_key, next_run, parse_schedule, phase,
    resolve_destination, scheduled_backup_name, select_for_pruning, shortest_interval,
};
use etcdfleet_api::conditions::{self as conds, set_condition};
use etcdfleet_api::{
    BackupSpec, EtcdBackup, EtcdBackupSchedule, EtcdBackupScheduleStatus, EtcdBackupSpec,
    EtcdCluster, ObjectStoreDestination,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{Context, Error, Result};
use crate::store::open_for;

/// What the schedule planner needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleObservation {
    /// The scheduled time due now, if any (see `etcdfleet_api::backup::due_run`).
    pub due: Option<Timestamp>,
    pub suspended: bool,
    /// A backup of this schedule still pending or running.
    pub active: Option<String>,
    /// Backups retention removes, oldest first.
    pub prune: Vec<String>,
}

/// The next step of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulePlan {
    Create(Timestamp),
    Prune(String),
    Idle,
}

/// Creating on time comes first; a due time waits while a backup of this
/// schedule is still active (one backup at a time), then runs once.
pub fn plan_schedule(o: &ScheduleObservation) -> SchedulePlan {
    if let Some(t) = o.due
        && !o.suspended
        && o.active.is_none()
    {
        return SchedulePlan::Create(t);
    }
    match o.prune.first() {
        Some(name) => SchedulePlan::Prune(name.clone()),
        None => SchedulePlan::Idle,
    }
}

/// What one schedule reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleOutcome {
    Created(String),
    Pruned(String),
    Idle {
        next_run: Option<Timestamp>,
    },
    /// A restore drill is under way: looked at again soon.
    Drilling,
    Invalid(String),
}

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(schedule: Arc<EtcdBackupSchedule>, ctx: Arc<Context>) -> Result<Action> {
    // Sharded: no work on a cluster that is moving to another shard.
    let namespace = schedule.namespace().unwrap_or_default();
    let Ok(_pass) = ctx.access().enter(&namespace, &schedule.spec.cluster_name) else {
        return Ok(Action::requeue(crate::access::GATE_RETRY));
    };
    let now = ctx.now();
    Ok(match reconcile_schedule(&schedule, &ctx).await? {
        ScheduleOutcome::Created(_) | ScheduleOutcome::Pruned(_) => {
            Action::requeue(Duration::from_millis(200))
        }
        // Also polls the backups it made, to report their outcome.
        ScheduleOutcome::Idle { next_run } => {
            let until = next_run
                .map(|t| {
                    Duration::from_millis((t.as_millisecond() - now.as_millisecond()).max(0) as u64)
                })
                .unwrap_or(Duration::from_secs(30));
            Action::requeue(until.clamp(Duration::from_secs(1), Duration::from_secs(30)))
        }
        ScheduleOutcome::Drilling => Action::requeue(Duration::from_secs(1)),
        ScheduleOutcome::Invalid(_) => Action::requeue(Duration::from_secs(60)),
    })
}

/// `error_policy` for the `Controller`.
pub fn error_policy(schedule: Arc<EtcdBackupSchedule>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(schedule = %schedule.name_any(), error = %err, "backup schedule reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

fn record_time(b: &EtcdBackup) -> Timestamp {
    b.annotations()
        .get(SCHEDULED_TIME_ANNOTATION)
        .and_then(|t| t.parse().ok())
        .or_else(|| b.meta().creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// One reconcile of one EtcdBackupSchedule: resolve, observe, plan, act
/// (at most one step), report.
pub async fn reconcile_schedule(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
) -> Result<ScheduleOutcome> {
    let now = ctx.now();
    let old = schedule.status.clone().unwrap_or_default();
    let resolved = match resolve(schedule, ctx).await? {
        Resolution::NotOurs => {
            let why = "not owned by this controller".to_string();
            return Ok(ScheduleOutcome::Invalid(why));
        }
        Resolution::Invalid(e) => return report_invalid(schedule, ctx, &old, &e, now).await,
        Resolution::Resolved(resolved) => resolved,
    };
    let observed = observe(schedule, ctx, &resolved, &old, now).await?;
    let plan = plan_schedule(&observed.observation);
    let outcome = act(schedule, ctx, &plan, &resolved, &observed, now).await?;
    let cluster = resolved.cluster.as_deref();
    let drill = super::drill::reconcile(schedule, ctx, cluster, &observed.backups, now).await?;
    let mut status = report(schedule, &old, &plan, &resolved, &observed, now);
    status.last_drill =
        (drill.finished.clone()).or_else(|| super::drill::last_drill(&observed.backups));
    status.drill_in_progress = drill.in_progress;
    status.next_drill = drill.next;
    write(ctx, schedule, &old, &status).await?;
    Ok(match outcome {
        ScheduleOutcome::Idle { .. } if drill.busy => ScheduleOutcome::Drilling,
        outcome => outcome,
    })
}

/// A schedule as resolved: its own fields, else its cluster's `spec.backup`.
struct Resolved {
    /// The schedule as written (cron text or macro).
    text: String,
    cron: CronSchedule,
    retention: Retention,
    destination: ObjectStoreDestination,
    /// The schedule's cluster (`None`: not found).
    cluster: Option<Box<EtcdCluster>>,
}

/// What resolving a schedule found.
enum Resolution {
    /// Its cluster is another controller's.
    NotOurs,
    /// Neither the schedule nor its cluster's `spec.backup` makes it whole.
    Invalid(BackupConfigError),
    Resolved(Box<Resolved>),
}

/// Resolve: the schedule's fields, else its cluster's `spec.backup`.
async fn resolve(schedule: &EtcdBackupSchedule, ctx: &Context) -> Result<Resolution> {
    let ns = schedule.namespace().unwrap_or_default();
    let name = &schedule.spec.cluster_name;
    if let Some(problem) = etcdfleet_api::names::reference_problem("clusterName", name) {
        return Ok(Resolution::Invalid(BackupConfigError::InvalidReference(
            problem,
        )));
    }
    let cluster = Api::<EtcdCluster>::namespaced(ctx.access().management.clone(), &ns)
        .get_opt(name)
        .await
        .map_err(Error::ManagementApi)?;
    if cluster.as_ref().is_some_and(|c| !ctx.access().owns(c)) {
        return Ok(Resolution::NotOurs);
    }
    let defaults = cluster.as_ref().and_then(|c| c.spec.config.backup.as_ref());
    Ok(
        match resolve_schedule(schedule, defaults, &ctx.access().fence, ctx.now()) {
            Ok(mut resolved) => {
                resolved.cluster = cluster.map(Box::new);
                Resolution::Resolved(Box::new(resolved))
            }
            Err(e) => Resolution::Invalid(e),
        },
    )
}

/// Report a schedule that does not resolve: `Scheduled=False` with why,
/// no next run.
async fn report_invalid(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    old: &EtcdBackupScheduleStatus,
    e: &BackupConfigError,
    now: Timestamp,
) -> Result<ScheduleOutcome> {
    let reason = match e {
        BackupConfigError::NoSchedule => "NoSchedule",
        BackupConfigError::NoDestination => "NoDestination",
        BackupConfigError::InvalidReference(_) => "InvalidReference",
        BackupConfigError::TooFrequent { .. } => "ScheduleTooFrequent",
        _ => "InvalidSchedule",
    };
    let mut status = EtcdBackupScheduleStatus {
        observed_generation: schedule.meta().generation,
        ..old.clone()
    };
    set_condition(
        &mut status.conditions,
        conds::condition(
            condition::SCHEDULED,
            false,
            reason,
            e.to_string(),
            schedule.meta().generation,
            Time(now),
        ),
    );
    status.next_run_time = None;
    write(ctx, schedule, old, &status).await?;
    Ok(ScheduleOutcome::Invalid(e.to_string()))
}

/// What one schedule reconcile observed.
struct Observed {
    /// This schedule's backups, oldest first.
    backups: Vec<EtcdBackup>,
    /// What the planner decides from.
    observation: ScheduleObservation,
}

/// Observe: this schedule's backups, the run due now, the active backup,
/// and what retention removes.
async fn observe(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    resolved: &Resolved,
    old: &EtcdBackupScheduleStatus,
    now: Timestamp,
) -> Result<Observed> {
    let api = backups_api(ctx, schedule);
    let backups = scheduled_backups(&api, &schedule.name_any()).await?;
    let records: Vec<BackupRecord> = backups
        .iter()
        .map(|b| BackupRecord {
            name: b.name_any(),
            created: record_time(b),
            phase: b.status.as_ref().and_then(|s| s.phase.clone()),
        })
        .collect();
    let since = old
        .last_schedule_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| schedule.meta().creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let finished = |r: &&BackupRecord| {
        matches!(
            r.phase.as_deref(),
            Some(phase::SUCCEEDED) | Some(phase::FAILED)
        )
    };
    let observation = ScheduleObservation {
        due: due_run(&resolved.cron, since, now),
        suspended: schedule.spec.suspend == Some(true),
        active: records
            .iter()
            .find(|r| !finished(r))
            .map(|r| r.name.clone()),
        prune: select_for_pruning(&records, resolved.retention, now),
    };
    Ok(Observed {
        backups,
        observation,
    })
}

/// Act: the one step the plan chose.
async fn act(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    plan: &SchedulePlan,
    resolved: &Resolved,
    observed: &Observed,
    now: Timestamp,
) -> Result<ScheduleOutcome> {
    Ok(match plan {
        SchedulePlan::Create(at) => {
            let api = backups_api(ctx, schedule);
            let created = create_backup(&api, schedule, *at, &resolved.destination).await?;
            ScheduleOutcome::Created(created)
        }
        SchedulePlan::Prune(victim) => {
            let ns = schedule.namespace().unwrap_or_default();
            if let Some(b) = observed.backups.iter().find(|b| b.name_any() == *victim) {
                prune(ctx, &ns, b).await?;
            }
            ScheduleOutcome::Pruned(victim.clone())
        }
        SchedulePlan::Idle => ScheduleOutcome::Idle {
            next_run: next_run(&resolved.cron, now),
        },
    })
}

/// Report: the schedule's status after the step the plan chose was taken.
fn report(
    schedule: &EtcdBackupSchedule,
    old: &EtcdBackupScheduleStatus,
    plan: &SchedulePlan,
    resolved: &Resolved,
    observed: &Observed,
    now: Timestamp,
) -> EtcdBackupScheduleStatus {
    let mut status = EtcdBackupScheduleStatus {
        observed_generation: schedule.meta().generation,
        schedule: Some(resolved.text.clone()),
        ..old.clone()
    };
    record_last_outcomes(&observed.backups, &mut status);
    if let SchedulePlan::Create(at) = plan {
        status.last_schedule_time = Some(Time(*at));
    }
    report_scheduled(schedule, &mut status, resolved, observed, now);
    status
}

/// The EtcdBackups of the schedule's namespace.
fn backups_api(ctx: &Context, schedule: &EtcdBackupSchedule) -> Api<EtcdBackup> {
    let ns = schedule.namespace().unwrap_or_default();
    Api::namespaced(ctx.access().management.clone(), &ns)
}

/// The schedule's fields, else the cluster's `spec.backup`.
fn resolve_schedule(
    schedule: &EtcdBackupSchedule,
    defaults: Option<&BackupSpec>,
    fence: &crate::tenancy::Fence,
    now: Timestamp,
) -> Result<Resolved, BackupConfigError> {
    let text = schedule
        .spec
        .schedule
        .clone()
        .or_else(|| defaults.and_then(|d| d.schedule.clone()))
        .ok_or(BackupConfigError::NoSchedule)?;
    let cron = parse_schedule(&text)?;
    let min = fence.min_schedule_interval;
    if let Some(every) = shortest_interval(&cron, now).filter(|every| *every < min) {
        return Err(BackupConfigError::TooFrequent {
            schedule: text,
            every,
            min,
        });
    }
    let mut retention = Retention::resolve(schedule.spec.retention.as_ref(), defaults)?;
    if retention == Retention::default() {
        retention.count = Some(fence.default_retention_count);
    }
    let destination = resolve_destination(schedule.spec.destination.as_ref(), defaults)?;
    Ok(Resolved {
        text,
        cron,
        retention,
        destination,
        cluster: None,
    })
}

/// This schedule's backups, oldest first.
async fn scheduled_backups(api: &Api<EtcdBackup>, name: &str) -> Result<Vec<EtcdBackup>> {
    let mut backups: Vec<EtcdBackup> = api
        .list(&ListParams::default())
        .await
        .map_err(Error::ManagementApi)?
        .items
        .into_iter()
        .filter(|b| b.labels().get(SCHEDULE_LABEL).map(String::as_str) == Some(name))
        .collect();
    backups.sort_by_key(record_time);
    Ok(backups)
}

/// The newest success and the newest failure among the schedule's backups.
fn record_last_outcomes(backups: &[EtcdBackup], status: &mut EtcdBackupScheduleStatus) {
    for b in backups.iter().rev() {
        let s = b.status.as_ref();
        match s.and_then(|s| s.phase.as_deref()) {
            Some(phase::SUCCEEDED)
                if status.last_success_time.as_ref().is_none_or(|t| {
                    s.and_then(|s| s.completed_at.as_ref())
                        .is_some_and(|c| c.0 > t.0)
                }) =>
            {
                status.last_successful_backup = Some(b.name_any());
                status.last_success_time = s.and_then(|s| s.completed_at.clone());
            }
            Some(phase::FAILED)
                if status.last_failure_time.as_ref().is_none_or(|t| {
                    s.and_then(|s| s.completed_at.as_ref())
                        .is_some_and(|c| c.0 > t.0)
                }) =>
            {
                status.last_failed_backup = Some(b.name_any());
                status.last_failure_time = s.and_then(|s| s.completed_at.clone());
            }
            _ => {}
        }
    }
}

/// Creates the `EtcdBackup` of the run at `at`; its name.
async fn create_backup(
    api: &Api<EtcdBackup>,
    schedule: &EtcdBackupSchedule,
    at: Timestamp,
    destination: &ObjectStoreDestination,
) -> Result<String> {
    let name = schedule.name_any();
    let ns = schedule.namespace().unwrap_or_default();
    let backup_name = scheduled_backup_name(&name, at);
    let backup = EtcdBackup {
        metadata: ObjectMeta {
            name: Some(backup_name.clone()),
            namespace: Some(ns),
            labels: Some(
                [
                    (SCHEDULE_LABEL.to_string(), name.clone()),
                    (
                        CLUSTER_LABEL.to_string(),
                        schedule.spec.cluster_name.clone(),
                    ),
                ]
                .into(),
            ),
            annotations: Some([(SCHEDULED_TIME_ANNOTATION.to_string(), at.to_string())].into()),
            ..ObjectMeta::default()
        },
        // The destination resolved now: the backup stays where it
        // went even if the cluster's defaults change later.
        spec: EtcdBackupSpec {
            cluster_name: schedule.spec.cluster_name.clone(),
            destination: Some(destination.clone()),
        },
        status: None,
    };
    match api.create(&PostParams::default(), &backup).await {
        // 409: a previous reconcile created it and lost the status write.
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::ManagementApi(e)),
    }
    Ok(backup_name)
}

/// The next run and the `Scheduled` condition.
fn report_scheduled(
    schedule: &EtcdBackupSchedule,
    status: &mut EtcdBackupScheduleStatus,
    resolved: &Resolved,
    observed: &Observed,
    now: Timestamp,
) {
    let (observation, kept) = (&observed.observation, observed.backups.len());
    let after = status
        .last_schedule_time
        .as_ref()
        .map(|t| t.0.max(now))
        .unwrap_or(now);
    status.next_run_time = next_run(&resolved.cron, after).map(Time);
    let message = if observation.suspended {
        "suspended: no new backups; retention still prunes".to_string()
    } else {
        format!(
            "{}; {} backups kept",
            resolved.text,
            kept - observation.prune.len().min(kept)
        )
    };
    set_condition(
        &mut status.conditions,
        conds::condition(
            condition::SCHEDULED,
            !observation.suspended,
            if observation.suspended {
                "Suspended"
            } else {
                "Scheduled"
            },
            message,
            schedule.meta().generation,
            Time(now),
        ),
    );
}

/// Removes a backup's snapshot and metadata objects, then the `EtcdBackup`.
/// If the objects cannot be removed the `EtcdBackup` stays (and says where
/// they are), so nothing is orphaned silently.
async fn prune(ctx: &Context, ns: &str, backup: &EtcdBackup) -> Result<()> {
    let s = backup.status.as_ref();
    if let (Some(destination), Some(key)) = (
        s.and_then(|s| s.destination.as_ref()),
        s.and_then(|s| s.object_key.as_ref()),
    ) {
        let removed = async {
            let access = ctx.access();
            let (store, _) = open_for(&access.management, &access.fence, ns, destination).await?;
            store.delete(key).await?;
            store.delete(&metadata_key(key)).await
        }
        .await;
        if let Err(e) = removed {
            warn!(backup = %backup.name_any(), error = %e, "pruning: objects not removed, keeping the EtcdBackup");
            return Ok(());
        }
    }
    let api: Api<EtcdBackup> = Api::namespaced(ctx.access().management.clone(), ns);
    // Delete exactly the EtcdBackup whose objects were just removed: a
    // same-named backup created since (a schedule retrying its name) has
    // another UID and is left alone (409 from the precondition).
    let params = DeleteParams {
        preconditions: backup.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&backup.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::ManagementApi(e)),
    }
}

async fn write(
    ctx: &Context,
    schedule: &EtcdBackupSchedule,
    old: &EtcdBackupScheduleStatus,
    new: &EtcdBackupScheduleStatus,
) -> Result<()> {
    if old == new {
        return Ok(());
    }
    let api: Api<EtcdBackupSchedule> = Api::namespaced(
        ctx.access().management.clone(),
        &schedule.namespace().unwrap_or_default(),
    );
    let mut patch = serde_json::to_value(new).unwrap_or_default();
    // A merge patch leaves out what is absent: what is gone is set to null.
    if let Some(m) = patch.as_object_mut() {
        let gone = [
            ("nextRunTime", new.next_run_time.is_none()),
            ("drillInProgress", new.drill_in_progress.is_none()),
            ("nextDrill", new.next_drill.is_none()),
        ];
        for (field, absent) in gone {
            if absent {
                m.insert(field.into(), serde_json::Value::Null);
            }
        }
    }
    api.patch_status(
        &schedule.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&serde_json::json!({ "status": patch })),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant_schedule(cron: &str, retention: Option<i32>) -> EtcdBackupSchedule {
        EtcdBackupSchedule::new(
            "s",
            etcdfleet_api::EtcdBackupScheduleSpec {
                cluster_name: "shop".into(),
                schedule: Some(cron.into()),
                retention: retention.map(|count| etcdfleet_api::RetentionPolicy {
                    count: Some(count),
                    ..Default::default()
                }),
                destination: Some(ObjectStoreDestination {
                    path: Some("/b".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_tenant_schedule_runs_no_more_often_than_the_platform_allows_and_keeps_a_bounded_count() {
        let fence = crate::tenancy::Fence::default();
        let now: Timestamp = "2026-12-02T04:00:00Z".parse().unwrap();
        let e = resolve_schedule(&tenant_schedule("* * * * *", None), None, &fence, now)
            .err()
            .expect("every minute is refused");
        assert!(
            matches!(
                e,
                BackupConfigError::TooFrequent {
                    every: 60,
                    min: 900,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("tenancy.minScheduleIntervalSeconds"),
            "{e}"
        );
        let ok =
            resolve_schedule(&tenant_schedule("*/15 * * * *", None), None, &fence, now).unwrap();
        assert_eq!(
            ok.retention.count,
            Some(30),
            "no retention set: the platform's default"
        );
        let own =
            resolve_schedule(&tenant_schedule("0 * * * *", Some(3)), None, &fence, now).unwrap();
        assert_eq!(
            own.retention.count,
            Some(3),
            "a schedule's own retention stands"
        );
    }

    #[test]
    fn schedule_planner_table() {
        let t: Timestamp = "2026-11-22T06:00:00Z".parse().unwrap();
        let o = |due, suspended, active: Option<&str>, prune: &[&str]| ScheduleObservation {
            due,
            suspended,
            active: active.map(String::from),
            prune: prune.iter().map(|s| s.to_string()).collect(),
        };
        let cases = [
            (
                "due: create",
                o(Some(t), false, None, &["old"]),
                SchedulePlan::Create(t),
            ),
            (
                "suspended: prune only",
                o(Some(t), true, None, &["old"]),
                SchedulePlan::Prune("old".into()),
            ),
            (
                "one backup at a time",
                o(Some(t), false, Some("b"), &[]),
                SchedulePlan::Idle,
            ),
            (
                "nothing due, nothing to prune",
                o(None, false, None, &[]),
                SchedulePlan::Idle,
            ),
            (
                "prune oldest first",
                o(None, false, None, &["a", "b"]),
                SchedulePlan::Prune("a".into()),
            ),
        ];
        for (what, obs, want) in cases {
            assert_eq!(plan_schedule(&obs), want, "{what}");
        }
    }
}
