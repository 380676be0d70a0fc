//! Online downgrades on real etcd, one minor down through etcd's downgrade
//! API, asked for by lowering `spec.version` with the acknowledgement
//! `etcdfleet.dev/allow-downgrade=<version>`: `downgrade enable` before the
//! StatefulSet is rewritten, the members replaced one at a time with the
//! leader last, a writer running throughout and a brand-new controller
//! after every step (the downgrade resumes from etcd and the cluster
//! alone), 0 acknowledged writes lost. Without the acknowledgement nothing
//! is touched; setting the version back before the first member is
//! replaced leaves the cluster as it was.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::conditions::{self, CONFLICT, VERSION_ACCEPTED};
use etcdfleet_api::version::DOWNGRADE_ANNOTATION;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::{ObjectKind, Step, VersionStep};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_both};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, converge_all, get, patch_spec, put, read_everywhere, running,
};
use etcdfleet_tests::versions::{
    annotate, assert_runs, initial_corruption_check_passed, member_statuses,
    pods_run_their_releases_flags, roll_under_a_writer, wait_member_statuses,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

fn position(steps: &[&Step], what: impl Fn(&Step) -> bool) -> Option<usize> {
    steps.iter().position(|s| what(s))
}

/// A 3-member cluster on `from`, downgraded to `to` under a writer.
async fn downgrade(from: EtcdVersion, to: EtcdVersion) -> Result<()> {
    let Some((new, old)) = require_both(from, to) else {
        return Ok(());
    };
    let (fleet, mut ctl) = running(&["a"], &[cluster("down", "a", 3, &new.release)]).await?;
    put(&fleet, "a", "down", 3, "written-before").await?;
    annotate(&fleet, "down", DOWNGRADE_ANNOTATION, Some(&old.release)).await?;
    let roll = roll_under_a_writer(
        &fleet,
        &mut ctl,
        "down",
        "a",
        &old.release,
        Duration::from_secs(240),
    )
    .await?;
    eprintln!("{}", roll.summary("downgrade", &new.release, &old.release));
    let steps: Vec<&Step> = roll.log.steps.iter().map(|(_, s)| s).collect();
    let enabled = position(&steps, |s| {
        matches!(s, Step::Version(VersionStep::EnableDowngrade { .. }))
    })
    .context("downgrade enabled")?;
    let written = position(
        &steps,
        |s| matches!(s, Step::WriteObjects(k) if k.contains(&ObjectKind::StatefulSet)),
    )
    .context("StatefulSet written")?;
    let first_restart = position(&steps, |s| matches!(s, Step::RestartMember { .. }))
        .context("a member restarted")?;
    assert!(
        enabled < written && written < first_restart,
        "enable, then the StatefulSet, then the members: {steps:?}"
    );
    let mut restarted = roll.restarted();
    restarted.sort_unstable();
    assert_eq!(restarted, [0, 1, 2], "each member once: {steps:?}");
    roll.timeline.assert_leader_last()?;
    assert!(roll.min_ready >= 2, "never more than one member down");
    assert!(roll.acknowledged > 10, "the writer kept writing");
    assert_runs(&fleet, "a", "down", &old.release).await?;
    initial_corruption_check_passed(&fleet, "a", "down")?;
    read_everywhere(&fleet, "a", "down", 3, "written-before").await?;
    let c = get(&fleet, "down").await?;
    assert!(
        !c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(DOWNGRADE_ANNOTATION),
        "the acknowledgement is withdrawn once the cluster runs {}",
        old.release
    );
    let accepted = conditions::find(&c.status.unwrap().conditions, VERSION_ACCEPTED)
        .context("VersionAccepted")?
        .clone();
    assert_eq!(accepted.status, "True", "{accepted:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn downgrade_3_6_to_3_5_restarts_the_leader_last() -> Result<()> {
    downgrade(EtcdVersion::V3_6, EtcdVersion::V3_5Latest).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn downgrade_3_7_to_3_6_restarts_the_leader_last() -> Result<()> {
    downgrade(EtcdVersion::V3_7, EtcdVersion::V3_6).await
}

/// Uids of the member pods, by name.
async fn pod_uids(fleet: &Fleet) -> Result<BTreeMap<String, Option<String>>> {
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| (p.metadata.name.unwrap_or_default(), p.metadata.uid))
        .collect())
}

/// Lowering the version without the acknowledgement is refused, naming
/// the annotation to set; nothing is written to the workload cluster or
/// asked of etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_downgrade_without_the_acknowledgement_is_refused_with_nothing_touched() -> Result<()> {
    let Some((v36, v35)) = require_both(EtcdVersion::V3_6, EtcdVersion::V3_5Latest) else {
        return Ok(());
    };
    let (fleet, ctl) = running(&["a"], &[cluster("keep", "a", 3, &v36.release)]).await?;
    // A member that joined moves its storage version to 3.6 within seconds.
    wait_member_statuses(&fleet, "a", "keep", |s| s.storage_version == "3.6.0").await?;
    let before = pod_uids(&fleet).await?;
    patch_spec(
        &fleet,
        "keep",
        serde_json::json!({ "version": v35.release }),
    )
    .await?;
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        assert_eq!(ctl.reconcile(NS, "keep").await?, Outcome::Converged);
    }
    let c = get(&fleet, "keep").await?;
    let cond = conditions::find(&c.status.as_ref().unwrap().conditions, VERSION_ACCEPTED)
        .context("VersionAccepted")?
        .clone();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "DowngradeNotAcknowledged")
    );
    let want = format!("{DOWNGRADE_ANNOTATION}={}", v35.release);
    assert!(cond.message.contains(&want), "{}", cond.message);
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    ensure!(writes.is_empty(), "the refusal wrote: {writes:?}");
    assert_eq!(pod_uids(&fleet).await?, before);
    for s in member_statuses(&fleet, "a", "keep").await? {
        assert_eq!(s.downgrade_target, None, "etcd was not asked: {s:?}");
        assert_eq!(s.storage_version, "3.6.0");
    }
    Ok(())
}

