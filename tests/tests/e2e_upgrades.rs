//! Upgrades on real etcd, each path the version policy allows, by editing
//! `spec.version`: a writer runs throughout, a brand-new controller takes
//! every step (the upgrade resumes from the CR and the cluster alone), and
//! every acknowledged write is read back afterwards. At every round each
//! member pod runs with the flags of its own release (the members still on
//! the old release keep the old spelling). A cluster below a gate is
//! refused with nothing touched, the refusal naming the patch to move to.
//! A cluster with a backup destination is snapshotted there before a minor
//! upgrade starts; if that fails, the upgrade is refused.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::conditions::{self, VERSION_ACCEPTED, VERSION_SUPPORTED};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::{ObjectKind, Step, VersionStep};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_both, require_etcd};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{
    NS, cluster, converge_all, get, patch_spec, put, read_everywhere, running,
};
use etcdfleet_tests::versions::{
    assert_runs, initial_corruption_check_passed, pods_run_their_releases_flags,
    roll_under_a_writer,
};

fn condition(c: &etcdfleet_api::EtcdCluster, type_: &str) -> (String, String, String) {
    let cond = conditions::find(&c.status.as_ref().unwrap().conditions, type_)
        .unwrap_or_else(|| panic!("{type_} is set"))
        .clone();
    (cond.status, cond.reason, cond.message)
}

