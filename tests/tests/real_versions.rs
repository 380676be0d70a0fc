//! Versions on real Kubernetes: rolling upgrades under a writer, with the
//! controller killed after every step, lose no acknowledged write; the real
//! StatefulSet controller recreates each deleted pod from the new template.
//! 3.4 → 3.5, and 3.5 → 3.6 (the path the templates' clusters take next),
//! with every pod on the flags of the release it runs. `Degraded` never
//! turns True, neither while the cluster bootstraps nor while its members
//! restart as planned.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::version_flags::version_flags;
use etcdfleet_tests::control_plane::conditions::ConditionRecorder;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, etcd_of, get, installed_world, patch_spec, put,
    read_everywhere, wait_available,
};
use etcdfleet_tests::driver::converge;
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_both, verify_acknowledged};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use etcdfleet_tests::versions::{check_flags, release_of_image};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

/// A 3-member cluster on `from`, rolled to `to` by editing `spec.version`
/// with kubectl, under a writer, with a new controller after every step.
async fn real_upgrade(from: EtcdVersion, to: EtcdVersion) -> Result<()> {
    let Some((old, new)) = require_both(from, to) else {
        return Ok(());
    };
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    let bootstrap = ConditionRecorder::start(&world, "shop").await?;
    world.apply(&cluster_yaml("shop", "w1", 3, &old.release))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    // Bootstrap is progress, never trouble: Degraded stays False throughout.
    assert_never_degraded(&bootstrap, "bootstrap");
    let reasons: Vec<String> = bootstrap
        .seen_as("Progressing", "True")
        .into_iter()
        .map(|s| s.reason)
        .collect();
    assert!(
        !reasons.is_empty(),
        "bootstrap showed no Progressing: {:?}",
        bootstrap.seen()
    );
    drop(bootstrap);
    let written = format!("written-on-{}", old.release);
    put(&world, "w1", "shop", 3, &written).await?;

    let (endpoints, config) = etcd_of(&world, "w1", "shop", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "upgrade").await?;
    let upgrade = ConditionRecorder::start(&world, "shop").await?;
    patch_spec(&world, "shop", json!({ "version": new.release }))?;
    let started = std::time::Instant::now();
    let log = converge(
        &mut ctl,
        &[(NS, "shop")],
        Duration::from_secs(300),
        || async { Ok(()) },
        |_, _, ctl| {
            // The controller dies after every step; a new one takes over.
            ctl.restart();
            Ok(())
        },
    )
    .await?;
    let took = started.elapsed();
    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "upgrade").await?;
    eprintln!(
        "real upgrade {} -> {}: {:.1} s, {} writes acknowledged, {checked} verified, 0 lost",
        old.release,
        new.release,
        took.as_secs_f64(),
        report.acknowledged.len()
    );
    assert!(
        report.acknowledged.len() > 10,
        "the writer kept writing: {report:?}"
    );

    let restarted: Vec<u32> = log
        .steps_of(&format!("{NS}/shop"))
        .iter()
        .filter_map(|s| match s {
            Step::RestartMember { ordinal, .. } => Some(*ordinal),
            _ => None,
        })
        .collect();
    let mut sorted = restarted.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        vec![0, 1, 2],
        "each member restarted once: {restarted:?}"
    );
    wait_available(&world, "shop")?;
    // Each planned restart showed as planned, not as Degraded.
    assert_never_degraded(&upgrade, "the rolling upgrade");
    let planned = upgrade.seen_as("Degraded", "False");
    assert!(
        planned.iter().any(|s| s.reason == "PlannedDisruption"),
        "no restart was reported as planned: {:?}",
        upgrade.seen()
    );
    read_everywhere(&world, "w1", "shop", 3, &written).await?;
    let status = get(&world, "shop").await?.status.context("status")?;
    assert_eq!(
        status.current_version.as_deref(),
        Some(new.release.as_str()),
        "{status:#?}"
    );
    let pods: Api<Pod> = Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let pods = pods.list(&ListParams::default()).await?.items;
    ensure!(pods.len() == 3, "{} pods", pods.len());
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let container = &pod.spec.context("spec")?.containers[0];
        let image = container.image.clone().unwrap_or_default();
        assert_eq!(
            release_of_image(&image),
            Some(new.release.as_str()),
            "{image}"
        );
        let args = container.args.clone().unwrap_or_default();
        check_flags(&name, &new.release, &args)?;
        assert!(!version_flags(&new.release).is_empty());
    }
    Ok(())
}

/// `Degraded` never turned True while `recorder` watched.
fn assert_never_degraded(recorder: &ConditionRecorder, during: &str) {
    let degraded = recorder.seen_as("Degraded", "True");
    assert!(
        degraded.is_empty(),
        "Degraded turned True during {during}: {degraded:#?}"
    );
    assert!(
        !recorder.seen_as("Degraded", "False").is_empty(),
        "the recorder saw no Degraded condition during {during}: {:?}",
        recorder.seen()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_rolling_upgrade_3_4_to_3_5_under_a_writer_across_controller_restarts() -> Result<()> {
    real_upgrade(EtcdVersion::V3_4, EtcdVersion::V3_5Latest).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_rolling_upgrade_3_5_to_3_6_under_a_writer_across_controller_restarts() -> Result<()> {
    real_upgrade(EtcdVersion::V3_5Latest, EtcdVersion::V3_6).await
}
