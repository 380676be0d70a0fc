//! `etcdfleet run` as a process on real Kubernetes, under exactly the RBAC
//! the dev stage ships (its ServiceAccount's token, its ConfigMap): it
//! converges a cluster through port-forward, and the API servers' audit
//! logs show every request it made allowed, and no write once converged.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_tests::control_plane::AuditLog;
use etcdfleet_tests::control_plane::scenario::{
    cluster_yaml, installed_world, put, read_everywhere, wait_ready_members,
};
use etcdfleet_tests::controller_process::ControllerProcess;

const CONTROLLER: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-controller";
const WORKLOAD_USER: &str = "etcdfleet-controller";

fn refused(log: &AuditLog, user: &str) -> Vec<String> {
    log.by(user)
        .into_iter()
        .filter(|e| e.code() == 401 || e.code() == 403)
        .map(ToString::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_run_process_under_the_shipped_rbac_converges_with_every_request_allowed() -> Result<()>
{
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, world.installed_controller_config()?)?;
    let kubeconfig = world
        .management
        .kubeconfig_with_token(&world.controller_token().await?);
    let config_arg = config.display().to_string();
    let p = ControllerProcess::start(
        "real-run",
        &kubeconfig,
        &[
            "--config",
            &config_arg,
            "--log-format",
            "text",
            "--requeue-converged-seconds",
            "2",
        ],
    );
    p.wait_for_status("/readyz", 200, Duration::from_secs(60));
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    wait_ready_members(&world, "shop", 3).with_context(|| p.log())?;
    put(&world, "w1", "shop", 3, "k").await?;
    read_everywhere(&world, "w1", "shop", 3, "k").await?;

    // Converged: a few polls (2 s each) write nothing anywhere.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let workload = &world.workload("w1").plane;
    let (m0, w0) = (world.management.audit()?.len(), workload.audit()?.len());
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (management, workload_log) = (world.management.audit()?, workload.audit()?);
    let writes: Vec<String> = management
        .by_since(CONTROLLER, m0)
        .into_iter()
        .chain(workload_log.by_since(WORKLOAD_USER, w0))
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(ToString::to_string)
        .collect();
    let reads = workload_log
        .by_since(WORKLOAD_USER, w0)
        .iter()
        .filter(|e| e.is_read())
        .count();
    eprintln!(
        "converged for {:?}: {} writes, {reads} workload reads",
        quiet.elapsed(),
        writes.len()
    );
    ensure!(
        writes.is_empty(),
        "writes of a converged cluster: {writes:#?}"
    );

    // Every request of the run, on both API servers, was allowed.
    assert!(
        !management.by(CONTROLLER).is_empty(),
        "the controller used its own identity"
    );
    assert!(
        workload_log
            .by(WORKLOAD_USER)
            .iter()
            .any(|e| e.resource() == "pods/portforward"),
        "etcd was reached through pods/portforward"
    );
    assert_eq!(refused(&management, CONTROLLER), Vec::<String>::new());
    assert_eq!(refused(&workload_log, WORKLOAD_USER), Vec::<String>::new());
    Ok(())
}
