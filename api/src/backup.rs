//! Backups: the `EtcdBackup` and `EtcdBackupSchedule` kinds and the pure
//! decisions about them (object names, cron next run, catch-up after a
//! restart, retry backoff, retention). No I/O.
//!
//! An `EtcdBackup` is one snapshot of one cluster, taken once. An
//! `EtcdBackupSchedule` creates `EtcdBackup`s on a cron schedule and prunes
//! old ones. Fields either leaves empty come from the cluster's
//! `spec.backup`, which templates default like every other setting.

// kube's `printcolumn(...)` entries repeat `type_ = ...`, which clippy takes
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::destination::{
    BackupSpec, CRON_SHAPE_MESSAGE, CRON_SHAPE_RULE, DURATION_RULE, DrillPolicy,
    ObjectStoreDestination,
};

/// Label on an `EtcdBackup` naming the cluster it is of.
pub const CLUSTER_LABEL: &str = "etcdfleet.dev/cluster";
/// Label on an `EtcdBackup` naming the schedule that created it.
pub const SCHEDULE_LABEL: &str = "etcdfleet.dev/backup-schedule";
/// Annotation on an `EtcdBackup` holding the scheduled time it was made for (RFC 3339).
pub const SCHEDULED_TIME_ANNOTATION: &str = "etcdfleet.dev/scheduled-time";

/// Phases of an `EtcdBackup`.
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

/// Condition types of backups and schedules.
pub mod condition {
    /// EtcdBackup: the snapshot is stored and verified.
    pub const COMPLETE: &str = "Complete";
    /// EtcdBackup: the last attempt failed (reason says why); retried with backoff.
    pub const FAILED: &str = "Failed";
    /// EtcdBackupSchedule: the schedule and its defaults resolve.
    pub const SCHEDULED: &str = "Scheduled";
}

/// One snapshot of an `EtcdCluster` in the same namespace, taken once.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1beta1",
    kind = "EtcdBackup",
    namespaced,
    status = "EtcdBackupStatus",
    shortname = "etcdb",
    category = "etcdfleet",
    doc = "One snapshot of an EtcdCluster, streamed to object storage.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(name = "Revision", type_ = "integer", json_path = ".status.revision"),
    printcolumn(
        name = "Drill",
        type_ = "string",
        json_path = ".status.lastDrill.result"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
// A backup is one snapshot: retargeting it would make its status lie.
#[x_kube(validation = Rule::new("self == oldSelf").message("spec of an EtcdBackup is immutable: create a new EtcdBackup"))]
pub struct EtcdBackupSpec {
    /// The `EtcdCluster` (same namespace) to snapshot.
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("clusterName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub cluster_name: String,

    /// Where the snapshot goes (default: the cluster's `spec.backup.destination`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ObjectStoreDestination>,
}

/// Observed state of an `EtcdBackup`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// `Pending`, `Running`, `Succeeded` or `Failed` (retries exhausted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Complete, Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The destination used, as resolved when the backup ran (restores and
    /// pruning use it, whatever the cluster's defaults say later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ObjectStoreDestination>,
    /// Key of the snapshot object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_key: Option<String>,
    /// Key of the metadata object next to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_key: Option<String>,
    /// Bytes of the snapshot object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// The member's revision when the snapshot started (the snapshot holds at least this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Hex SHA-256 of the snapshot object, verified against what was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// etcd version of the member the snapshot came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// The member (client URL) the snapshot was streamed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// When the current or last attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the backup succeeded or finally failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// How long the successful attempt took (stream, upload, verification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_millis: Option<i64>,
    /// Attempts made so far.
    #[serde(default)]
    pub attempts: i32,
    /// Earliest time of the next attempt after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Time>,
    /// What the data held when the snapshot was stored, from the member it
    /// came from: the drill of this backup compares against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<DataFingerprint>,
    /// The last restore drill of this backup. A failed one makes the backup
    /// unfit for automatic recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drill: Option<DrillResult>,
}

/// What a snapshot's data is, told by the member it was taken from, right
/// after it was stored: etcd's hash of the keyspace (`HashKV`, the hash its
/// members compare with each other) at `revision`, with the compaction it
/// was taken after, and how many keys there were at `revision`. `revision`
/// is the member's revision when the snapshot started, so the snapshot
/// holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFingerprint {
    pub revision: i64,
    /// The compacted revision the hash was computed above.
    pub compact_revision: i64,
    /// etcd's CRC-32 (Castagnoli) of the key space at `revision`.
    pub hash: i64,
    /// Keys at `revision`.
    pub key_count: i64,
}

