//! A drill under way: what its pod says (seeding, failed, serving), the
//! check of a serving etcd through a port-forward, the result recorded on
//! the backup, then the pod removed.

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::backup::{DrillResult, drill_result};
use etcdfleet_api::drill::{AtRevision, Reading, Verdict, judge, reason};
use etcdfleet_api::{EtcdBackup, EtcdBackupSchedule};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};

use super::pod::{BACKUP_ANNOTATION, DRILL_CLIENT_PORT, SCHEDULE_ANNOTATION};
use super::site::{DrillReport, Site, ours, remove, result};
use crate::backup::context::{Context, Error, Result};
use crate::dialer::{PortForwardDialer, transport};
use crate::etcd::{EtcdConfig, MemberClient};
use crate::restore::seed::{OBJECT_CHANGED_EXIT, RESTORE_REFUSED_EXIT};

/// Goes on with the drill `pod` runs: records its result once it has one,
/// then removes the pod.
pub(super) async fn go_on(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    site: &Site,
    pod: &Pod,
    backups: &[EtcdBackup],
    now: Timestamp,
) -> Result<DrillReport> {
    if !ours(site, pod) {
        return Ok(DrillReport::next(format!(
            "waits: pod {}/{} exists and is not this cluster's drill pod; no drill runs until it \
             is gone",
            site.namespace, site.pod_name
        )));
    }
    let of_schedule = pod
        .annotations()
        .get(SCHEDULE_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    if of_schedule != schedule.name_any() {
        return Ok(DrillReport::next(format!(
            "waits: the drill of schedule {of_schedule} runs"
        )));
    }
    ctx.drill_slots.holds(&site.key);
    let busy = |why: String| DrillReport {
        next: Some(why),
        busy: true,
        ..Default::default()
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(busy("the last drill's pod is being removed".into()));
    }
    let started = pod.creation_timestamp().map(|t| t.0);
    let drilled = pod
        .annotations()
        .get(BACKUP_ANNOTATION)
        .and_then(|b| b.split_once('/'));
    let backup = backups
        .iter()
        .find(|b| Some(b.name_any().as_str()) == drilled.map(|d| d.1));
    let recorded = backup
        .and_then(|b| b.status.as_ref()?.last_drill.as_ref())
        .is_some_and(|d| d.started_at.as_ref().map(|t| t.0) == started);
    let Some(backup) = backup.filter(|_| !recorded) else {
        // Recorded already (a crash before the removal), or the backup is gone.
        remove(site, pod).await.map_err(Error::Drill)?;
        return Ok(busy("the last drill's pod is being removed".into()));
    };
    let timed_out = started.is_some_and(|s| elapsed(s, now) > ctx.drills.timeout);
    let outcome = match stage(pod) {
        Stage::Finished(outcome) => outcome,
        Stage::Serving { seed_started } => match verify(ctx, site, backup, seed_started, now).await
        {
            Ok(outcome) => outcome,
            Err(why) if timed_out => error(ctx, why),
            Err(why) => return Ok(in_progress(backup, started, why)),
        },
        Stage::Waiting(why) if timed_out => error(ctx, why),
        Stage::Waiting(why) => return Ok(in_progress(backup, started, why)),
    };
    let mut finished = result(&backup.name_any(), started, now);
    outcome.fill(&mut finished);
    let s = backup.status.as_ref();
    finished.etcd_version = s.and_then(|s| s.etcd_version.clone());
    finished.snapshot_bytes = s.and_then(|s| s.size_bytes);
    record(ctx, backup, &finished, &site.key).await?;
    remove(site, pod).await.map_err(Error::Drill)?;
    let mut report = busy(format!(
        "{} drilled: {}",
        backup.name_any(),
        finished.result
    ));
    report.finished = Some(finished);
    Ok(report)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::from_millis((now.as_millisecond() - since.as_millisecond()).max(0) as u64)
}

fn in_progress(backup: &EtcdBackup, started: Option<Timestamp>, why: String) -> DrillReport {
    DrillReport {
        in_progress: Some(DrillResult {
            backup: backup.name_any(),
            started_at: started.map(Time),
            result: drill_result::RUNNING.to_string(),
            message: why,
            ..Default::default()
        }),
        busy: true,
        ..Default::default()
    }
}

/// What a drill found (the parts a [`DrillResult`] takes besides its times).
#[derive(Debug, Clone, Default, PartialEq)]
struct Outcome {
    result: &'static str,
    reason: Option<&'static str>,
    message: String,
    restore: Option<Duration>,
    revision: Option<i64>,
    key_count: Option<i64>,
}

impl Outcome {
    fn fill(self, r: &mut DrillResult) {
        r.result = self.result.to_string();
        r.reason = self.reason.map(str::to_string);
        r.message = self.message;
        r.restore_millis = self.restore.map(|d| d.as_millis() as i64);
        r.revision = self.revision;
        r.key_count = self.key_count;
    }
}

fn error(ctx: &Context, why: String) -> Outcome {
    Outcome {
        result: drill_result::ERROR,
        reason: Some("DrillTimedOut"),
        message: format!(
            "the drill's etcd served no read within {:?}: {why}",
            ctx.drills.timeout
        ),
        ..Default::default()
    }
}

fn failed(reason: &'static str, message: String) -> Outcome {
    Outcome {
        result: drill_result::FAILED,
        reason: Some(reason),
        message,
        ..Default::default()
    }
}

/// Where the drill pod is.
enum Stage {
    Waiting(String),
    /// etcd runs; the seeder started downloading at `seed_started`.
    Serving {
        seed_started: Option<Timestamp>,
    },
    Finished(Outcome),
}

/// The stage the pod's status tells: the seeder's exit code says whether a
/// failure is the backup's (2: the object is not what was recorded, 3: the
/// restore tool refused it) or the drill's (anything else); etcd exiting on
/// restored data is the backup's, unless it was killed for memory.
fn stage(pod: &Pod) -> Stage {
    let status = pod.status.as_ref();
    let named = |list: Option<&Vec<ContainerStatus>>, name: &str| {
        list.and_then(|l| l.iter().find(|c| c.name == name))
            .cloned()
    };
    let seed = named(
        status.and_then(|s| s.init_container_statuses.as_ref()),
        "restore-seed",
    );
    let install = named(
        status.and_then(|s| s.init_container_statuses.as_ref()),
        "install-seeder",
    );
    if let Some((code, message)) = install.as_ref().and_then(failure) {
        return Stage::Finished(drill_error(format!(
            "install-seeder exited with code {code}: {message}"
        )));
    }
    if let Some((code, message)) = seed.as_ref().and_then(failure) {
        let said = format!("the seeder exited with code {code}: {message}");
        return Stage::Finished(match code {
            c if c == i32::from(OBJECT_CHANGED_EXIT) => failed(reason::OBJECT_CHANGED, said),
            c if c == i32::from(RESTORE_REFUSED_EXIT) => failed(reason::NOT_RESTORABLE, said),
            _ => drill_error(said),
        });
    }
    let etcd = named(status.and_then(|s| s.container_statuses.as_ref()), "etcd");
    if let Some((code, message)) = etcd.as_ref().and_then(failure) {
        let oom = etcd
            .as_ref()
            .is_some_and(|c| ended(c).is_some_and(|t| t.reason.as_deref() == Some("OOMKilled")));
        let said = format!("etcd exited on the restored data with code {code}: {message}");
        return Stage::Finished(if oom {
            drill_error(said)
        } else {
            failed(reason::NOT_RESTORABLE, said)
        });
    }
    let running = etcd
        .as_ref()
        .and_then(|c| c.state.as_ref()?.running.as_ref())
        .is_some();
    if running {
        let seed_started = seed
            .as_ref()
            .and_then(ended)
            .and_then(|t| t.started_at.clone())
            .map(|t| t.0);
        return Stage::Serving { seed_started };
    }
    Stage::Waiting(waiting(pod))
}

fn drill_error(message: String) -> Outcome {
    Outcome {
        result: drill_result::ERROR,
        reason: Some("DrillFailed"),
        message,
        ..Default::default()
    }
}

/// How a container last ended (now or before a restart).
fn ended(c: &ContainerStatus) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    (c.state.as_ref().and_then(|s| s.terminated.as_ref()))
        .or_else(|| c.last_state.as_ref()?.terminated.as_ref())
}