/// Creates a 3-member cluster at `from`, rolls it to `to` under a writer
/// and checks the outcome every path shares.
async fn upgrade(from: EtcdVersion, to: EtcdVersion) -> Result<()> {
    let Some((old, new)) = require_both(from, to) else {
        return Ok(());
    };
    let (fleet, mut ctl) = running(&["a"], &[cluster("up", "a", 3, &old.release)]).await?;
    assert_runs(&fleet, "a", "up", &old.release).await?;
    put(&fleet, "a", "up", 3, "written-before").await?;

    let roll = roll_under_a_writer(
        &fleet,
        &mut ctl,
        "up",
        "a",
        &new.release,
        Duration::from_secs(240),
    )
    .await?;
    eprintln!("{}", roll.summary("upgrade", &old.release, &new.release));
    let mut restarted = roll.restarted();
    restarted.sort_unstable();
    assert_eq!(
        restarted,
        [0, 1, 2],
        "each member once: {:?}",
        roll.log.steps
    );
    roll.timeline.assert_leader_last()?;
    assert!(roll.min_ready >= 2, "never more than one member down");
    assert!(roll.acknowledged > 10, "the writer kept writing");
    assert_runs(&fleet, "a", "up", &new.release).await?;
    initial_corruption_check_passed(&fleet, "a", "up")?;
    assert_eq!(
        condition(&get(&fleet, "up").await?, VERSION_ACCEPTED).0,
        "True"
    );
    read_everywhere(&fleet, "a", "up", 3, "written-before").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_3_4_to_3_5_restarts_the_leader_last() -> Result<()> {
    upgrade(EtcdVersion::V3_4, EtcdVersion::V3_5Latest).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_an_old_3_5_patch_to_the_newest_3_5_restarts_the_leader_last() -> Result<()> {
    upgrade(EtcdVersion::V3_5Old, EtcdVersion::V3_5Latest).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_3_5_to_3_6_restarts_the_leader_last() -> Result<()> {
    upgrade(EtcdVersion::V3_5Latest, EtcdVersion::V3_6).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_3_6_to_3_7_restarts_the_leader_last() -> Result<()> {
    upgrade(EtcdVersion::V3_6, EtcdVersion::V3_7).await
}

/// Asserts that reconciling `name` after asking for `to` is refused with
/// `reason`, names `words`, and writes nothing to the workload cluster.
async fn refused_untouched(
    fleet: &Fleet,
    ctl: &etcdfleet_tests::driver::TestController,
    name: &str,
    to: &str,
    reason: &str,
    words: &[&str],
) -> Result<()> {
    let before = pods_run_their_releases_flags(fleet, "a").await?;
    patch_spec(fleet, name, serde_json::json!({ "version": to })).await?;
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        assert_eq!(ctl.reconcile(NS, name).await?, Outcome::Converged);
    }
    let (status, got, message) = condition(&get(fleet, name).await?, VERSION_ACCEPTED);
    assert_eq!(
        (status.as_str(), got.as_str()),
        ("False", reason),
        "{message}"
    );
    for word in words {
        assert!(message.contains(word), "{message:?} lacks {word:?}");
    }
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    ensure!(writes.is_empty(), "the refusal wrote: {writes:?}");
    assert_eq!(pods_run_their_releases_flags(fleet, "a").await?, before);
    Ok(())
}

/// 3.5.21 is below the 3.6 gate (3.5.32): asking for 3.6 is refused and
/// names 3.5.32; asking for 3.7 skips a minor and names 3.6.11; nothing is
/// written to the workload cluster, no member restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_below_the_gate_is_refused_with_nothing_touched() -> Result<()> {
    let Some(old) = require_etcd(EtcdVersion::V3_5Old) else {
        return Ok(());
    };
    let (Some(v36), Some(v37)) = (EtcdVersion::V3_6.release(), EtcdVersion::V3_7.release()) else {
        anyhow::bail!("hack/upstream pins no 3.6 or 3.7");
    };
    let (fleet, ctl) = running(&["a"], &[cluster("old", "a", 3, &old.release)]).await?;
    refused_untouched(
        &fleet,
        &ctl,
        "old",
        &v36,
        "PatchTooOldForMinorUpgrade",
        &[
            &old.release,
            "requires 3.5.32 or later first",
            "upgrade to 3.5.32 or a newer 3.5 patch",
            "keeps its current version",
        ],
    )
    .await?;
    refused_untouched(
        &fleet,
        &ctl,
        "old",
        &v37,
        "SkipsMinor",
        &["first to 3.6.11 or a newer 3.6 patch"],
    )
    .await?;
    let c = get(&fleet, "old").await?;
    assert_eq!(
        c.status
            .as_ref()
            .context("status")?
            .current_version
            .as_deref(),
        Some(old.release.as_str())
    );
    Ok(())
}

/// etcd 3.4 is out of support: the cluster runs (a warning, not a
/// refusal), the condition names the path, and upgrading clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_3_4_runs_with_an_end_of_support_warning_naming_the_path() -> Result<()> {
    let Some(v34) = require_etcd(EtcdVersion::V3_4) else {
        return Ok(());
    };
    let (fleet, _ctl) = running(&["a"], &[cluster("legacy", "a", 1, &v34.release)]).await?;
    let c = get(&fleet, "legacy").await?;
    let (status, reason, message) = condition(&c, VERSION_SUPPORTED);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "EndOfSupport")
    );
    assert!(
        message.contains("upgrade to 3.5 (3.5.32 or later, so that 3.6 can follow)"),
        "{message}"
    );
    assert_eq!(condition(&c, VERSION_ACCEPTED).0, "True");
    assert!(conditions::is_true(
        &c.status.as_ref().unwrap().conditions,
        conditions::AVAILABLE
    ));
    Ok(())
}

