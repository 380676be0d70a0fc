//! `etcdfleet plan` decides as the controller does: on the same recorded
//! cluster states — converged, in the middle of a roll, with a version
//! change refused, with a member failed past its grace (the status lists it
//! unhealthy) — the offline plan made from the EtcdCluster and its status
//! names the same next step as the controller's planner on its own
//! observation of the workload cluster and etcd.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::cli::{Manifests, plan_cluster};
use etcdfleet_controllers::connector::KubeconfigLocation;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::cluster_object::ClusterObject;
use etcdfleet_controllers::etcdcluster::observe;
use etcdfleet_controllers::etcdcluster::plan::plan_next_step;
use etcdfleet_controllers::etcdcluster::plan::step::{Plan, RemovalCause, Step};
use etcdfleet_controllers::etcdcluster::resolve::resolve_cluster;
use etcdfleet_tests::driver::{TestController, fast_settings};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_both};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, get, patch_spec, running};

/// The controller's next step for `name`, from its own stages (resolve
/// without writing, connect, observe) and planner, taking no step.
async fn controller_plan(ctl: &TestController, cluster: &EtcdCluster) -> Result<Plan> {
    let ctx = &ctl.ctx;
    let mut object = ClusterObject::new(&ctx.management, cluster);
    let found = resolve_cluster(cluster, ctx, &mut object, false).await?;
    let resolved = found.resolved.context("the cluster resolves")?;
    let location = KubeconfigLocation::of(cluster).context("a kubeconfig Secret")?;
    let workload = ctx
        .connector
        .connect_trusting(&location, Duration::ZERO)
        .await?;
    let observed = observe::observe(cluster, &resolved, &workload, ctx).await?;
    Ok(plan_next_step(&observed.planner))
}

/// `etcdfleet plan`'s next step for the cluster as stored (with status).
fn offline_plan(cluster: &EtcdCluster) -> Result<Plan> {
    let mut manifests = Manifests::default();
    manifests.clusters.push(cluster.clone());
    let grace = fast_settings().member_failure_grace;
    let planned = plan_cluster(
        cluster,
        &manifests,
        k8s_openapi::jiff::Timestamp::now(),
        grace,
    );
    planned
        .planned
        .with_context(|| format!("plan asked no planner: {}", planned.next))
}

/// Both planners on the cluster as it is now; they must agree.
async fn same_next_step(fleet: &Fleet, ctl: &TestController, name: &str) -> Result<Plan> {
    let stored = get(fleet, name).await?;
    let controller = controller_plan(ctl, &stored).await?;
    let offline = offline_plan(&stored)?;
    ensure!(
        controller == offline,
        "controller: {controller:?}\nplan:       {offline:?}"
    );
    Ok(controller)
}

/// Reconciles `name` until its outcome satisfies `done` (syncing the
/// workload runtime between reconciles).
async fn reconcile_until(
    fleet: &Fleet,
    ctl: &TestController,
    name: &str,
    done: impl Fn(&Outcome) -> bool,
) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        fleet.sync_all().await?;
        let outcome = ctl.reconcile(NS, name).await?;
        if done(&outcome) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "still {outcome:?} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_and_the_controller_name_the_same_next_step_on_the_same_cluster_states() -> Result<()>
{
    let Some((old, new)) = require_both(EtcdVersion::V3_5Old, EtcdVersion::V3_5Latest) else {
        return Ok(());
    };
    let (fleet, ctl) = running(&["a"], &[cluster("etcd", "a", 3, &old.release)]).await?;

    // Converged.
    assert_eq!(same_next_step(&fleet, &ctl, "etcd").await?, Plan::Converged);

    // A version refused: 3.5 to 3.4 is a downgrade etcd cannot make; the
    // cluster keeps running what it runs, and nothing is to be done.
    patch_spec(&fleet, "etcd", serde_json::json!({ "version": "3.4.23" })).await?;
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    assert_eq!(same_next_step(&fleet, &ctl, "etcd").await?, Plan::Converged);

    // The middle of a roll: the StatefulSet carries the new version and no
    // member has been restarted yet: a follower goes first.
    patch_spec(
        &fleet,
        "etcd",
        serde_json::json!({ "version": new.release }),
    )
    .await?;
    reconcile_until(&fleet, &ctl, "etcd", |o| {
        matches!(o, Outcome::Acted(Step::WriteObjects(_)))
    })
    .await?;
    fleet.sync_all().await?;
    let next = same_next_step(&fleet, &ctl, "etcd").await?;
    assert!(
        matches!(next, Plan::Act(Step::RestartMember { ordinal, .. }) if ordinal != 0),
        "a follower first: {next:?}"
    );

    // A member failed past its failure grace (its data wiped: it cannot
    // rejoin), listed unhealthy in the status: both remove it.
    patch_spec(
        &fleet,
        "etcd",
        serde_json::json!({ "version": old.release }),
    )
    .await?;
    reconcile_until(&fleet, &ctl, "etcd", |o| *o == Outcome::Converged).await?;
    fleet
        .runtime("a")
        .wipe_pvc(WORKLOAD_NS, "data-etcd-etcd-1")
        .await?;
    let grace = fast_settings().member_failure_grace;
    // The status records the member unhealthy; past the grace, neither
    // reconcile nor plan has acted on it yet.
    reconcile_until(&fleet, &ctl, "etcd", |o| matches!(o, Outcome::Waiting(_))).await?;
    tokio::time::sleep(grace + Duration::from_secs(1)).await;
    fleet.sync_all().await?;
    let next = same_next_step(&fleet, &ctl, "etcd").await?;
    assert!(
        matches!(
            next,
            Plan::Act(Step::RemoveMember {
                ordinal: Some(1),
                cause: RemovalCause::Failed,
                ..
            })
        ),
        "the failed member is removed: {next:?}"
    );
    Ok(())
}
