//! Restore drills on real nodes (issue 38, docs/backups.md): a schedule's
//! newest backup of a 3.6 cluster is restored by the real kubelet and
//! containerd into a drill pod of etcd 3.6 (the seeder from the controller
//! image, the snapshot from S3 on moto), compared with the fingerprint the
//! backup recorded, timed and removed; the controller "restarts" mid-drill
//! (a new backup context) and the same pod's drill finishes; nothing of the
//! live cluster is written. Then a backup whose object was overwritten in
//! the store after it succeeded fails its drill: the cluster's
//! `BackupsRestorable` turns False and the restorable gauge is 0.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcd_client::GetOptions;
use etcdfleet_api::backup::{SCHEDULE_LABEL, drill_result, phase};
use etcdfleet_api::drill::{RESTORABLE_CONDITION, reason};
use etcdfleet_api::{EtcdBackup, EtcdBackupSchedule, EtcdBackupSpec, EtcdCluster};
use etcdfleet_controllers::backup::drill::DrillSettings;
use etcdfleet_controllers::backup::schedule::reconcile_schedule;
use etcdfleet_controllers::backup::{Context as BackupContext, reconcile_backup};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::store::Store;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_manifest, etcd_of, stop_installed_controller, wait_ready_members,
};
use etcdfleet_tests::control_plane::{KubeWorld, RealWorldSpec, require_kubernetes};
use etcdfleet_tests::driver::{TestController, converge, no_hook};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::image::{BuiltImage, require_image};
use etcdfleet_tests::real_node::{NodeImage, require_real_nodes, run_isolated};
use etcdfleet_tests::s3::{CREDENTIALS, S3Server, put_credentials_in};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

const SCHEDULE: &str = "shop-drills";
const DRILL_POD: &str = "shop-etcd-drill";
const KEYS: usize = 25;

fn settings(image: &BuiltImage) -> DrillSettings {
    DrillSettings {
        seeder_image: format!("etcdfleet/controller:{}", image.tag),
        max_concurrent: 1,
        timeout: Duration::from_secs(240),
        sample_keys: 100,
    }
}

#[test]
fn real_node_drill_restores_the_newest_backup_with_its_own_etcd_never_with_another_owners_secret_and_a_changed_object_fails()
 {
    let Some(binaries) = require_kubernetes() else {
        return;
    };
    let Some(tools) = require_real_nodes(&binaries) else {
        return;
    };
    let Some(image) = require_image() else {
        return;
    };
    let version = require_etcd(EtcdVersion::V3_6)
        .expect("etcd 3.6 (hack/upstream/etcd-3.6)")
        .release;
    run_isolated(|| async move {
        let Some(s3) = S3Server::start_for_pods() else {
            bail!("moto is missing");
        };
        s3.create_bucket("backups")?;
        let spec = RealWorldSpec {
            tools: &tools,
            workload_names: &["w1"],
            management_nodes: 0,
            extra_images: vec![NodeImage::controller(&image.layout(), &image.tag)],
            csi: None,
        };
        let world = KubeWorld::start_real_nodes(binaries, spec).await?;
        world.install("config/stages/dev")?;
        world.install_workload_rbac()?;
        world.put_kubeconfig_secret(NS, "w1").await?;
        stop_installed_controller(&world)?;
        let result = drills(&world, &s3, &version, settings(&image)).await;
        result.map_err(|e| {
            let nodes = world.workload("w1").nodes.real().log_tails(20);
            e.context(format!("workload nodes:{nodes}"))
        })
    });
}