/// Results of a restore drill.
pub mod drill_result {
    /// The backup restored and matched what it recorded.
    pub const PASSED: &str = "Passed";
    /// The backup did not restore, or not to what it recorded.
    pub const FAILED: &str = "Failed";
    /// The drill could not run (its pod, the store, a timeout): it says
    /// nothing of the backup.
    pub const ERROR: &str = "Error";
    /// The drill runs (`drillInProgress` only).
    pub const RUNNING: &str = "Running";
}

/// One restore drill: which backup, when, what it found, how long the
/// restore took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillResult {
    /// The EtcdBackup drilled.
    pub backup: String,
    pub started_at: Option<Time>,
    pub completed_at: Option<Time>,
    /// `Passed`, `Failed` (the backup) or `Error` (the drill).
    pub result: String,
    /// Why it failed (CamelCase), absent when it passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What was checked, or what did not match.
    pub message: String,
    /// From the start of the download to the first read the restored etcd
    /// served: the time a restore of this backup takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_millis: Option<i64>,
    /// Bytes of the snapshot restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_bytes: Option<i64>,
    /// The restored etcd's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Keys the restored etcd held at the fingerprint's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_count: Option<i64>,
    /// The etcd version the drill ran (the backup's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
}

impl DrillResult {
    pub fn passed(&self) -> bool {
        self.result == drill_result::PASSED
    }
}

/// Retention of a schedule's backups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// How many successful backups to keep (default: the cluster's `spec.backup.retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("retention.count must be at least 1"))]
    pub count: Option<i32>,
    /// Successful backups older than this are pruned, e.g. `72h` (default:
    /// the cluster's `spec.backup.retentionMaxAge`). The newest successful
    /// backup is never pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("retention.maxAge must be a positive whole number followed by s, m, h or d, e.g. 72h"))]
    pub max_age: Option<String>,
}

/// Backups of an `EtcdCluster` on a cron schedule, with retention.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1beta1",
    kind = "EtcdBackupSchedule",
    namespaced,
    status = "EtcdBackupScheduleStatus",
    shortname = "etcdbs",
    category = "etcdfleet",
    doc = "Scheduled EtcdBackups of an EtcdCluster, with retention.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".status.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "LastSuccess",
        type_ = "date",
        json_path = ".status.lastSuccessTime"
    ),
    printcolumn(name = "NextRun", type_ = "date", json_path = ".status.nextRunTime"),
    printcolumn(
        name = "Drill",
        type_ = "string",
        json_path = ".status.lastDrill.result"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupScheduleSpec {
    /// The `EtcdCluster` (same namespace) to back up.
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("clusterName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub cluster_name: String,

    /// Cron schedule in UTC, five fields (`minute hour day-of-month month
    /// day-of-week`), e.g. `0 */6 * * *` (default: the cluster's `spec.backup.schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Five space-separated fields; the controller parses the rest and reports
    // an unparsable schedule in the `Scheduled` condition.
    #[x_kube(validation = Rule::new(CRON_SHAPE_RULE).message(CRON_SHAPE_MESSAGE))]
    pub schedule: Option<String>,

    /// Retention (default: the cluster's `spec.backup.retention` and `retentionMaxAge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,

    /// Take no new backups while true (retention still prunes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,

    /// Where the snapshots go (default: the cluster's `spec.backup.destination`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ObjectStoreDestination>,

    /// Restore drills of this schedule's backups (default: the cluster's
    /// `spec.backup.drill`; none when neither sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<DrillPolicy>,
}

/// Observed state of an `EtcdBackupSchedule`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupScheduleStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Scheduled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The schedule in force (the spec's or the cluster's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The scheduled time of the last EtcdBackup created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// The next scheduled time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<Time>,
    /// The newest successful EtcdBackup of this schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_backup: Option<String>,
    /// When it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_time: Option<Time>,
    /// The newest failed EtcdBackup of this schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_backup: Option<String>,
    /// When it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Time>,
    /// The drill running now (its pod is in the workload cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill_in_progress: Option<DrillResult>,
    /// The last finished restore drill of this schedule's backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drill: Option<DrillResult>,
    /// When the next drill is due, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_drill: Option<String>,
}

// ---- pure decisions ----

/// A schedule, retention or duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackupConfigError {
    #[error("no schedule: set spec.schedule or the cluster's spec.backup.schedule")]
    NoSchedule,
    #[error("schedule {schedule:?} is not a five-field cron expression: {message}")]
    BadSchedule { schedule: String, message: String },
    #[error("duration {0:?} is not a whole number followed by s, m, h or d")]
    BadDuration(String),
    #[error("no destination: set spec.destination or the cluster's spec.backup.destination")]
    NoDestination,
    #[error("{0}")]
    InvalidReference(String),
    #[error(
        "schedule {schedule:?} runs {every}s apart at its closest; the platform allows no \
         schedule to run more often than every {min}s (tenancy.minScheduleIntervalSeconds)"
    )]
    TooFrequent {
        schedule: String,
        every: u64,
        min: u64,
    },
}

