//! The first rule, proven across a real release boundary: installing a new
//! controller release changes nothing in any workload cluster until a CR
//! changes.
//!
//! The previous release (the newest entry of CHANGELOG.md with a commit) is
//! built from its commit (`hack/build-release.sh`: a git worktree, the
//! binary cached by commit) and installed as a platform team installs a
//! release, with ITS manifests: its CRDs, its dev stage with the controller
//! image pinned to its tag, its workload RBAC. The management cluster's
//! process kubelet runs that image as the previous release's binary, the
//! workload kubelets run it as the seeder of a restore. It runs a varied
//! fleet until converged: a 3-member cluster with data, a cluster restored
//! from its backup in another workload cluster, a cluster with a backup
//! schedule, and a paused one. Then this tree's manifests are applied the
//! same way (CRDs, dev stage, workload RBAC with the old ClusterRole
//! removed, as CHANGELOG.md's upgrade notes say): the Deployment controller
//! rolls the controller's pod over to this release's image (`maxSurge: 0`:
//! the old pod gets SIGTERM, then the new one starts). Over several
//! converged polls of the new pod the test counts every write the
//! controller's identity makes on each workload API server (audit logs) and
//! every change of any etcdfleet object (uid, generation, spec, objects new
//! or gone). Zero is the only passing figure. One kind of change is not the
//! controller's: the stage carries the platform's ClusterEtcdTemplates, so
//! a release whose templates changed updates them when its stage is
//! applied (v0.2.0's ha-3 and ha-5 did). Those are reported apart, and only
//! when the template's spec is now exactly what the applied stage ships;
//! they change no existing cluster (a template is read at creation), which
//! the zero workload writes and the unchanged EtcdClusters show.
//!
//! Both stages are applied with converged clusters re-polled every 2 s
//! instead of the shipped 60 s, so several polls fit in the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, put, read_everywhere, wait_ready_members,
};
use etcdfleet_tests::control_plane::{KubeWorld, require_kubernetes};
use etcdfleet_tests::controller_process::{http_get, repo};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::image::BuiltImage;
use etcdfleet_tests::release::{BuiltRelease, build_release};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::s3::{CREDENTIALS, S3Server, put_credentials_in};
use serde_json::Value;

const WORKLOAD_USER: &str = "etcdfleet-controller";
const WORKLOADS: [&str; 2] = ["w1", "w2"];
const CONTROLLER_NS: &str = "etcdfleet-system";
const KINDS: [&str; 5] = [
    "etcdclusters",
    "etcdtemplates",
    "clusteretcdtemplates",
    "etcdbackups",
    "etcdbackupschedules",
];
/// The fleet's EtcdClusters and their sizes.
const FLEET: [(&str, u32); 4] = [("shop", 3), ("sched", 1), ("idle", 1), ("restored", 1)];
/// Converged polls of every cluster counted after the rollout.
const POLLS: u64 = 6;
/// The converged requeue both stages are applied with (the shipped 60 s
/// would make six polls six minutes).
const REQUEUE_SECONDS: u64 = 2;

/// Every etcdfleet object: `kind/ns/name` → [uid, generation, spec].
fn objects(world: &KubeWorld) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for kind in KINDS {
        for (key, item) in world.list_all(kind, &format!("{kind}.etcdfleet.dev"))? {
            let m = &item["metadata"];
            out.insert(
                key,
                serde_json::json!([m["uid"], m["generation"], item["spec"]]),
            );
        }
    }
    Ok(out)
}

/// Every object that changed (uid, generation or spec), is new or is gone,
/// as `key: what`.
fn spec_changes(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> Vec<(String, String)> {
    let mut changes = Vec::new();
    for (key, b) in before {
        match after.get(key) {
            None => changes.push((key.clone(), "gone".to_string())),
            Some(a) if a != b => changes.push((key.clone(), format!("{b} -> {a}"))),
            Some(_) => {}
        }
    }
    changes.extend(
        after
            .keys()
            .filter(|k| !before.contains_key(*k))
            .map(|k| (k.clone(), "new".to_string())),
    );
    changes
}

/// The ClusterEtcdTemplates a rendered stage ships (the platform's
/// templates are part of it): `clusteretcdtemplates//<name>` → spec.
fn shipped_templates(rendered: &str) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for doc in etcdfleet_api::yaml::documents(rendered)? {
        if doc["kind"] == "ClusterEtcdTemplate" {
            let name = doc["metadata"]["name"].as_str().context("a name")?;
            out.insert(format!("clusteretcdtemplates//{name}"), doc["spec"].clone());
        }
    }
    Ok(out)
}

