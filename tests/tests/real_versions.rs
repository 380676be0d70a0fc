//! Versions on real Kubernetes: a rolling upgrade under a writer, with the
//! controller killed after every step, loses no acknowledged write; the real
//! StatefulSet controller recreates each deleted pod from the new template.

use std::time::Duration;

use anyhow::{Context as _, Result};
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, etcd_of, get, installed_world, put, read_everywhere,
    wait_available,
};
use etcdfleet_tests::driver::converge;
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_rolling_upgrade_3_4_to_3_5_under_a_writer_across_controller_restarts() -> Result<()> {
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 3, "3.4.23"))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    put(&world, "w1", "shop", 3, "written-on-3.4").await?;

    let (endpoints, config) = etcd_of(&world, "w1", "shop", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "upgrade").await?;
    world.kubectl(&[
        "patch",
        "-n",
        NS,
        "etcdcluster/shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"version":"3.5.1"}}"#,
    ])?;
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
    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "upgrade").await?;
    eprintln!(
        "upgrade: {} writes acknowledged, {checked} verified, 0 lost",
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
    read_everywhere(&world, "w1", "shop", 3, "written-on-3.4").await?;
    let status = get(&world, "shop").await?.status.context("status")?;
    assert_eq!(
        status.current_version.as_deref(),
        Some("3.5.1"),
        "{status:#?}"
    );
    let pods: Api<Pod> = Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    for pod in pods.list(&ListParams::default()).await?.items {
        let image = pod.spec.context("spec")?.containers[0]
            .image
            .clone()
            .unwrap_or_default();
        assert!(image.ends_with(":v3.5.1"), "{image}");
    }
    Ok(())
}