/// A parsed cron schedule ([`parse_schedule`]).
pub type CronSchedule = croner::Cron;

/// Parses a five-field cron expression (no seconds field).
pub fn parse_schedule(schedule: &str) -> Result<croner::Cron, BackupConfigError> {
    let bad = |message: String| BackupConfigError::BadSchedule {
        schedule: schedule.to_string(),
        message,
    };
    if schedule.split_whitespace().count() != 5 {
        return Err(bad("expected five fields".into()));
    }
    croner::Cron::from_str(schedule).map_err(|e| bad(e.to_string()))
}

fn utc(t: Timestamp) -> k8s_openapi::jiff::Zoned {
    t.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
}

/// The first scheduled time strictly after `after`.
pub fn next_run(cron: &croner::Cron, after: Timestamp) -> Option<Timestamp> {
    cron.find_next_occurrence(&utc(after), false)
        .ok()
        .map(|z| z.timestamp())
}

/// The shortest time between two runs of `cron`, in seconds, over its runs
/// in the two days from its first run after `from` (at most 2,880: every
/// minute); `None` with fewer than two runs there (a yearly schedule).
pub fn shortest_interval(cron: &croner::Cron, from: Timestamp) -> Option<u64> {
    let first = next_run(cron, from)?;
    let end = first.as_second() + 2 * 86400;
    let (mut at, mut shortest) = (first, None::<u64>);
    for _ in 0..2880 {
        let Some(next) = next_run(cron, at).filter(|n| n.as_second() <= end) else {
            break;
        };
        let gap = next.as_second().saturating_sub(at.as_second()) as u64;
        shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
        at = next;
    }
    shortest
}

/// The scheduled time a backup is due for now, if any: the newest scheduled
/// time in `(since, now]`, where `since` is the last scheduled time handled
/// (or the schedule's creation). However many runs were missed (a controller
/// down for a day), this is at most one: the newest.
pub fn due_run(cron: &croner::Cron, since: Timestamp, now: Timestamp) -> Option<Timestamp> {
    let newest = cron
        .find_previous_occurrence(&utc(now), true)
        .ok()?
        .timestamp();
    (newest > since).then_some(newest)
}

/// Parses `90s`, `15m`, `72h`, `30d`.
pub fn parse_duration(text: &str) -> Result<Duration, BackupConfigError> {
    let bad = || BackupConfigError::BadDuration(text.to_string());
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(bad()),
    };
    if n == 0 {
        return Err(bad());
    }
    Ok(Duration::from_secs(n.checked_mul(secs).ok_or_else(bad)?))
}

/// Retention in force: the schedule's values, else the cluster's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    pub count: Option<u32>,
    pub max_age: Option<Duration>,
}

impl Retention {
    pub fn resolve(
        schedule: Option<&RetentionPolicy>,
        defaults: Option<&BackupSpec>,
    ) -> Result<Retention, BackupConfigError> {
        let count = schedule
            .and_then(|r| r.count)
            .or(defaults.and_then(|d| d.retention));
        let max_age = schedule
            .and_then(|r| r.max_age.clone())
            .or(defaults.and_then(|d| d.retention_max_age.clone()));
        Ok(Retention {
            count: count.map(|c| c.max(1) as u32),
            max_age: max_age.as_deref().map(parse_duration).transpose()?,
        })
    }
}

/// What retention needs to know of one backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupRecord {
    pub name: String,
    /// Creation time (the order of backups).
    pub created: Timestamp,
    pub phase: Option<String>,
}