async fn drills(
    world: &KubeWorld,
    s3: &S3Server,
    version: &str,
    drills: DrillSettings,
) -> Result<()> {
    let management = world.management.admin_client().await?;
    put_credentials_in(management.clone(), NS).await?;
    let ctl = shop(world, version).await?;
    let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    for i in 0..KEYS {
        kv.put(format!("key-{i:02}"), format!("value-{i}"), None)
            .await?;
    }
    let good = backup_of_the_schedule(world, &ctl, s3, "shop-1").await?;
    let fingerprint = (good.status.as_ref().and_then(|s| s.fingerprint.clone()))
        .context("the backup recorded no fingerprint")?;
    ensure!(
        fingerprint.key_count >= KEYS as i64,
        "fingerprint: {fingerprint:?}"
    );
    let live_before = live_revision(&mut kv).await?;
    world.apply(&schedule_yaml(s3))?;
    a_foreign_secret_holds_the_drill(world, &ctl, &drills).await?;
    let workload_audit = world.workload("w1").plane.audit()?.len();

    let seen = drill_until_done(world, &ctl, &drills, "shop-1", true).await?;
    let schedule = schedules(&management).get(SCHEDULE).await?;
    let last = (schedule.status.as_ref().and_then(|s| s.last_drill.clone()))
        .with_context(|| format!("no lastDrill on the schedule: {:?}", schedule.status))?;
    ensure!(
        last.result == drill_result::PASSED && last.reason.is_none(),
        "{last:?}"
    );
    ensure!(
        last.revision >= good.status.as_ref().and_then(|s| s.revision),
        "drill revision {:?} below the backup's",
        last.revision
    );
    ensure!(
        last.key_count == Some(fingerprint.key_count),
        "{last:?} vs {fingerprint:?}"
    );
    ensure!(last.etcd_version.as_deref() == Some(version), "{last:?}");
    ensure!(
        seen.images
            .iter()
            .all(|i| i.ends_with(&format!(":v{version}")))
            && !seen.images.is_empty(),
        "drill pod images: {:?}",
        seen.images
    );
    ensure!(
        seen.pods.len() == 1,
        "drill pods across the restart: {:?}",
        seen.pods
    );
    let millis = last.restore_millis.context("no restore time")?;
    ensure!(millis > 0 && millis < 240_000, "restore took {millis} ms");
    let on_backup = backups(&management).get("shop-1").await?;
    ensure!(
        on_backup
            .status
            .as_ref()
            .and_then(|s| s.last_drill.as_ref())
            == Some(&last),
        "the backup's lastDrill differs from the schedule's"
    );
    nothing_left(world).await?;
    ensure!(
        live_revision(&mut kv).await? == live_before,
        "the live etcd was written"
    );
    only_drill_objects_written(world, workload_audit)?;
    eprintln!(
        "drill of {} ({} keys, etcd {version}): restore {millis} ms, {}",
        last.backup, fingerprint.key_count, last.message
    );

    // A backup whose object changed in the store after it succeeded.
    let changed = backup_of_the_schedule(world, &ctl, s3, "shop-2").await?;
    overwrite_object(s3, &changed).await?;
    drill_until_done(world, &ctl, &drills, "shop-2", false).await?;
    let failed = (backups(&management).get("shop-2").await?.status)
        .and_then(|s| s.last_drill)
        .context("no lastDrill on shop-2")?;
    ensure!(
        failed.result == drill_result::FAILED
            && failed.reason.as_deref() == Some(reason::OBJECT_CHANGED),
        "{failed:?}"
    );
    nothing_left(world).await?;
    // The cluster says so (written at the schedule's next reconcile), and so
    // does the gauge the alert reads.
    let bctx = BackupContext::new(ctl.ctx.clone()).with_drills(drills.clone());
    let s = schedules(&management).get(SCHEDULE).await?;
    reconcile_schedule(&s, &bctx).await?;
    let cluster = Api::<EtcdCluster>::namespaced(management.clone(), NS)
        .get("shop")
        .await?;
    let restorable = (cluster
        .status
        .as_ref()
        .map(|s| &s.conditions[..])
        .unwrap_or(&[]))
    .iter()
    .find(|c| c.type_ == RESTORABLE_CONDITION)
    .cloned()
    .context("no BackupsRestorable condition")?;
    ensure!(
        restorable.status == "False" && restorable.message.contains("shop-2"),
        "{restorable:?}"
    );
    let metrics = ctl.ctx.access.metrics.encode();
    ensure!(
        metrics.contains(&format!(
            "etcdfleet_backup_restorable{{cluster=\"{NS}/shop\"}} 0"
        )),
        "no restorable 0 in the metrics"
    );
    Ok(())
}

/// `shop`: 3 members of etcd `version`, converged and ready.
async fn shop(world: &KubeWorld, version: &str) -> Result<TestController> {
    let spec = format!(
        "  clusterRef:
    name: w1
  version: {version}
  replicas: 3
"
    );
    let mut ctl = world.controller().await?;
    world.apply(&cluster_manifest("shop", &spec))?;
    converge(
        &mut ctl,
        &[(NS, "shop")],
        Duration::from_secs(240),
        || async { Ok(()) },
        no_hook,
    )
    .await?;
    wait_ready_members(world, "shop", 3)?;
    Ok(ctl)
}