/// A non-zero exit: its code and message.
fn failure(c: &ContainerStatus) -> Option<(i32, String)> {
    let t = ended(c).filter(|t| t.exit_code != 0)?;
    let message = t
        .message
        .as_deref()
        .or(t.reason.as_deref())
        .unwrap_or("")
        .trim();
    Some((
        t.exit_code,
        message.lines().last().unwrap_or("").to_string(),
    ))
}

/// What the pod waits for, as its status says.
fn waiting(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let unscheduled = (status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten())
    .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return format!(
            "not scheduled: {}",
            c.message.as_deref().unwrap_or("no reason given")
        );
    }
    let all = (status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten())
    .chain(
        status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten(),
    );
    for c in all {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let why = w.message.as_deref().unwrap_or("");
            return format!(
                "{}: {} {why}",
                c.name,
                w.reason.as_deref().unwrap_or("waiting")
            );
        }
        if c.state.as_ref().is_some_and(|s| s.running.is_some()) && c.name != "etcd" {
            return format!("{} runs (downloading and restoring the snapshot)", c.name);
        }
    }
    format!(
        "pod {}",
        status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into())
    )
}

/// Asks the drill etcd, through a port-forward to its loopback, what it
/// holds, and judges it against the backup. `Err`: it does not answer yet.
async fn verify(
    ctx: &Context,
    site: &Site,
    backup: &EtcdBackup,
    seed_started: Option<Timestamp>,
    now: Timestamp,
) -> std::result::Result<Outcome, String> {
    let config = EtcdConfig {
        tls: None,
        deadlines: ctx.access().etcd_deadlines,
        transport: Some(transport(
            Arc::new(PortForwardDialer::default()),
            &site.workload,
        )),
    };
    let endpoint = format!(
        "http://{}.drill.{}.svc:{DRILL_CLIENT_PORT}",
        site.pod_name, site.namespace
    );
    let member = (MemberClient::connect(&endpoint, &config).await)
        .map_err(|e| format!("the drill's etcd does not answer yet: {e}"))?;
    let status = (member.status().await)
        .map_err(|e| format!("the drill's etcd does not answer yet: {e}"))?;
    let served = ctx.now().max(now);
    let s = backup.status.clone().unwrap_or_default();
    let fingerprint = s.fingerprint.as_ref();
    // A hash that fails says nothing yet (a port-forward that broke): asked
    // again until the drill's timeout. One the restored etcd is too old to
    // answer is judged below (its revision is behind).
    let at_fingerprint = match fingerprint.filter(|fp| status.revision >= fp.revision) {
        None => None,
        Some(fp) => {
            // Never compacted: etcd answers a compacted revision below 1.
            if fp.compact_revision > 0 {
                (member.compact_to(fp.compact_revision).await)
                    .map_err(|e| format!("compacting the drill's etcd: {e}"))?;
            }
            let f = (member.fingerprint(fp.revision).await).map_err(|e| {
                format!("hashing revision {} of the drill's etcd: {e}", fp.revision)
            })?;
            Some(AtRevision {
                compact_revision: f.compact_revision,
                hash: f.hash.into(),
                key_count: f.key_count,
            })
        }
    };
    let read_at = fingerprint.map_or(status.revision, |f| f.revision.min(status.revision));
    let keys_read = (member.read_sample(read_at, ctx.drills.sample_keys).await)
        .map_err(|e| format!("the drill's etcd answered its status but no read: {e}"))?;
    let reading = Reading {
        revision: status.revision,
        at_fingerprint: at_fingerprint.clone(),
        keys_read,
    };
    let (result, reason, message) = match judge(s.revision.unwrap_or(0), fingerprint, &reading) {
        Verdict::Passed(why) => (drill_result::PASSED, None, why),
        Verdict::Failed { reason, message } => (drill_result::FAILED, Some(reason), message),
    };
    Ok(Outcome {
        result,
        reason,
        message,
        restore: seed_started.map(|t| elapsed(t, served)),
        revision: Some(status.revision),
        key_count: at_fingerprint.map(|a| a.key_count),
    })
}

