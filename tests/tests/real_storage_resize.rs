//! Volumes that grow on real nodes (issue 37, docs/storage.md): a cluster's
//! claims are provisioned by a CSI driver (`etcdfleet_tests::csi`) through
//! the real `csi-provisioner`, grown through the real `csi-resizer` and the
//! real kubelet's online `NodeExpandVolume`, its StatefulSet is deleted with
//! `propagationPolicy: Orphan` (the real garbage collector) and adopted
//! again by the real StatefulSet controller, and its members run under real
//! kubelets and containerd:
//! - `storage.size` 1Gi → 2Gi on 3 members with a writer: every claim's
//!   capacity is 2Gi, the claim template says 2Gi, the quota followed, at
//!   most one member was down at any sampled moment, no acknowledged write
//!   lost;
//! - a cluster at NOSPACE, which compaction cannot cure, recovers by
//!   growing its volumes: the quota follows the size, every key is kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::conditions;
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::plan::{Step, StorageStep};
use etcdfleet_tests::control_plane::KubeWorld;
use etcdfleet_tests::control_plane::readiness::ReadySampler;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_manifest, etcd_of, get, in_real_world_with, member_pods, patch_spec,
    wait_ready_members,
};
use etcdfleet_tests::csi::deploy::{CSI_CLASS, CsiTools};
use etcdfleet_tests::driver::{ConvergeLog, TestController, converge, no_hook};
use etcdfleet_tests::etcd_harness::{
    EtcdVersion, FollowingWriter, fill_with_live_data, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, PodSpec};
use kube::ResourceExt;
use kube::api::Api;

/// Runs `test` in a real-node world whose workload plane runs the test CSI
/// driver, with the cluster-scoped reads a growth needs (StorageClasses).
fn in_csi_world<F>(test: F)
where
    F: AsyncFnOnce(&KubeWorld) -> Result<()>,
{
    let csi = CsiTools::locate(env!("CARGO_BIN_EXE_csi_hostpath")).expect("the CSI tools");
    in_real_world_with(Some(csi), async |world| {
        world.kubectl_workload(
            "w1",
            &["apply", "--server-side", "-k", "config/workload-rbac-nodes"],
        )?;
        test(world).await
    });
}

/// `shop`: 3 members of etcd 3.5 on `size` claims of the CSI class, the
/// quota half the size; converged, every member ready.
async fn sized_shop(world: &KubeWorld, size: &str) -> Result<TestController> {
    let version = require_etcd(EtcdVersion::V3_5Latest)
        .context("etcd 3.5 (hack/upstream/etcd-3.5)")?
        .release;
    let spec = format!(
        "  clusterRef:
    name: w1
  version: {version}
  replicas: 3
  storage:
    storageClassName: {CSI_CLASS}
    size: {size}
  etcd:
    heartbeatIntervalMillis: 50
    electionTimeoutMillis: 500
    quotaBackendPercentOfStorage: 50
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

async fn workload_client(world: &KubeWorld) -> Result<kube::Client> {
    world.workload("w1").admin_client().await
}

/// (requested, capacity) of each member's claim, by ordinal.
async fn claims(world: &KubeWorld) -> Result<Vec<(String, String)>> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(workload_client(world).await?, WORKLOAD_NS);
    let mut out = Vec::new();
    for o in 0..3 {
        let pvc = api.get(&format!("data-shop-etcd-{o}")).await?;
        let requested = (pvc.spec)
            .and_then(|s| s.resources?.requests?.get("storage").cloned())
            .context("no request")?;
        let capacity = (pvc.status)
            .and_then(|s| s.capacity?.get("storage").cloned())
            .context("no capacity")?;
        out.push((requested.0, capacity.0));
    }
    Ok(out)
}

/// The capacity of every PersistentVolume of the CSI class.
async fn volume_capacities(world: &KubeWorld) -> Result<Vec<String>> {
    let api: Api<PersistentVolume> = Api::all(workload_client(world).await?);
    let mut out = Vec::new();
    for pv in api.list(&Default::default()).await? {
        let spec = pv.spec.context("a volume without a spec")?;
        if spec.storage_class_name.as_deref() == Some(CSI_CLASS) {
            let capacity = spec.capacity.and_then(|c| c.get("storage").cloned());
            out.push(capacity.context("a volume without a capacity")?.0);
        }
    }
    Ok(out)
}

/// What counts as a member being down.
#[derive(Clone, Copy)]
#[allow(dead_code)] // NotReady: see the growth test.
enum Down {
    /// Its pod is missing, being deleted or not Ready.
    NotReady,
    /// Its pod is missing, being deleted or its etcd container not running.
    /// (While a NOSPACE alarm is raised every member's readiness fails:
    /// etcd's `/health` reports the alarm; the members still run.)
    NotRunning,
}

fn is_up(pod: &Pod, down: Down) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let up = match down {
        Down::NotReady => {
            (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
        }
        Down::NotRunning => (status.container_statuses.iter().flatten())
            .any(|c| c.name == "etcd" && c.state.as_ref().is_some_and(|s| s.running.is_some())),
    };
    up && pod.metadata.deletion_timestamp.is_none()
}

/// The ordinals of the 3 members that are down, each with its pod's phase
/// and conditions (for the failure message).
async fn members_down(world: &KubeWorld, down: Down) -> Result<Vec<String>> {
    let pods = member_pods(world, "shop").await?;
    let describe = |o: u32| match pods.get(&o) {
        None => format!("{o}: no pod"),
        Some(p) => describe_pod(o, p),
    };
    let down = (0..3).filter(|o| !pods.get(o).is_some_and(|p| is_up(p, down)));
    Ok(down.map(describe).collect())
}

/// A member pod as a failure message needs it: which pod (uid, start),
/// whether it is being deleted, its Ready condition and when it last
/// changed, and its etcd container (ready, restarts, since when it runs).
fn describe_pod(ordinal: u32, pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let ready = (status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten())
    .find(|c| c.type_ == "Ready")
    .map(|c| {
        (
            c.status.clone(),
            c.last_transition_time.as_ref().map(|t| t.0),
        )
    });
    let etcd = (status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten())
    .find(|c| c.name == "etcd")
    .map(|c| {
        let since = c
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref()?.started_at.clone());
        (c.ready, c.restart_count, since.map(|t| t.0))
    });
    format!(
        "{ordinal}: uid {:?}, started {:?}, deleting {}, Ready {ready:?}, etcd (ready, restarts, \
         running since) {etcd:?}",
        pod.uid(),
        status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
        pod.metadata.deletion_timestamp.is_some(),
    )
}