fn destination_yaml(s3: &S3Server, indent: &str) -> String {
    [
        "bucket: backups".to_string(),
        format!("endpoint: {}", s3.endpoint()),
        "forcePathStyle: true".into(),
        "allowHttp: true".into(),
        format!("credentialsSecretName: {CREDENTIALS}"),
    ]
    .iter()
    .map(|l| format!("{indent}{l}\n"))
    .collect()
}

/// A yearly schedule (no backup of its own during the test) drilling each
/// of its backups.
fn schedule_yaml(s3: &S3Server) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1beta1
kind: EtcdBackupSchedule
metadata:
  name: {SCHEDULE}
  namespace: {NS}
spec:
  clusterName: shop
  schedule: '0 0 1 1 *'
  drill:
    everyNthBackup: 1
    freshFor: 1d
  destination:
{}",
        destination_yaml(s3, "    ")
    )
}

fn schedules(client: &kube::Client) -> Api<EtcdBackupSchedule> {
    Api::namespaced(client.clone(), NS)
}

fn backups(client: &kube::Client) -> Api<EtcdBackup> {
    Api::namespaced(client.clone(), NS)
}

/// A backup of the schedule taken now (labelled as the schedule's, rather
/// than waiting for its cron minute), through the backup reconciler.
async fn backup_of_the_schedule(
    world: &KubeWorld,
    ctl: &TestController,
    s3: &S3Server,
    name: &str,
) -> Result<EtcdBackup> {
    let api = backups(&world.management.admin_client().await?);
    let mut b = EtcdBackup::new(
        name,
        EtcdBackupSpec {
            cluster_name: "shop".into(),
            destination: Some(s3.destination("backups", CREDENTIALS)),
        },
    );
    b.metadata.namespace = Some(NS.into());
    b.metadata.labels = Some([(SCHEDULE_LABEL.to_string(), SCHEDULE.to_string())].into());
    api.create(&PostParams::default(), &b).await?;
    let bctx = BackupContext::new(ctl.ctx.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let b = api.get(name).await?;
        if b.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase::SUCCEEDED) {
            return Ok(b);
        }
        ensure!(Instant::now() < deadline, "backup {name}: {:?}", b.status);
        reconcile_backup(&b, &bctx).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What a drill's run showed of its pod.
struct Seen {
    pods: BTreeSet<String>,
    images: BTreeSet<String>,
}

/// Reconciles the schedule until `backup` has a drill result; when
/// `restart`, the backup context is replaced (a controller restart) as
/// soon as the drill is in progress.
async fn drill_until_done(
    world: &KubeWorld,
    ctl: &TestController,
    drills: &DrillSettings,
    backup: &str,
    restart: bool,
) -> Result<Seen> {
    let management = world.management.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let mut bctx = BackupContext::new(ctl.ctx.clone()).with_drills(drills.clone());
    let mut restarted = !restart;
    let mut seen = Seen {
        pods: BTreeSet::new(),
        images: BTreeSet::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = schedules(&management).get(SCHEDULE).await?;
        reconcile_schedule(&s, &bctx).await?;
        if let Some(pod) = pods.get_opt(DRILL_POD).await? {
            seen.pods.extend(pod.uid());
            let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
            seen.images
                .extend(containers.filter_map(|c| c.image.clone()));
        }
        let b = backups(&management).get(backup).await?;
        if b.status.as_ref().is_some_and(|s| s.last_drill.is_some()) {
            ensure!(
                restarted,
                "the drill of {backup} ended before the controller restarted in it"
            );
            return Ok(seen);
        }
        let status = (schedules(&management).get(SCHEDULE).await?.status)
            .context("the schedule has no status after a reconcile")?;
        if !restarted && status.drill_in_progress.is_some() {
            eprintln!(
                "drill in progress ({:?}): the controller restarts",
                status.drill_in_progress
            );
            bctx = BackupContext::new(ctl.ctx.clone()).with_drills(drills.clone());
            restarted = true;
        }
        ensure!(
            Instant::now() < deadline,
            "no drill result for {backup}; schedule status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A Secret at the drill's credentials name that another owner holds: no
/// drill pod is created (its seeder would run with that owner's keys), the
/// schedule says why, and the Secret is not touched. Once it is gone, the
/// drill can start.
async fn a_foreign_secret_holds_the_drill(
    world: &KubeWorld,
    ctl: &TestController,
    drills: &DrillSettings,
) -> Result<()> {
    let management = world.management.admin_client().await?;
    let client = world.workload("w1").admin_client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), WORKLOAD_NS);
    let theirs: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": DRILL_POD, "labels": {"app.kubernetes.io/name": "theirs"}},
        "stringData": {"password": "not the drill's"},
    }))?;
    let theirs = secrets.create(&PostParams::default(), &theirs).await?;
    let bctx = BackupContext::new(ctl.ctx.clone()).with_drills(drills.clone());
    for _ in 0..3 {
        let s = schedules(&management).get(SCHEDULE).await?;
        reconcile_schedule(&s, &bctx).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client, WORKLOAD_NS);
    ensure!(
        pods.get_opt(DRILL_POD).await?.is_none(),
        "a drill pod was created beside another owner's Secret {DRILL_POD}"
    );
    let next = (schedules(&management).get(SCHEDULE).await?.status)
        .and_then(|s| s.next_drill)
        .unwrap_or_default();
    ensure!(
        next.contains(&format!(
            "Secret {WORKLOAD_NS}/{DRILL_POD} exists and is not an earlier drill's"
        )),
        "the schedule does not say why the drill waits: {next:?}"
    );
    let after = secrets.get(DRILL_POD).await?;
    ensure!(
        after.metadata.resource_version == theirs.metadata.resource_version,
        "the other owner's Secret was written: {after:?}"
    );
    secrets
        .delete(DRILL_POD, &kube::api::DeleteParams::default())
        .await?;
    Ok(())
}