impl BackupRecord {
    fn succeeded(&self) -> bool {
        self.phase.as_deref() == Some(phase::SUCCEEDED)
    }
    fn failed(&self) -> bool {
        self.phase.as_deref() == Some(phase::FAILED)
    }
}

/// The backups retention removes, oldest first. Successful backups beyond
/// `count` (newest kept) or older than `max_age` go, except that the newest
/// successful backup always stays: a restore point is never pruned away by
/// age alone, nor while newer attempts fail. Failed backups go once a newer
/// backup succeeded. Backups still pending or running are never touched.
pub fn select_for_pruning(
    backups: &[BackupRecord],
    retention: Retention,
    now: Timestamp,
) -> Vec<String> {
    let mut sorted: Vec<&BackupRecord> = backups.iter().collect();
    // Newest first; the name breaks ties so the choice is deterministic.
    sorted.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(&a.name)));
    let newest_success = sorted.iter().find(|b| b.succeeded()).map(|b| b.created);
    let mut prune = Vec::new();
    let mut kept_successes = 0u32;
    for b in &sorted {
        if b.succeeded() {
            let is_newest = kept_successes == 0;
            let over_count = retention.count.is_some_and(|c| kept_successes >= c);
            let too_old = retention
                .max_age
                .is_some_and(|age| now.as_second() - b.created.as_second() > age.as_secs() as i64);
            if !is_newest && (over_count || too_old) {
                prune.push(b.name.clone());
            } else {
                kept_successes += 1;
            }
        } else if b.failed() && newest_success.is_some_and(|t| t > b.created) {
            prune.push(b.name.clone());
        }
    }
    prune.reverse();
    prune
}

/// Delay before attempt `attempts + 1` after `attempts` failed ones: 10 s
/// doubling, at most 5 minutes.
pub fn retry_backoff(attempts: i32) -> Duration {
    let exp = attempts.clamp(1, 16) as u32 - 1;
    Duration::from_secs(10u64.saturating_mul(1 << exp)).min(Duration::from_secs(300))
}

/// Attempts before a backup is marked `Failed` for good.
pub const MAX_ATTEMPTS: i32 = 5;

/// `20261122T061900Z`: UTC, second precision, sorts like time.
pub fn compact_time(t: Timestamp) -> String {
    utc(t).strftime("%Y%m%dT%H%M%SZ").to_string()
}

/// The key of a snapshot object:
/// `[<prefix>/]<namespace>/<cluster>/<UTC time>-<revision>-<EtcdBackup>.db`.
/// Keys of one cluster sort by time; the revision is zero-padded so equal
/// times sort by it; the EtcdBackup's name keeps two backups taken in the
/// same second at the same revision apart (pruning one must not delete the
/// other's object).
pub fn object_key(
    prefix: Option<&str>,
    namespace: &str,
    cluster: &str,
    started: Timestamp,
    revision: i64,
    backup: &str,
) -> String {
    let prefix = prefix.map(|p| p.trim_matches('/')).unwrap_or_default();
    let base = format!(
        "{namespace}/{cluster}/{}-{revision:012}-{backup}.db",
        compact_time(started)
    );
    if prefix.is_empty() {
        base
    } else {
        format!("{prefix}/{base}")
    }
}

/// The key of the metadata object of a snapshot object: `.db` → `.json`.
pub fn metadata_key(object_key: &str) -> String {
    match object_key.strip_suffix(".db") {
        Some(stem) => format!("{stem}.json"),
        None => format!("{object_key}.json"),
    }
}

/// The name of the EtcdBackup a schedule creates for `scheduled`:
/// deterministic, so a retried create finds the one already made.
pub fn scheduled_backup_name(schedule: &str, scheduled: Timestamp) -> String {
    let stamp = utc(scheduled).strftime("%Y%m%d%H%M").to_string();
    // Object names are at most 253 characters; keep the stamp whole.
    let max = 253 - stamp.len() - 1;
    let head: String = schedule.chars().take(max).collect();
    format!("{head}-{stamp}")
}

/// The metadata object stored next to every snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMetadata {
    pub namespace: String,
    pub cluster: String,
    pub cluster_uid: String,
    pub etcd_version: String,
    pub revision: i64,
    pub size_bytes: u64,
    pub sha256: String,
    pub object_key: String,
    /// RFC 3339.
    pub taken_at: String,
}