/// The downgrade is enabled and the StatefulSet rewritten; before any
/// member is replaced the version is set back: etcd's downgrade is
/// cancelled, the StatefulSet written back, no member restarted, and etcd's
/// cluster and storage versions return to 3.6.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_downgrade_before_the_first_member_is_replaced_leaves_the_cluster_as_it_was()
-> Result<()> {
    let Some((v36, v35)) = require_both(EtcdVersion::V3_6, EtcdVersion::V3_5Latest) else {
        return Ok(());
    };
    let (fleet, mut ctl) = running(&["a"], &[cluster("undo", "a", 3, &v36.release)]).await?;
    let before = pod_uids(&fleet).await?;
    annotate(&fleet, "undo", DOWNGRADE_ANNOTATION, Some(&v35.release)).await?;
    patch_spec(
        &fleet,
        "undo",
        serde_json::json!({ "version": v35.release }),
    )
    .await?;
    // Up to the StatefulSet write, and not one step further.
    let mut taken = Vec::new();
    for _ in 0..200 {
        fleet.sync_all().await?;
        if let Outcome::Acted(step) = ctl.reconcile(NS, "undo").await? {
            taken.push(step.clone());
            if matches!(&step, Step::WriteObjects(k) if k.contains(&ObjectKind::StatefulSet)) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        matches!(taken.last(), Some(Step::WriteObjects(_))),
        "reached the StatefulSet write: {taken:?}"
    );
    for s in member_statuses(&fleet, "a", "undo").await? {
        assert_eq!(s.downgrade_target.as_deref(), Some("3.5.0"), "{s:?}");
    }

    patch_spec(
        &fleet,
        "undo",
        serde_json::json!({ "version": v36.release }),
    )
    .await?;
    let log = converge_all(&fleet, &mut ctl, &["undo"]).await?;
    let steps = log.steps_of(&format!("{NS}/undo"));
    assert!(
        matches!(
            steps.first(),
            Some(Step::Version(VersionStep::CancelDowngrade { .. }))
        ),
        "cancelled first: {steps:?}"
    );
    assert!(
        !steps
            .iter()
            .any(|s| matches!(s, Step::RestartMember { .. } | Step::MoveLeader { .. })),
        "no member touched: {steps:?}"
    );
    assert_eq!(
        pod_uids(&fleet).await?,
        before,
        "every pod is the one it was"
    );
    let pods = pods_run_their_releases_flags(&fleet, "a").await?;
    assert!(pods.values().all(|r| *r == v36.release), "{pods:?}");
    // etcd raises the cluster and storage versions back within its
    // monitor interval.
    wait_member_statuses(&fleet, "a", "undo", |s| {
        s.storage_version == "3.6.0" && s.downgrade_target.is_none()
    })
    .await?;
    assert_runs(&fleet, "a", "undo", &v36.release).await?;
    let c = get(&fleet, "undo").await?;
    assert!(
        !c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(DOWNGRADE_ANNOTATION),
        "the acknowledgement is withdrawn with the cancel"
    );
    assert!(!conditions::is_true(
        &c.status.unwrap().conditions,
        CONFLICT
    ));
    Ok(())
}