/// The live cluster's revision (a count-only read).
async fn live_revision(kv: &mut etcd_client::Client) -> Result<i64> {
    let all = GetOptions::new().with_from_key().with_count_only();
    let r = kv.get("\0", Some(all)).await?;
    r.header().map(|h| h.revision()).context("no header")
}

/// No drill pod or Secret is left in the workload namespace (the pod is
/// deleted; its Secret goes with it through the garbage collector).
async fn nothing_left(world: &KubeWorld) -> Result<()> {
    let client = world.workload("w1").admin_client().await?;
    let selector = ListParams::default().labels("etcdfleet.dev/drill-of");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let pods = Api::<Pod>::namespaced(client.clone(), WORKLOAD_NS)
            .list(&selector)
            .await?;
        let secrets = Api::<Secret>::namespaced(client.clone(), WORKLOAD_NS)
            .list(&selector)
            .await?;
        if pods.items.is_empty() && secrets.items.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "left behind: pods {:?}, secrets {:?}",
            pods.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            secrets
                .items
                .iter()
                .map(|s| s.name_any())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every write the controller's workload identity made since `skip` was to
/// the drill's pod, its Secret or a port-forward to the drill pod: none to
/// the members' objects.
fn only_drill_objects_written(world: &KubeWorld, skip: usize) -> Result<()> {
    let log = world.workload("w1").plane.audit()?;
    let user = etcdfleet_tests::control_plane::world::WORKLOAD_USER;
    let writes: Vec<String> = (log.by_since(user, skip).into_iter())
        .filter(|e| e.is_write())
        .map(|e| {
            // A request about no object counts as foreign below.
            let name = e
                .object_ref
                .as_ref()
                .map_or("(no object)", |o| o.name.as_str());
            format!("{} {} {name}", e.verb, e.resource())
        })
        .collect();
    ensure!(
        !writes.is_empty(),
        "no write by {user} in the audit log (is it the drill's writer?)"
    );
    let foreign: Vec<&String> = writes.iter().filter(|w| !w.ends_with(DRILL_POD)).collect();
    ensure!(
        foreign.is_empty(),
        "writes beyond the drill's objects: {foreign:?}"
    );
    Ok(())
}

/// Replaces the backup's object with other bytes of the same size, as a
/// store fault or a careless hand would.
async fn overwrite_object(s3: &S3Server, backup: &EtcdBackup) -> Result<()> {
    let status = backup.status.as_ref().context("no status")?;
    let key = status.object_key.clone().context("no object key")?;
    let size = status.size_bytes.context("no size")? as usize;
    let credentials = etcdfleet_controllers::store::Credentials {
        access_key_id: etcdfleet_tests::s3::ACCESS_KEY_ID.into(),
        secret_access_key: etcdfleet_tests::s3::SECRET_ACCESS_KEY.into(),
        session_token: None,
    };
    let store = Store::open(&s3.destination("backups", CREDENTIALS), Some(&credentials))?;
    store.put_small(&key, vec![0x5a; size]).await?;
    Ok(())
}