/// What [`converge_counting_down`] saw.
struct Converged {
    log: ConvergeLog,
    /// The most members seen down at once (described).
    most_down: Vec<String>,
    /// When the StatefulSet was created again (every volume had grown).
    grown: Instant,
}

/// The most members seen down at once, and the last sample (printed with
/// the time whenever it changes: a failing run's log shows how the pods
/// went between the controller's steps).
#[derive(Default)]
struct Samples {
    most: Vec<String>,
    last: Vec<String>,
}

/// Keeps `now` in `most` when more members are down in it.
fn keep_most(samples: &Mutex<Samples>, now: Vec<String>) {
    let mut samples = samples.lock().expect("samples");
    if now != samples.last {
        eprintln!(
            "[{}] members down: {now:?}",
            k8s_openapi::jiff::Timestamp::now()
        );
        samples.last = now.clone();
    }
    if now.len() > samples.most.len() {
        samples.most = now;
    }
}

/// Converges `shop`, counting between reconciles how many members are down
/// and telling `writer` the members' addresses (restarted pods come back at
/// new IPs); returns the log and the most members seen down at once.
async fn converge_counting_down(
    world: &KubeWorld,
    ctl: &mut TestController,
    writer: Option<&FollowingWriter>,
    down: Down,
) -> Result<Converged> {
    let most = Arc::new(Mutex::new(Samples::default()));
    let between = || {
        let most = most.clone();
        async move {
            let now = members_down(world, down).await?;
            keep_most(&most, now);
            if let (Some(writer), Ok((endpoints, config))) =
                (writer, etcd_of(world, "w1", "shop", 3).await)
            {
                for e in endpoints {
                    writer.add(e, config.clone());
                }
            }
            Ok(())
        }
    };
    // When the StatefulSet was created again: every volume had grown.
    let mut grown = None;
    let after_step = |_: &str, step: &Step, _: &mut TestController| {
        if matches!(step, Step::Storage(StorageStep::RecreateStatefulSet { .. })) {
            grown = Some(Instant::now());
        }
        Ok(())
    };
    let log = converge(
        ctl,
        &[(NS, "shop")],
        Duration::from_secs(300),
        between,
        after_step,
    )
    .await?;
    let most = most.lock().expect("samples").most.clone();
    Ok(Converged {
        log,
        most_down: most,
        grown: grown.context("the StatefulSet was never created again")?,
    })
}

fn storage_kinds(log: &ConvergeLog) -> Vec<&'static str> {
    (log.steps.iter())
        .filter_map(|(_, s)| match s {
            Step::Storage(s) => Some(s.kind()),
            Step::RestartMember { .. } => Some("RestartMember"),
            _ => None,
        })
        .collect()
}

fn quota_of(spec: Option<&PodSpec>) -> Result<String> {
    (spec.and_then(|s| s.containers.first()?.args.clone()))
        .into_iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--quota-backend-bytes=").map(str::to_string))
        .context("no --quota-backend-bytes")
}

