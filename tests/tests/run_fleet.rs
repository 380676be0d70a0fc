//! `etcdfleet run` as a process reconciling real etcd end to end, installed
//! the way a platform team installs it: the staging overlay rendered by
//! `kubectl kustomize config/stages/staging` gives both the RBAC the
//! management API enforces (a Role in `team-a` only, no ClusterRole for
//! EtcdClusters) and the configuration file the process runs with. The
//! controller reaches etcd through `pods/portforward` of the workload API
//! server (the default dialer), built from the kubeconfig Secret, with the
//! workload RBAC of `config/workload-rbac` enforced.
//!
//! One cluster goes through create → scale 1 → 3 → upgrade 3.4 → 3.5 →
//! delete with its data kept throughout; every request the controller made
//! must have been allowed by the stage's rules and the workload rules.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::controller_process::{ControllerProcess, repo};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, cluster_version, create, get, patch_spec, put, read_everywhere,
};
use etcdfleet_tests::stage::{controller_config, kustomize, rbac_yaml};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, DeleteParams};

const STAGE_LABEL: (&str, &str) = ("etcdfleet.dev/stage", "staging");

/// A cluster of the staging stage (labelled for its selector).
fn staging_cluster(name: &str, replicas: i32, version: &str) -> EtcdCluster {
    let mut c = cluster(name, "shop", replicas, version);
    c.metadata.labels = Some(
        [(STAGE_LABEL.0.to_string(), STAGE_LABEL.1.to_string())]
            .into_iter()
            .collect(),
    );
    c
}

/// Polls `name` until `done` holds of it, or fails with what was last seen
/// and the controller's log.
async fn wait_for(
    fleet: &Fleet,
    process: &ControllerProcess,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&EtcdCluster) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let c = get(fleet, name).await?;
        if done(&c) {
            let took = started.elapsed();
            eprintln!("{name}: {what} after {took:?}");
            return Ok(took);
        }
        if started.elapsed() > timeout {
            bail!(
                "{name}: not {what} within {timeout:?}; status: {:#?}\ncontroller log:\n{}",
                c.status,
                process.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(c: &EtcdCluster, members: i32, version: &str) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.ready_members == members
            && s.members.len() == members as usize
            && s.current_version.as_deref() == Some(version)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_under_the_staging_overlay_creates_scales_upgrades_and_deletes_on_real_etcd()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let stage = repo().join("config/stages/staging");
    let Some(docs) = kustomize(&stage) else {
        return Ok(());
    };
    let management = ApiServer::start(MANAGEMENT, &[]).await?;
    management.add_rbac_yaml(&rbac_yaml(&docs))?;
    let fleet = Fleet::with_management_api(management, NS, &["shop"]).await?;
    let _kubelets = fleet.spawn_background_sync(Duration::from_millis(100));

    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("config.yaml");
    std::fs::write(
        &config_file,
        controller_config(&docs).context("the overlay generates the controller's ConfigMap")?,
    )?;
    let token = fleet.management_api().issue_token(CONTROLLER_USER);
    let mut process = ControllerProcess::start(
        "staging",
        &fleet.management_api().kubeconfig(&token),
        &[
            "--config",
            config_file.to_str().context("UTF-8 temp path")?,
            "--log-format",
            "text",
        ],
    );

    // A cluster of another stage in the same namespace: never touched.
    let mut foreign = cluster("prod-shop", "shop", 1, "3.5.1");
    foreign.metadata.labels = Some(
        [(STAGE_LABEL.0.to_string(), "prod".to_string())]
            .into_iter()
            .collect(),
    );
    create(&fleet, &foreign).await?;

    // Create: one member on 3.4, reached through the workload API's tunnels.
    create(&fleet, &staging_cluster("shop", 1, "3.4.23")).await?;
    let created = wait_for(
        &fleet,
        &process,
        "shop",
        "available with 1 member",
        Duration::from_secs(90),
        |c| ready(c, 1, "3.4.23"),
    )
    .await?;
    put(&fleet, "shop", "shop", 1, "written-at-1").await?;

    // Scale 1 → 3: learners join, are promoted; the data is on every member.
    patch_spec(&fleet, "shop", serde_json::json!({ "replicas": 3 })).await?;
    let scaled = wait_for(
        &fleet,
        &process,
        "shop",
        "available with 3 members",
        Duration::from_secs(120),
        |c| ready(c, 3, "3.4.23"),
    )
    .await?;
    read_everywhere(&fleet, "shop", "shop", 3, "written-at-1").await?;
    put(&fleet, "shop", "shop", 3, "written-at-3").await?;

    // Upgrade 3.4 → 3.5, one member at a time.
    patch_spec(&fleet, "shop", serde_json::json!({ "version": "3.5.1" })).await?;
    let upgraded = wait_for(
        &fleet,
        &process,
        "shop",
        "upgraded to 3.5.1",
        Duration::from_secs(120),
        |c| ready(c, 3, "3.5.1"),
    )
    .await?;
    // etcd moves the cluster version itself (its leader checks every few
    // seconds) once every member runs 3.5.
    let deadline = Instant::now() + Duration::from_secs(15);
    for ordinal in 0..3 {
        loop {
            let version = cluster_version(&fleet, "shop", "shop", ordinal)?;
            if version == "3.5" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "member {ordinal} reports cluster version {version}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    read_everywhere(&fleet, "shop", "shop", 3, "written-at-1").await?;
    read_everywhere(&fleet, "shop", "shop", 3, "written-at-3").await?;

    // Delete: the finalizer goes once the workload objects are gone.
    let clusters: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    clusters.delete("shop", &DeleteParams::default()).await?;
    let started = Instant::now();
    while clusters.get_opt("shop").await?.is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "shop not deleted within 60 s:\n{}",
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deleted = started.elapsed();
    let statefulsets: Api<StatefulSet> =
        Api::namespaced(fleet.workload_client("shop"), WORKLOAD_NS);
    assert!(
        statefulsets.get_opt("shop-etcd").await?.is_none(),
        "the StatefulSet went with the cluster"
    );

    // The other stage's cluster: no finalizer, no status, nothing made.
    let foreign = get(&fleet, "prod-shop").await?;
    assert!(
        foreign.metadata.finalizers.unwrap_or_default().is_empty(),
        "the staging controller left the prod cluster alone"
    );
    assert!(foreign.status.is_none());

    // Everything the controller did, the shipped rules allowed; it reached
    // etcd only through the workload API's port-forward.
    assert_eq!(fleet.management_api().denied(), Vec::<String>::new());
    assert_eq!(fleet.workload_api("shop").denied(), Vec::<String>::new());
    assert_eq!(fleet.secret_lists_or_watches(), vec![]);
    let tunnels = fleet.portforward("shop").tunnels_opened();
    assert!(tunnels > 0, "etcd was reached through port-forward");

    eprintln!(
        "run (staging overlay, port-forward): create {created:?}, scale 1→3 {scaled:?}, \
         upgrade 3.4→3.5 {upgraded:?}, delete {deleted:?}; {tunnels} tunnels"
    );
    process.signal(libc::SIGTERM);
    let status = process
        .wait_exit(Duration::from_secs(10))
        .context("run exits after SIGTERM")?;
    assert!(status.success(), "{status}:\n{}", process.log());
    fleet.shutdown().await;
    Ok(())
}