/// Splits `changes` into those the applied manifests made (a shipped
/// ClusterEtcdTemplate, same uid, whose spec is now exactly the shipped
/// one) and every other.
fn attribute(
    changes: Vec<(String, String)>,
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    shipped: &BTreeMap<String, Value>,
) -> (Vec<String>, Vec<String>) {
    let (by_manifests, other): (Vec<_>, Vec<_>) = changes.into_iter().partition(|(key, _)| {
        matches!(
            (before.get(key), after.get(key), shipped.get(key)),
            (Some(b), Some(a), Some(spec)) if a[0] == b[0] && a[2] == *spec
        )
    });
    let show = |v: Vec<(String, String)>| v.into_iter().map(|(k, w)| format!("{k}: {w}")).collect();
    (show(by_manifests), show(other))
}

/// `kubectl kustomize dir`, with the controller image pinned to `tag` when
/// given (what a stage's `images: newTag` does) and the converged requeue
/// set to [`REQUEUE_SECONDS`].
fn render_stage(world: &KubeWorld, dir: &Path, tag: Option<&str>) -> Result<String> {
    let rendered = world.kubectl(&["kustomize", &dir.display().to_string()])?;
    let mut out = String::new();
    let (mut images, mut requeues) = (0, 0);
    for line in rendered.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let (Some(tag), true) = (tag, trimmed.starts_with("image: etcdfleet/controller:")) {
            out.push_str(&format!("{indent}image: etcdfleet/controller:{tag}\n"));
            images += 1;
        } else if trimmed.starts_with("requeueConvergedSeconds:") {
            out.push_str(&format!(
                "{indent}requeueConvergedSeconds: {REQUEUE_SECONDS}\n"
            ));
            requeues += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    ensure!(
        requeues == 1 && (tag.is_none() || images == 1),
        "{}: {images} controller images, {requeues} requeue settings",
        dir.display()
    );
    Ok(out)
}

/// Applies the CRDs of `root`, then its dev stage (see [`render_stage`]);
/// returns the stage as applied.
fn install_release(world: &KubeWorld, root: &Path, tag: Option<&str>) -> Result<String> {
    world.install_crds(&root.join("config/crd").display().to_string())?;
    let stage = render_stage(world, &root.join("config/stages/dev"), tag)?;
    world.apply(&stage)?;
    Ok(stage)
}

/// The previous release as a platform team installed it: its manifests,
/// its image tag, its workload RBAC.
fn install_previous(world: &KubeWorld, previous: &BuiltRelease) -> Result<()> {
    install_release(world, &previous.worktree, Some(&previous.version))?;
    for w in WORKLOADS {
        world.kubectl_workload(
            w,
            &[
                "apply",
                "--server-side",
                "-k",
                &previous.path("config/workload-rbac"),
            ],
        )?;
    }
    Ok(())
}

/// This tree's manifests over the previous release's, as CHANGELOG.md's
/// upgrade notes say; returns the dev stage as applied.
fn install_head(world: &KubeWorld) -> Result<String> {
    let stage = install_release(world, &repo(), None)?;
    world.install_workload_rbac()?;
    for w in WORKLOADS {
        world.kubectl_workload(
            w,
            &[
                "delete",
                "clusterrolebinding,clusterrole",
                "etcdfleet-workload",
                "--ignore-not-found",
            ],
        )?;
    }
    Ok(stage)
}

/// The controller's pod once it is the only one, ready, running `image`:
/// (name, pod IP).
async fn rolled_out(world: &KubeWorld, image: &str) -> Result<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let pods: Value = serde_json::from_str(&world.kubectl(&[
            "get",
            "pods",
            "-n",
            CONTROLLER_NS,
            "-l",
            "app.kubernetes.io/component=controller",
            "-o",
            "json",
        ])?)?;
        let items = pods["items"].as_array().context("items")?;
        if let [pod] = &items[..]
            && pod["spec"]["containers"][0]["image"] == image
            && pod["metadata"]["deletionTimestamp"].is_null()
            && pod["status"]["containerStatuses"][0]["ready"] == true
            && let (Some(name), Some(ip)) = (
                pod["metadata"]["name"].as_str(),
                pod["status"]["podIP"].as_str(),
            )
        {
            return Ok((name.to_string(), ip.to_string()));
        }
        if Instant::now() > deadline {
            bail!(
                "no single ready controller pod of {image}: {items:#?}\n{}",
                world.management_kubelet().runtime.all_pod_logs(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Which binary the kubelet runs for the controller's pod `pod`.
async fn executable(world: &KubeWorld, pod: &str) -> Result<PathBuf> {
    let exe = world
        .management_kubelet()
        .runtime
        .pod_executable(CONTROLLER_NS, pod)
        .await
        .with_context(|| format!("pod {pod} runs no process"))?;
    Ok(exe.canonicalize().unwrap_or(exe))
}

/// A counter of the controller pod's `/metrics` (summed over its labels).
fn metric(ip: &str, name: &str) -> Option<f64> {
    let (_, body) = http_get(format!("{ip}:8080").parse().ok()?, "/metrics")?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Waits [`POLLS`] converged requeue periods and until the controller pod
/// at `ip` made [`POLLS`] reconciles per cluster of the fleet (its
/// `etcdfleet_reconciles_total`, which counts since the pod started); fails
/// if it does not in time.
async fn wait_polls(world: &KubeWorld, ip: &str) -> Result<f64> {
    let want = (FLEET.len() as u64 * POLLS) as f64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(POLLS * REQUEUE_SECONDS * 4 + 60);
    loop {
        let done = metric(ip, "etcdfleet_reconciles_total").unwrap_or(0.0);
        if done >= want && start.elapsed() >= Duration::from_secs(POLLS * REQUEUE_SECONDS) {
            return Ok(done);
        }
        if Instant::now() > deadline {
            bail!(
                "{done} reconciles, not {want}, in time:\n{}",
                world.management_kubelet().runtime.all_pod_logs(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The varied fleet, created under the previous release and converged.
async fn create_fleet(world: &KubeWorld, s3: &S3Server) -> Result<()> {
    let logs = || world.management_kubelet().runtime.all_pod_logs(40);
    for (name, replicas) in &FLEET[..3] {
        world.apply(&cluster_yaml(name, "w1", *replicas as i32, "3.5.1"))?;
    }
    for (name, replicas) in &FLEET[..3] {
        wait_ready_members(world, name, *replicas).with_context(logs)?;
    }
    for i in 0..10 {
        put(world, "w1", "shop", 3, &format!("key-{i}")).await?;
    }
    world.apply(&backups_yaml(s3))?;
    world
        .kubectl(&[
            "wait",
            "-n",
            NS,
            "--timeout=120s",
            "--for=jsonpath={.status.phase}=Succeeded",
            "etcdbackup/shop-now",
        ])
        .with_context(logs)?;
    let mut restored = cluster_yaml("restored", "w2", 1, "3.5.1");
    restored.push_str("  bootstrap:\n    restore:\n      backupName: shop-now\n");
    world.apply(&restored)?;
    wait_ready_members(world, "restored", 1).with_context(logs)?;
    read_everywhere(world, "w2", "restored", 1, "key-7").await?;
    world.kubectl(&[
        "patch",
        "etcdcluster",
        "idle",
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ])?;
    Ok(())
}

/// A backup of `shop` now and a yearly schedule for `sched`, to `s3`.
fn backups_yaml(s3: &S3Server) -> String {
    let destination = format!(
        "{{bucket: backups, endpoint: '{}', forcePathStyle: true, allowHttp: true, credentialsSecretName: {CREDENTIALS}}}",
        s3.endpoint()
    );
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdBackup
metadata: {{name: shop-now, namespace: {NS}}}
spec: {{clusterName: shop, destination: {destination}}}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdBackupSchedule
metadata: {{name: sched-yearly, namespace: {NS}}}
spec: {{clusterName: sched, schedule: '0 3 1 1 *', retention: {{count: 2}}, destination: {destination}}}
"
    )
}

/// Workload writes of the controller's identity since `marks`, per cluster
/// (port-forward tunnels are not writes of state).
fn workload_writes(world: &KubeWorld, marks: &[usize]) -> Result<Vec<(String, Vec<String>)>> {
    WORKLOADS
        .iter()
        .zip(marks)
        .map(|(w, mark)| {
            let log = world.workload(w).plane.audit()?;
            let writes = log
                .by_since(WORKLOAD_USER, *mark)
                .into_iter()
                .filter(|e| e.is_write() && e.resource() != "pods/portforward")
                .map(ToString::to_string)
                .collect();
            Ok((w.to_string(), writes))
        })
        .collect()
}

fn audit_marks(world: &KubeWorld) -> Result<Vec<usize>> {
    WORKLOADS
        .iter()
        .map(|w| Ok(world.workload(w).plane.audit()?.len()))
        .collect()
}

/// The world: the previous release's controller image maps onto its
/// binary (exact rules win over the repository rule that maps every other
/// tag onto this build's image).
async fn start_world(previous: &BuiltRelease) -> Result<Option<KubeWorld>> {
    let Some(binaries) = require_kubernetes() else {
        return Ok(None);
    };
    let images = ImageTable::installed()
        .with_image(&previous.image(), &previous.binary)
        .with_command(&previous.image(), "etcdfleet", &previous.binary);
    let world = KubeWorld::start_with_images(binaries, &WORKLOADS, images).await?;
    Ok(Some(world))
}

/// The previous release installed and running in the controller's pod (its
/// own binary), its fleet converged, and quiet: no workload write over two
/// polls.
async fn previous_converged(
    world: &KubeWorld,
    previous: &BuiltRelease,
    s3: &S3Server,
) -> Result<()> {
    install_previous(world, previous)?;
    for w in WORKLOADS {
        world.put_kubeconfig_secret(NS, w).await?;
    }
    put_credentials_in(world.management.admin_client().await?, NS).await?;
    let (pod, ip) = rolled_out(world, &previous.image()).await?;
    let exe = executable(world, &pod).await?;
    ensure!(
        exe == previous.binary.canonicalize()?,
        "the previous release's pod runs {}",
        exe.display()
    );
    create_fleet(world, s3).await?;
    wait_polls(world, &ip).await?;
    let quiet = audit_marks(world)?;
    tokio::time::sleep(Duration::from_secs(2 * REQUEUE_SECONDS + 1)).await;
    let baseline = workload_writes(world, &quiet)?;
    ensure!(
        baseline.iter().all(|(_, w)| w.is_empty()),
        "the previous release is not converged: {baseline:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_upgrade_from_the_previous_release_to_head_writes_nothing() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("backups")?;
    let previous = build_release("previous")?;
    eprintln!(
        "previous release {} ({})",
        previous.version, previous.commit
    );
    let Some(world) = start_world(&previous).await? else {
        return Ok(());
    };
    previous_converged(&world, &previous, &s3).await?;

    // The rollout: this release's manifests; the Deployment replaces the pod.
    let before = objects(&world)?;
    let marks = audit_marks(&world)?;
    let stage = install_head(&world)?;
    let head_image = BuiltImage::locate().reference();
    let (pod, ip) = rolled_out(&world, &head_image).await?;
    let exe = executable(&world, &pod).await?;
    ensure!(
        exe != previous.binary.canonicalize()?,
        "the new pod still runs the previous release"
    );
    let reconciles = wait_polls(&world, &ip).await?;
    let after = objects(&world)?;
    let writes = workload_writes(&world, &marks)?;
    let changes = spec_changes(&before, &after);
    let (by_manifests, changes) = attribute(changes, &before, &after, &shipped_templates(&stage)?);
    report(
        &previous,
        &writes,
        &changes,
        &by_manifests,
        before.len(),
        reconciles,
        &exe,
    );
    ensure!(
        writes.iter().all(|(_, w)| w.is_empty()),
        "HEAD wrote into workload clusters: {writes:#?}\n{}",
        world.management_kubelet().runtime.all_pod_logs(60)
    );
    ensure!(changes.is_empty(), "CRs changed: {changes:#?}");
    let failures = metric(&ip, "etcdfleet_reconcile_failures_total").unwrap_or(0.0);
    ensure!(failures == 0.0, "{failures} failed reconciles under HEAD");
    read_everywhere(&world, "w1", "shop", 3, "key-3").await?;
    read_everywhere(&world, "w2", "restored", 1, "key-9").await?;
    Ok(())
}

/// The figures, in the test's output.
fn report(
    previous: &BuiltRelease,
    writes: &[(String, Vec<String>)],
    changes: &[String],
    by_manifests: &[String],
    objects: usize,
    reconciles: f64,
    exe: &Path,
) {
    for (w, list) in writes {
        eprintln!(
            "previous_release {} -> HEAD: {w}: {} workload writes",
            previous.version,
            list.len()
        );
    }
    eprintln!(
        "previous_release {} -> HEAD ({}): {} CR spec changes over {objects} objects, {reconciles} reconciles of {} clusters",
        previous.version,
        exe.display(),
        changes.len(),
        FLEET.len()
    );
    for change in by_manifests {
        eprintln!(
            "previous_release {} -> HEAD: made by the applied stage, not the controller: {}",
            previous.version,
            change.chars().take(160).collect::<String>()
        );
    }
}