/// The `--quota-backend-bytes` of the StatefulSet's template and of every
/// member pod.
async fn quotas(world: &KubeWorld) -> Result<(String, Vec<String>)> {
    let sts = Api::<StatefulSet>::namespaced(workload_client(world).await?, WORKLOAD_NS)
        .get("shop-etcd")
        .await?;
    let pods: Vec<Pod> = member_pods(world, "shop").await?.into_values().collect();
    let members = (pods.iter().map(|p| quota_of(p.spec.as_ref()))).collect::<Result<_>>()?;
    Ok((quota_of(sts.spec.template.spec.as_ref())?, members))
}

fn claim_template_size(sts: &StatefulSet) -> Option<String> {
    let claim = sts.spec.volume_claim_templates.as_ref()?.first()?;
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    Some(requests.get("storage")?.0.clone())
}

#[test]
fn real_node_resize_and_a_class_move_keep_all_members_but_one_ready_and_the_quota_follows() {
    in_csi_world(async |world| {
        let mut ctl = sized_shop(world, "1Gi").await?;
        ensure!(
            claims(world).await? == vec![("1Gi".to_string(), "1Gi".to_string()); 3],
            "claims before: {:?}",
            claims(world).await?
        );
        let client = workload_client(world).await?;
        let sts_uid = Api::<StatefulSet>::namespaced(client.clone(), WORKLOAD_NS)
            .get("shop-etcd")
            .await?
            .uid();
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        let writer = FollowingWriter::start(
            (endpoints.iter())
                .map(|e| (e.clone(), config.clone()))
                .collect(),
            "resize",
        );
        let sampler = ReadySampler::start(client.clone(), WORKLOAD_NS, "shop", 3).await?;
        let started = Instant::now();
        patch_spec(
            world,
            "shop",
            serde_json::json!({"storage": {"size": "2Gi"}}),
        )?;
        let Converged {
            log,
            most_down,
            grown,
        } = converge_counting_down(world, &mut ctl, Some(&writer), Down::NotRunning).await?;
        wait_ready_members(world, "shop", 3)?;
        let took = started.elapsed();
        let sampled = sampler.stop().await?;
        let report = writer.stop().await?;

        ensure!(
            storage_kinds(&log)
                == [
                    "ExpandVolume",
                    "ExpandVolume",
                    "ExpandVolume",
                    "RecreateStatefulSet",
                    "RestartMember",
                    "RestartMember",
                    "RestartMember"
                ],
            "steps: {:?}",
            log.steps
        );
        // At most one member out of service at once, as clients of the
        // client Service see it: not Ready (or gone), every 100 ms.
        ensure!(most_down.len() <= 1, "members down at once: {most_down:?}");
        ensure!(
            sampled.most.len() <= 1 && sampled.samples > 100,
            "members not Ready at once during the growth ({} samples), at {:?}: {:?}",
            sampled.samples,
            sampled.most_at,
            sampled.most
        );
        ensure!(
            claims(world).await? == vec![("2Gi".to_string(), "2Gi".to_string()); 3],
            "claims after: {:?}",
            claims(world).await?
        );
        ensure!(
            volume_capacities(world).await? == vec!["2Gi".to_string(); 3],
            "volumes after: {:?}",
            volume_capacities(world).await?
        );
        let sts = Api::<StatefulSet>::namespaced(client, WORKLOAD_NS)
            .get("shop-etcd")
            .await?;
        ensure!(
            sts.uid() != sts_uid,
            "the StatefulSet was not created again"
        );
        ensure!(
            claim_template_size(&sts).as_deref() == Some("2Gi"),
            "claim template {:?}",
            claim_template_size(&sts)
        );
        let (template, members) = quotas(world).await?;
        ensure!(
            template == (1u64 << 30).to_string(),
            "quota {template}: half of 2Gi"
        );
        ensure!(
            members == vec![template.clone(); 3],
            "member quotas {members:?}"
        );
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        let checked = verify_acknowledged(&report, &endpoints, &config, "resize").await?;
        ensure!(checked > 10, "the writer kept writing: {report:?}");
        eprintln!(
            "real-node resize 1Gi -> 2Gi: {:.1} s ({:.1} s until every volume grew), \
             at most {} member down, {checked} acknowledged writes verified, longest pause {:?}",
            took.as_secs_f64(),
            (grown - started).as_secs_f64(),
            most_down.len(),
            report.longest_pause
        );
        move_to_a_second_class(world, &mut ctl).await
    });
}