/// The destination of a backup: its own, else the cluster's default.
pub fn resolve_destination(
    own: Option<&ObjectStoreDestination>,
    defaults: Option<&BackupSpec>,
) -> Result<ObjectStoreDestination, BackupConfigError> {
    own.cloned()
        .or_else(|| defaults.and_then(|d| d.destination.clone()))
        .ok_or(BackupConfigError::NoDestination)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn schedules_parse_five_fields_only() {
        for ok in ["0 */6 * * *", "*/5 * * * *", "30 2 * * 1-5", "0 0 1 * *"] {
            assert!(parse_schedule(ok).is_ok(), "{ok}");
        }
        for bad in ["", "* * * *", "0 0 * * * *", "61 * * * *", "x * * * *"] {
            assert!(
                matches!(
                    parse_schedule(bad),
                    Err(BackupConfigError::BadSchedule { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn next_run_is_strictly_after() {
        let cases = [
            (
                "0 */6 * * *",
                "2026-11-22T06:19:00Z",
                "2026-11-22T12:00:00Z",
            ),
            (
                "0 */6 * * *",
                "2026-11-22T12:00:00Z",
                "2026-11-22T18:00:00Z",
            ),
            (
                "*/5 * * * *",
                "2026-11-22T23:58:10Z",
                "2026-11-23T00:00:00Z",
            ),
            ("30 2 * * *", "2026-12-31T03:00:00Z", "2027-01-01T02:30:00Z"),
        ];
        for (schedule, after, want) in cases {
            let cron = parse_schedule(schedule).unwrap();
            assert_eq!(
                next_run(&cron, ts(after)),
                Some(ts(want)),
                "{schedule} after {after}"
            );
        }
    }

    #[test]
    fn the_shortest_interval_is_found_where_a_schedule_bunches_its_runs() {
        let from = ts("2026-11-22T06:19:00Z");
        let every = |schedule: &str| shortest_interval(&parse_schedule(schedule).unwrap(), from);
        assert_eq!(every("* * * * *"), Some(60));
        assert_eq!(every("0 */6 * * *"), Some(6 * 3600));
        assert_eq!(every("*/5 * * * *"), Some(300));
        // Hourly but twice in one hour: the closest two runs count.
        assert_eq!(every("0,1 * * * *"), Some(60));
        // Every minute, but only on the first of a month: found all the same.
        assert_eq!(every("* * 1 * *"), Some(60));
        // Fewer than two runs in two days: nothing to judge.
        assert_eq!(every("0 3 1 1 *"), None);
    }

    #[test]
    fn due_run_catches_up_at_most_once() {
        let hourly = parse_schedule("0 * * * *").unwrap();
        let cases = [
            // Nothing scheduled since the last run.
            ("2026-11-22T06:00:00Z", "2026-11-22T06:59:59Z", None),
            // Exactly on time.
            (
                "2026-11-22T06:00:00Z",
                "2026-11-22T07:00:00Z",
                Some("2026-11-22T07:00:00Z"),
            ),
            // Down for a day: one run, the newest missed one.
            (
                "2026-11-21T06:00:00Z",
                "2026-11-22T06:30:00Z",
                Some("2026-11-22T06:00:00Z"),
            ),
            // Created after the last slot: wait for the next one.
            ("2026-11-22T06:10:00Z", "2026-11-22T06:30:00Z", None),
        ];
        for (since, now, want) in cases {
            assert_eq!(
                due_run(&hourly, ts(since), ts(now)),
                want.map(ts),
                "since {since}, now {now}"
            );
        }
    }

    #[test]
    fn durations_parse_whole_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("72h"), Ok(Duration::from_secs(72 * 3600)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86400)));
        for bad in ["", "h", "0h", "1.5h", "10w", "-1h", "h1"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    fn rec(name: &str, created: &str, phase: &str) -> BackupRecord {
        BackupRecord {
            name: name.into(),
            created: ts(created),
            phase: Some(phase.into()),
        }
    }

    #[test]
    fn retention_table() {
        use phase::*;
        let now = ts("2026-11-22T12:00:00Z");
        let day = |d: u32| format!("2026-11-{d:02}T00:00:00Z");
        struct Case {
            what: &'static str,
            backups: Vec<BackupRecord>,
            retention: Retention,
            prune: Vec<&'static str>,
        }
        let count = |c| Retention {
            count: Some(c),
            max_age: None,
        };
        let age = |h: u64| Retention {
            count: None,
            max_age: Some(Duration::from_secs(h * 3600)),
        };
        let cases = vec![
            Case {
                what: "count keeps the newest successes",
                backups: vec![
                    rec("a", &day(18), SUCCEEDED),
                    rec("b", &day(19), SUCCEEDED),
                    rec("c", &day(20), SUCCEEDED),
                    rec("d", &day(21), SUCCEEDED),
                ],
                retention: count(2),
                prune: vec!["a", "b"],
            },
            Case {
                what: "failures do not use up the count",
                backups: vec![
                    rec("a", &day(18), SUCCEEDED),
                    rec("b", &day(19), SUCCEEDED),
                    rec("c", &day(20), FAILED),
                    rec("d", &day(21), FAILED),
                ],
                retention: count(2),
                prune: vec![],
            },
            Case {
                what: "failures older than the newest success go",
                backups: vec![
                    rec("a", &day(18), FAILED),
                    rec("b", &day(19), SUCCEEDED),
                    rec("c", &day(20), FAILED),
                ],
                retention: count(5),
                prune: vec!["a"],
            },
            Case {
                what: "age prunes old successes but never the newest",
                backups: vec![rec("a", &day(1), SUCCEEDED), rec("b", &day(2), SUCCEEDED)],
                retention: age(24),
                prune: vec!["a"],
            },
            Case {
                what: "age keeps young successes",
                backups: vec![
                    rec("a", &day(10), SUCCEEDED),
                    rec("b", &day(21), SUCCEEDED),
                    rec("c", &day(22), SUCCEEDED),
                ],
                retention: age(48),
                prune: vec!["a"],
            },
            Case {
                what: "running and pending backups are never pruned",
                backups: vec![
                    rec("a", &day(18), RUNNING),
                    rec("b", &day(19), PENDING),
                    rec("c", &day(20), SUCCEEDED),
                    rec("d", &day(21), SUCCEEDED),
                ],
                retention: count(1),
                prune: vec!["c"],
            },
            Case {
                what: "no retention prunes only superseded failures",
                backups: vec![rec("a", &day(18), SUCCEEDED), rec("b", &day(19), SUCCEEDED)],
                retention: Retention::default(),
                prune: vec![],
            },
        ];
        for case in cases {
            assert_eq!(
                select_for_pruning(&case.backups, case.retention, now),
                case.prune,
                "{}",
                case.what
            );
        }
    }

    #[test]
    fn retention_resolves_from_schedule_then_cluster_defaults() {
        let defaults = BackupSpec {
            retention: Some(7),
            retention_max_age: Some("30d".into()),
            ..Default::default()
        };
        let own = RetentionPolicy {
            count: Some(3),
            max_age: None,
        };
        assert_eq!(
            Retention::resolve(Some(&own), Some(&defaults)),
            Ok(Retention {
                count: Some(3),
                max_age: Some(Duration::from_secs(30 * 86400))
            })
        );
        assert_eq!(Retention::resolve(None, None), Ok(Retention::default()));
    }

    #[test]
    fn object_keys_are_deterministic_and_sort_by_time() {
        let a = object_key(
            Some("/backups/"),
            "team-a",
            "shop",
            ts("2026-11-22T06:19:00Z"),
            42,
            "nightly-202611220619",
        );
        assert_eq!(
            a,
            "backups/team-a/shop/20261122T061900Z-000000000042-nightly-202611220619.db"
        );
        assert_eq!(
            metadata_key(&a),
            "backups/team-a/shop/20261122T061900Z-000000000042-nightly-202611220619.json"
        );
        let b = object_key(None, "team-a", "shop", ts("2026-11-22T10:00:00Z"), 7, "b");
        assert_eq!(b, "team-a/shop/20261122T100000Z-000000000007-b.db");
        assert!(a.trim_start_matches("backups/") < b.as_str());
        // Two backups in the same second at the same revision: two objects.
        let now = ts("2026-11-22T10:00:00Z");
        assert_ne!(
            object_key(None, "team-a", "shop", now, 7, "one"),
            object_key(None, "team-a", "shop", now, 7, "two")
        );
    }

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let got: Vec<u64> = (1..=7).map(|a| retry_backoff(a).as_secs()).collect();
        assert_eq!(got, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn scheduled_names_are_deterministic() {
        assert_eq!(
            scheduled_backup_name("nightly", ts("2026-11-22T02:30:00Z")),
            "nightly-202611220230"
        );
    }
}