/// Records `finished` on the backup (the schedule's `lastDrill` is read
/// back from there), in the metrics and as an event.
async fn record(
    ctx: &Context,
    backup: &EtcdBackup,
    finished: &DrillResult,
    cluster: &str,
) -> Result<()> {
    let ns = backup.namespace().unwrap_or_default();
    let api: Api<EtcdBackup> = Api::namespaced(ctx.access().management.clone(), &ns);
    api.patch_status(
        &backup.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&serde_json::json!({ "status": { "lastDrill": finished } })),
    )
    .await
    .map_err(Error::ManagementApi)?;
    let restorable = match finished.result.as_str() {
        drill_result::PASSED => Some(true),
        drill_result::FAILED => Some(false),
        _ => None,
    };
    let restore = finished
        .restore_millis
        .map(|ms| Duration::from_millis(ms.max(0) as u64));
    ctx.access()
        .metrics
        .observe_drill(cluster, restorable, restore, std::time::SystemTime::now());
    let (type_, reason) = match restorable {
        Some(true) => (kube::runtime::events::EventType::Normal, "DrillPassed"),
        Some(false) => (kube::runtime::events::EventType::Warning, "DrillFailed"),
        None => (kube::runtime::events::EventType::Warning, "DrillError"),
    };
    let note = format!("{}: {}", backup.name_any(), finished.message);
    ctx.access()
        .publish_about(&backup.object_ref(&()), type_, reason, &note)
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "shop-etcd-drill" },
            "status": status,
        }))
        .unwrap()
    }

    fn ended(name: &str, code: i32, reason: &str, message: &str) -> serde_json::Value {
        serde_json::json!({
            "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": {
                "exitCode": code, "reason": reason, "message": message,
                "startedAt": "2026-11-28T03:00:00Z", "finishedAt": "2026-11-28T03:00:02Z",
            } },
        })
    }

    fn finished(stage: Stage) -> Outcome {
        match stage {
            Stage::Finished(o) => o,
            Stage::Serving { .. } => panic!("serving"),
            Stage::Waiting(w) => panic!("waiting: {w}"),
        }
    }

    #[test]
    fn the_seeders_exit_code_tells_a_backup_that_does_not_restore_from_a_drill_that_could_not_run()
    {
        let seed = |code, message| {
            pod(
                serde_json::json!({ "phase": "Failed", "initContainerStatuses": [
                ended("install-seeder", 0, "Completed", ""),
                ended("restore-seed", code, "Error", message),
            ] }),
            )
        };
        let changed = finished(stage(&seed(
            2,
            "restore-seed: ChecksumMismatch: sha256 differs",
        )));
        assert_eq!(
            (changed.result, changed.reason),
            (drill_result::FAILED, Some(reason::OBJECT_CHANGED))
        );
        assert!(
            changed.message.contains("ChecksumMismatch"),
            "{}",
            changed.message
        );
        let refused = finished(stage(&seed(3, "etcdutl failed")));
        assert_eq!(refused.reason, Some(reason::NOT_RESTORABLE));
        let unreachable = finished(stage(&seed(1, "store unreachable")));
        assert_eq!(unreachable.result, drill_result::ERROR);
    }

    #[test]
    fn etcd_exiting_on_restored_data_fails_the_backup_unless_killed_for_memory() {
        let with_etcd = |c| pod(serde_json::json!({ "phase": "Failed", "containerStatuses": [c] }));
        let exited = finished(stage(&with_etcd(ended(
            "etcd",
            1,
            "Error",
            "panic: bad db",
        ))));
        assert_eq!(exited.reason, Some(reason::NOT_RESTORABLE));
        let oom = finished(stage(&with_etcd(ended("etcd", 137, "OOMKilled", ""))));
        assert_eq!(oom.result, drill_result::ERROR);
    }

    #[test]
    fn a_running_etcd_is_checked_and_a_pending_pod_says_what_it_waits_for() {
        let serving = pod(serde_json::json!({
            "phase": "Running",
            "initContainerStatuses": [ended("restore-seed", 0, "Completed", "")],
            "containerStatuses": [{
                "name": "etcd", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": { "running": { "startedAt": "2026-11-28T03:00:03Z" } },
            }],
        }));
        let Stage::Serving { seed_started } = stage(&serving) else {
            panic!("not serving")
        };
        assert_eq!(seed_started, Some("2026-11-28T03:00:00Z".parse().unwrap()));
        let unscheduled = pod(serde_json::json!({ "phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "message": "0/3 nodes match the selector",
        }] }));
        let Stage::Waiting(why) = stage(&unscheduled) else {
            panic!("not waiting")
        };
        assert!(why.contains("0/3 nodes"), "{why}");
    }
}
