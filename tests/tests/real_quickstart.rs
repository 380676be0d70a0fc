//! The README's quickstart, run verbatim on real control planes: every
//! ```sh block under `## Quickstart`, in order, with bash and the kubectl of
//! the Kubernetes build, from an empty management cluster to an Available
//! EtcdCluster, then the upgrade, backup and restore it shows. The first
//! block holds the reader's own values; the test supplies its own instead
//! (its workload cluster's admin kubeconfig, its S3 server). If the README
//! changes and its commands stop working, this fails. It runs twice: on the
//! process kubelet, and on real nodes, where the controller the quickstart
//! installs is a container of the image `make image` built, and the restore
//! seeder a container of it inside etcd's.

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_tests::control_plane::readme::{checkout, run_block, sh_blocks};
use etcdfleet_tests::control_plane::scenario::{put, read_everywhere};
use etcdfleet_tests::control_plane::{ADMIN_USER, KubeWorld, RealWorldSpec, require_kubernetes};
use etcdfleet_tests::image::require_image;
use etcdfleet_tests::real_node::{NodeImage, require_real_nodes, run_isolated};
use etcdfleet_tests::s3::S3Server;

const BUCKET: &str = "quickstart-backups";

/// The quickstart's blocks: the first holds the reader's own values.
fn quickstart_blocks() -> Result<Vec<String>> {
    let blocks = sh_blocks("Quickstart")?;
    ensure!(
        blocks.len() >= 5,
        "expected the quickstart's blocks, found {}",
        blocks.len()
    );
    ensure!(
        blocks[0].contains("export WORKLOAD_KUBECONFIG"),
        "the first block sets the reader's values"
    );
    Ok(blocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_quickstart_of_the_readme_runs_verbatim_from_an_empty_cluster() -> Result<()> {
    let Some(binaries) = require_kubernetes() else {
        return Ok(());
    };
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    let world = KubeWorld::start(binaries, &["w1"]).await?;
    let kubeconfig = world.workload("w1").plane.admin_kubeconfig();
    run_quickstart(&world, &s3, &kubeconfig).await
}

/// The quickstart with the controller as a pod of the image `make image`
/// built, on real nodes. It found what the process kubelet hides (it runs
/// an image's binary on the machine): the image carried no CA bundle, so
/// `EtcdBackup` failed with "destination: Generic HTTP client error:
/// builder error", and the restore's `install-seeder` ran `etcdfleet` by
/// name in an image that holds `/etcdfleet` and sets no `PATH`.
#[test]
fn real_node_quickstart_of_the_readme_runs_verbatim_with_the_controller_as_a_pod() {
    let Some(binaries) = require_kubernetes() else {
        return;
    };
    let Some(tools) = require_real_nodes(&binaries) else {
        return;
    };
    let Some(image) = require_image() else {
        return;
    };
    run_isolated(|| async move {
        let Some(s3) = S3Server::start_for_pods() else {
            return Ok(());
        };
        let spec = RealWorldSpec {
            tools: &tools,
            workload_names: &["w1"],
            management_nodes: 0,
            extra_images: vec![],
            csi: None,
        }
        .with_controller_pod(NodeImage::controller(&image.layout(), &image.tag));
        let world = KubeWorld::start_real_nodes(binaries, spec).await?;
        // The reader's admin kubeconfig names the address the controller's
        // pod reaches the workload cluster at (the quickstart copies it).
        let kubeconfig = world.workload("w1").plane.kubeconfig_for_pods(ADMIN_USER);
        let result = run_quickstart(&world, &s3, &kubeconfig).await;
        result.map_err(|e| {
            let nodes = world.workload("w1").nodes.real().log_tails(20);
            e.context(format!("workload nodes:{nodes}"))
        })
    });
}

/// Every block after the reader's values, in a checkout of the manifests,
/// with the test's workload admin kubeconfig and S3 server as the values.
async fn run_quickstart(world: &KubeWorld, s3: &S3Server, workload_admin: &str) -> Result<()> {
    s3.create_bucket(BUCKET)?;
    let blocks = quickstart_blocks()?;
    let dir = tempfile::tempdir()?;
    checkout(dir.path())?;
    let workload_kubeconfig = dir.path().join("workload-admin.kubeconfig");
    std::fs::write(&workload_kubeconfig, workload_admin)?;
    let env: Vec<(String, String)> = [
        (
            "WORKLOAD_KUBECONFIG",
            workload_kubeconfig.display().to_string(),
        ),
        ("S3_ENDPOINT", s3.endpoint()),
        ("S3_BUCKET", BUCKET.to_string()),
        ("S3_ALLOW_HTTP", "true".to_string()),
        (
            "AWS_ACCESS_KEY_ID",
            etcdfleet_tests::s3::ACCESS_KEY_ID.to_string(),
        ),
        (
            "AWS_SECRET_ACCESS_KEY",
            etcdfleet_tests::s3::SECRET_ACCESS_KEY.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();

    let started = Instant::now();
    let mut available_after = None;
    for block in &blocks[1..] {
        if block.contains("etcdbackup.yaml") {
            // Data the restore must bring back.
            put(world, "w1", "shop", 3, "before-the-backup").await?;
        }
        run_block(world, dir.path(), &env, block)?;
        if available_after.is_none() && block.contains("--for=condition=Available") {
            available_after = Some(started.elapsed());
        }
    }
    let available_after = available_after.context("no block waits for Available")?;
    // docs/development.md: about 12 s from an empty management cluster to
    // an Available three-member cluster (the controller's Deployment
    // starting, then each learner's 5 s strict-reconfiguration wait).
    assert!(
        available_after <= std::time::Duration::from_secs(45),
        "Available only after {available_after:?}"
    );
    eprintln!(
        "quickstart: empty control plane to Available in {:.1} s; every block in {:.1} s",
        available_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    read_everywhere(world, "w1", "shop-restored", 3, "before-the-backup").await?;
    Ok(())
}