/// A move of `shop` to a second class of the CSI driver: every member's
/// volume ends on it, never more than one member out of service, by the
/// pods' Ready conditions sampled throughout.
async fn move_to_a_second_class(world: &KubeWorld, ctl: &mut TestController) -> Result<()> {
    use k8s_openapi::api::storage::v1::StorageClass;
    let client = workload_client(world).await?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let mut second = classes.get(CSI_CLASS).await?;
    second.metadata = kube::api::ObjectMeta {
        name: Some(format!("{CSI_CLASS}-b")),
        ..Default::default()
    };
    classes
        .create(&kube::api::PostParams::default(), &second)
        .await?;
    let sampler = ReadySampler::start(client, WORKLOAD_NS, "shop", 3).await?;
    patch_spec(
        world,
        "shop",
        serde_json::json!({"storage": {"storageClassName": format!("{CSI_CLASS}-b")}}),
    )?;
    let Converged { log, .. } = converge_counting_down(world, ctl, None, Down::NotRunning).await?;
    wait_ready_members(world, "shop", 3)?;
    let sampled = sampler.stop().await?;
    let removals = (log.steps.iter())
        .filter(|(_, s)| matches!(s, Step::RemoveMember { .. }))
        .count();
    ensure!(
        removals == 4,
        "three members and the spare removed: {:?}",
        log.steps
    );
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(workload_client(world).await?, WORKLOAD_NS);
    for o in 0..3 {
        let pvc = api.get(&format!("data-shop-etcd-{o}")).await?;
        let class = pvc.spec.and_then(|s| s.storage_class_name);
        ensure!(
            class == Some(format!("{CSI_CLASS}-b")),
            "member {o} on {class:?}"
        );
    }
    ensure!(
        sampled.most.len() <= 1 && sampled.samples > 100,
        "members not Ready at once during the move ({} samples), at {:?}: {:?}",
        sampled.samples,
        sampled.most_at,
        sampled.most
    );
    Ok(())
}

/// Reconciles until the NOSPACE recovery fails (it waits while a member's
/// health check is slow to answer); returns its error.
async fn nospace_error(ctl: &mut TestController) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        match ctl.reconcile(NS, "shop").await {
            Err(e) => return Ok(e.to_string()),
            Ok(other) => ensure!(
                std::time::Instant::now() < deadline,
                "the NOSPACE recovery never failed: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn real_node_resize_cures_a_nospace_alarm_that_compaction_cannot() {
    in_csi_world(async |world| {
        // 8Mi claims, a 4 MiB quota.
        let mut ctl = sized_shop(world, "8Mi").await?;
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        // Distinct keys: live data, which compaction cannot give back.
        let fill = fill_with_live_data(&endpoints, &config, 4 << 20, 128 * 1024).await?;
        let written = fill.written;
        let err = nospace_error(&mut ctl).await?;
        ensure!(
            err.contains("NOSPACE persists") && err.contains("grow spec.storage.size"),
            "{err}"
        );

        patch_spec(
            world,
            "shop",
            serde_json::json!({"storage": {"size": "32Mi"}}),
        )?;
        let Converged { log, most_down, .. } =
            converge_counting_down(world, &mut ctl, None, Down::NotRunning).await?;
        wait_ready_members(world, "shop", 3)?;
        let kinds: Vec<&str> = log.steps.iter().map(|(_, s)| s.kind()).collect();
        let grow =
            (kinds.iter().position(|k| *k == "RecreateStatefulSet")).context("no re-creation")?;
        let cure =
            (kinds.iter().position(|k| *k == "RecoverFromNoSpace")).context("no NOSPACE cure")?;
        ensure!(
            grow < cure,
            "the volumes grow before the alarm is cured: {kinds:?}"
        );
        ensure!(most_down.len() <= 1, "members down at once: {most_down:?}");
        ensure!(
            claims(world).await? == vec![("32Mi".to_string(), "32Mi".to_string()); 3],
            "claims after: {:?}",
            claims(world).await?
        );
        let (template, members) = quotas(world).await?;
        ensure!(
            template == (16u64 << 20).to_string(),
            "quota {template}: half of 32Mi"
        );
        ensure!(
            members == vec![template.clone(); 3],
            "member quotas {members:?}"
        );
        let status = get(world, "shop").await?.status.context("no status")?;
        ensure!(
            conditions::is_true(&status.conditions, conditions::AVAILABLE),
            "not Available: {:?}",
            status.conditions
        );
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
        kv.put("after-growth", "ok", None).await?;
        let count_only = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        let kept = kv.get("live/", Some(count_only)).await?.count();
        // The put answered NOSPACE may be stored too: etcd's quota applier
        // applies a put and then reports ErrNoSpace when the quota was
        // exceeded (`quotaApplierV3.Put`, server/etcdserver/apply), while a
        // put refused before it was proposed, or once the alarm is armed,
        // is not.
        ensure!(
            kept == written || kept == written + 1,
            "{kept} keys kept; {written} acknowledged before NOSPACE, plus at most the one refused"
        );
        Ok(())
    });
}