/// A cluster with a backup destination (here a directory) whose spec asks
/// for the next minor: a snapshot is streamed there, verified and recorded
/// in `status.versionChangeSnapshot` before the StatefulSet is rewritten;
/// the object is a snapshot etcd's own tool reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_minor_upgrade_snapshots_to_the_backup_destination_first_and_records_it() -> Result<()> {
    let Some((old, new)) = require_both(EtcdVersion::V3_5Latest, EtcdVersion::V3_6) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let mut c = cluster("safe", "a", 3, &old.release);
    c.spec.config.backup = Some(etcdfleet_api::BackupSpec {
        destination: Some(etcdfleet_api::ObjectStoreDestination {
            path: Some(dir.path().display().to_string()),
            prefix: Some("before-upgrades".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let (fleet, mut ctl) = running(&["a"], &[c]).await?;
    put(&fleet, "a", "safe", 3, "in-the-snapshot").await?;
    let roll = roll_under_a_writer(
        &fleet,
        &mut ctl,
        "safe",
        "a",
        &new.release,
        Duration::from_secs(240),
    )
    .await?;
    let steps: Vec<&Step> = roll.log.steps.iter().map(|(_, s)| s).collect();
    let snapshot = steps
        .iter()
        .position(|s| matches!(s, Step::Version(VersionStep::SnapshotBefore { .. })))
        .context("a snapshot was taken")?;
    let written = steps
        .iter()
        .position(|s| matches!(s, Step::WriteObjects(k) if k.contains(&ObjectKind::StatefulSet)))
        .context("the StatefulSet was written")?;
    assert!(snapshot < written, "snapshot first: {steps:?}");
    assert_runs(&fleet, "a", "safe", &new.release).await?;
    let status = get(&fleet, "safe").await?.status.context("status")?;
    let taken = status
        .version_change_snapshot
        .context("status.versionChangeSnapshot")?;
    assert_eq!(
        (taken.from.as_str(), taken.to.as_str()),
        (old.release.as_str(), new.release.as_str())
    );
    assert!(taken.object_key.starts_with("before-upgrades/team-a/safe/"));
    let file = dir.path().join(&taken.object_key);
    let bytes = std::fs::read(&file)?;
    assert_eq!(bytes.len() as i64, taken.size_bytes);
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, taken.sha256);
    let out = std::process::Command::new(old.etcdutl.as_ref().context("etcdutl")?)
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()?;
    assert!(
        out.status.success(),
        "etcdutl snapshot status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "snapshot before {} -> {}: {} ({} bytes, revision {}): {}",
        taken.from,
        taken.to,
        taken.object_key,
        taken.size_bytes,
        taken.revision,
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(())
}

/// The snapshot before a minor upgrade cannot be stored (the destination
/// directory cannot be made): the upgrade is refused with the failure named
/// and nothing in the workload cluster changes; once the destination is
/// fixed, the snapshot is taken and the upgrade goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_snapshot_refuses_the_upgrade_with_nothing_touched() -> Result<()> {
    let Some((old, new)) = require_both(EtcdVersion::V3_5Latest, EtcdVersion::V3_6) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"not a directory")?;
    let destination = |path: &std::path::Path| serde_json::json!({ "backup": { "destination": { "path": path.display().to_string() } } });
    let (fleet, mut ctl) = running(&["a"], &[cluster("stuck", "a", 3, &old.release)]).await?;
    patch_spec(&fleet, "stuck", destination(&blocker.join("snapshots"))).await?;
    converge_all(&fleet, &mut ctl, &["stuck"]).await?;
    let before = pods_run_their_releases_flags(&fleet, "a").await?;
    patch_spec(
        &fleet,
        "stuck",
        serde_json::json!({ "version": new.release }),
    )
    .await?;
    fleet.clear_ops();
    let mut refused = None;
    for _ in 0..10 {
        fleet.sync_all().await?;
        if let Ok(Outcome::Blocked(why)) = ctl.reconcile(NS, "stuck").await {
            refused = Some(why);
            break;
        }
    }
    let why = refused.context("the upgrade was refused")?;
    let c = get(&fleet, "stuck").await?;
    let (status, reason, message) = condition(&c, conditions::CONFLICT);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "SnapshotBeforeVersionChangeFailed"),
        "{message}"
    );
    let refusal = format!(
        "minor upgrade from {} to {} is refused",
        old.release, new.release
    );
    for words in [refusal.as_str(), "a-file/snapshots", "nothing was changed"] {
        assert!(message.contains(words), "{message:?} lacks {words:?}");
    }
    assert_eq!(why, message);
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    ensure!(writes.is_empty(), "the refusal wrote: {writes:?}");
    assert_eq!(pods_run_their_releases_flags(&fleet, "a").await?, before);

    // Fixed: refused until the retry (after the planner's backoff), then
    // the snapshot and the upgrade.
    patch_spec(&fleet, "stuck", destination(&dir.path().join("ok"))).await?;
    let mut steps = Vec::new();
    for _ in 0..20 {
        let log = converge_all(&fleet, &mut ctl, &["stuck"]).await?;
        steps.extend(log.steps.into_iter().map(|(_, s)| s));
        if get(&fleet, "stuck")
            .await?
            .status
            .context("status")?
            .current_version
            == Some(new.release.clone())
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::Version(VersionStep::SnapshotBefore { .. }))),
        "{steps:?}"
    );
    assert_runs(&fleet, "a", "stuck", &new.release).await?;
    Ok(())
}
