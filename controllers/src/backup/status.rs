//! Report step of a backup: status, conditions, events.

use std::time::Duration;

use etcdfleet_api::backup::{DataFingerprint, condition, phase, retry_backoff};
use etcdfleet_api::conditions::{self as conds, set_condition};
use etcdfleet_api::{EtcdBackup, EtcdBackupStatus, EtcdCluster};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use serde_json::Value;

use super::act::{BackupError, Taken};
use super::plan::is_last_attempt;
use super::{Context, Error, Result};

/// Merge-patches `status` of a backup from `old` to `new`; fields `new`
/// drops are sent as `null` so the merge removes them. No write when equal.
async fn write(ctx: &Context, backup: &EtcdBackup, new: &EtcdBackupStatus) -> Result<()> {
    let old = backup.status.clone().unwrap_or_default();
    if &old == new {
        return Ok(());
    }
    let to_map = |s: &EtcdBackupStatus| match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let mut patch = to_map(new);
    for key in to_map(&old).keys() {
        patch.entry(key.clone()).or_insert(Value::Null);
    }
    let api: Api<EtcdBackup> = Api::namespaced(
        ctx.access().management.clone(),
        &backup.namespace().unwrap_or_default(),
    );
    api.patch_status(
        &backup.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&serde_json::json!({ "status": patch })),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

/// The backup waits (cluster not ready, another backup running, backoff).
pub async fn waiting(backup: &EtcdBackup, ctx: &Context, why: &str) -> Result<()> {
    let mut s = backup.status.clone().unwrap_or_default();
    if s.phase.is_none() {
        s.phase = Some(phase::PENDING.into());
    }
    let changed = set_condition(
        &mut s.conditions,
        conds::condition(
            condition::COMPLETE,
            false,
            "Waiting",
            why,
            backup.metadata.generation,
            time(ctx.now()),
        ),
    );
    if changed || backup.status.is_none() {
        write(ctx, backup, &s).await?;
    }
    Ok(())
}

/// Attempt `attempt` starts now.
pub async fn running(
    backup: &EtcdBackup,
    ctx: &Context,
    attempt: i32,
    now: Timestamp,
) -> Result<()> {
    let mut s = backup.status.clone().unwrap_or_default();
    s.phase = Some(phase::RUNNING.into());
    s.attempts = attempt;
    s.started_at = Some(time(now));
    s.next_attempt_at = None;
    set_condition(
        &mut s.conditions,
        conds::condition(
            condition::COMPLETE,
            false,
            "Running",
            format!("attempt {attempt}: streaming a snapshot"),
            backup.metadata.generation,
            time(now),
        ),
    );
    write(ctx, backup, &s).await
}

/// The snapshot is stored and verified.
pub async fn succeeded(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    ctx: &Context,
    attempt: i32,
    taken: Taken,
    took: Duration,
) -> Result<()> {
    let now = ctx.now();
    let mut s = backup.status.clone().unwrap_or_default();
    s.phase = Some(phase::SUCCEEDED.into());
    s.attempts = attempt;
    if s.started_at.is_none() {
        s.started_at = Some(time(now));
    }
    s.completed_at = Some(time(now));
    s.duration_millis = Some(took.as_millis() as i64);
    s.next_attempt_at = None;
    s.size_bytes = Some(taken.size_bytes as i64);
    s.revision = Some(taken.revision);
    s.sha256 = Some(taken.sha256.clone());
    s.etcd_version = Some(taken.etcd_version.clone()).filter(|v| !v.is_empty());
    s.member = Some(taken.member.clone());
    s.object_key = Some(taken.object_key.clone());
    s.metadata_key = Some(taken.metadata_key.clone());
    s.destination = Some(taken.destination.clone());
    s.fingerprint = taken.fingerprint.map(|f| DataFingerprint {
        revision: f.revision,
        compact_revision: f.compact_revision,
        hash: f.hash.into(),
        key_count: f.key_count,
    });
    let message = format!(
        "{} bytes at revision {} in {}, SHA-256 {} verified{}",
        taken.size_bytes,
        taken.revision,
        taken.object_key,
        taken.sha256,
        match &s.fingerprint {
            Some(f) => format!(
                "; {} keys hashing to {:08x} at revision {}",
                f.key_count, f.hash, f.revision
            ),
            None => "; no fingerprint (the member could not hash that revision)".into(),
        }
    );
    set_condition(
        &mut s.conditions,
        conds::condition(
            condition::COMPLETE,
            true,
            "Succeeded",
            &message,
            backup.metadata.generation,
            time(now),
        ),
    );
    s.conditions.retain(|c| c.type_ != condition::FAILED);
    write(ctx, backup, &s).await?;
    ctx.access()
        .publish(
            cluster,
            EventType::Normal,
            "BackupSucceeded",
            &format!("{}: {message}", backup.name_any()),
        )
        .await;
    Ok(())
}

/// Attempt `attempt` failed: retried after a backoff, or `Failed` for good
/// after the last attempt.
pub async fn attempt_failed(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    ctx: &Context,
    attempt: i32,
    err: &BackupError,
) -> Result<()> {
    let now = ctx.now();
    let mut s = backup.status.clone().unwrap_or_default();
    s.attempts = attempt;
    let last = is_last_attempt(attempt);
    let message = if last {
        s.phase = Some(phase::FAILED.into());
        s.completed_at = Some(time(now));
        s.next_attempt_at = None;
        format!("attempt {attempt} (the last) failed: {err}")
    } else {
        let backoff = retry_backoff(attempt);
        s.phase = Some(phase::PENDING.into());
        s.next_attempt_at = Some(time(now + backoff));
        format!(
            "attempt {attempt} failed, retrying in {}s: {err}",
            backoff.as_secs()
        )
    };
    set_condition(
        &mut s.conditions,
        conds::condition(
            condition::FAILED,
            true,
            err.reason(),
            &message,
            backup.metadata.generation,
            time(now),
        ),
    );
    set_condition(
        &mut s.conditions,
        conds::condition(
            condition::COMPLETE,
            false,
            err.reason(),
            &message,
            backup.metadata.generation,
            time(now),
        ),
    );
    write(ctx, backup, &s).await?;
    ctx.access()
        .publish(
            cluster,
            EventType::Warning,
            "BackupFailed",
            &format!("{}: {message}", backup.name_any()),
        )
        .await;
    Ok(())
}
