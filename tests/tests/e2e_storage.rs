//! End to end on real etcd: volumes that grow (docs/storage.md). A
//! cluster's `spec.storage.size` grows each member's claim, one member at a
//! time, the StatefulSet is created again around its running pods with the
//! new claim template, and a quota derived from the size follows once every
//! volume has the room; a shrink, a class that cannot expand and a class
//! that cannot be read are refused with nothing written. The runtime plays
//! the resizer (`ResizeMode`); the tests count what the controller writes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::conditions;
use etcdfleet_api::{EtcdTuning, StorageSpec};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_tests::driver::{ConvergeLog, TestController, converge, no_hook};
use etcdfleet_tests::etcd_harness::{
    AckedWriter, EtcdVersion, fill_with_live_data, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::runtime::ResizeMode;
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller, converge_all, create, etcd_of, fast_raft, get, patch_spec,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

const STS: &str = "etcd-a-etcd";

/// A StorageClass in workload `a`.
async fn storage_class(fleet: &Fleet, name: &str, expandable: bool) -> Result<()> {
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "provisioner": "example.dev/test",
        "allowVolumeExpansion": expandable,
    }))?;
    Api::<StorageClass>::all(fleet.workload_client("a"))
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// The optional cluster-scoped reads (config/workload-rbac-nodes), which a
/// growth needs for the StorageClass.
fn grant_cluster_reads(fleet: &Fleet) -> Result<()> {
    let dir = etcdfleet_tests::apiserver::kinds::config_dir().join("workload-rbac-nodes");
    for file in ["cluster_role.yaml", "cluster_role_binding.yaml"] {
        let text = std::fs::read_to_string(dir.join(file))?;
        fleet.workload_api("a").add_rbac_yaml(&text)?;
    }
    Ok(())
}

/// `etcd-a`: 3 members on `size` volumes of `class`, the quota half the size.
async fn create_sized(fleet: &Fleet, class: &str, size: &str) -> Result<TestController> {
    // The newest 3.5: from 3.5.3 etcd answers the members' readiness probe
    // (`/health?serializable=true`) from the member alone. 3.5.1 ignores the
    // parameter and reads the cluster's health through the leader, which,
    // on a loaded machine, under the process kubelet's 1 s probes with their
    // 500 ms timeout, turned a healthy member not Ready while another
    // restarted (the full runs of 5403eb5 and e0d6beb).
    let etcd = require_etcd(EtcdVersion::V3_5Latest).context("etcd 3.5 (latest) is needed")?;
    let mut c = cluster("etcd-a", "a", 3, &etcd.release);
    c.spec.config.storage = Some(StorageSpec {
        storage_class_name: Some(class.into()),
        size: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            size.into(),
        )),
    });
    c.spec.config.etcd = Some(EtcdTuning {
        quota_backend_percent_of_storage: Some(50),
        ..fast_raft()
    });
    create(fleet, &c).await?;
    let mut ctl = controller(fleet);
    converge_all(fleet, &mut ctl, &["etcd-a"]).await?;
    wait_in_service(fleet).await?;
    Ok(ctl)
}

/// Waits (at most 60 s) until every member's pod is Ready: the controller
/// converges once etcd answers each member healthy, before the kubelet's
/// next readiness probe says so, and what the tests count down is the
/// operation after, not the start before it.
async fn wait_in_service(fleet: &Fleet) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        fleet.sync_all().await?;
        let down = members_down(fleet).await?;
        if down.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("members not in service 60 s after the cluster converged: {down:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (requested, capacity) of each member claim.
async fn claims(fleet: &Fleet) -> Result<Vec<(String, String)>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let mut out = Vec::new();
    for o in 0..3 {
        let pvc = api.get(&format!("data-{STS}-{o}")).await?;
        let requested = (pvc
            .spec
            .and_then(|s| s.resources?.requests?.get("storage").cloned()))
        .context("no request")?;
        let capacity = (pvc.status.and_then(|s| s.capacity?.get("storage").cloned()))
            .context("no capacity")?;
        out.push((requested.0, capacity.0));
    }
    Ok(out)
}

/// Member pods missing, being deleted or not ready.
async fn members_down(fleet: &Fleet) -> Result<Vec<String>> {
    let api: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let mut down = Vec::new();
    for o in 0..3 {
        let pod = api.get_opt(&format!("{STS}-{o}")).await?;
        let ready = (pod.as_ref())
            .and_then(|p| p.status.as_ref()?.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let deleting = pod
            .as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        if pod.is_none() || deleting || ready.is_none_or(|c| c.status != "True") {
            let since = ready
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0);
            down.push(format!(
                "{o}: pod {}, deleting {deleting}, Ready {:?} since {since:?}",
                pod.as_ref()
                    .map_or("none".into(), |p| p.uid().unwrap_or_default()),
                ready.map(|c| c.status.clone()),
            ));
        }
    }
    Ok(down)
}

/// Converges `etcd-a`, counting after every runtime sync which members are
/// down; returns the log and the sample with the most down at once (its
/// time first), which the tests bound at one.
async fn converge_counting_down(
    fleet: &Fleet,
    ctl: &mut TestController,
    after_step: impl FnMut(&str, &Step, &mut TestController) -> Result<()>,
) -> Result<(ConvergeLog, Vec<String>)> {
    let most = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let between = || {
        let most = most.clone();
        async move {
            fleet.sync_all().await?;
            let down = members_down(fleet).await?;
            let mut most = most.lock().expect("sample lock");
            if down.len() + 1 > most.len() && !down.is_empty() {
                *most = std::iter::once(k8s_openapi::jiff::Timestamp::now().to_string())
                    .chain(down)
                    .collect();
            }
            Ok(())
        }
    };
    let log = converge(
        ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(240),
        between,
        after_step,
    )
    .await
    .with_context(|| fleet.runtime("a").all_pod_logs(30))?;
    let most = most.lock().expect("sample lock").clone();
    Ok((log, most))
}

/// How many members the sample of [`converge_counting_down`] had down.
fn down_count(sample: &[String]) -> usize {
    sample.len().saturating_sub(1)
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

/// The `--quota-backend-bytes` of the StatefulSet's template and of every
/// member pod.
async fn quotas(fleet: &Fleet) -> Result<(String, Vec<String>)> {
    let quota = |spec: Option<&k8s_openapi::api::core::v1::PodSpec>| {
        (spec
            .and_then(|s| s.containers.first()?.args.clone())
            .into_iter()
            .flatten())
        .find_map(|a| a.strip_prefix("--quota-backend-bytes=").map(str::to_string))
        .unwrap_or_default()
    };
    let client = fleet.workload_client("a");
    let sts = Api::<StatefulSet>::namespaced(client.clone(), WORKLOAD_NS)
        .get(STS)
        .await?;
    let pods = Api::<Pod>::namespaced(client, WORKLOAD_NS);
    let mut members = Vec::new();
    for o in 0..3 {
        members.push(quota(pods.get(&format!("{STS}-{o}")).await?.spec.as_ref()));
    }
    Ok((quota(sts.spec.template.spec.as_ref()), members))
}

fn claim_template_size(sts: &StatefulSet) -> Option<String> {
    let claim = sts.spec.volume_claim_templates.as_ref()?.first()?;
    Some(
        claim
            .spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")?
            .0
            .clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resize_grows_every_volume_online_one_member_at_a_time_and_the_quota_follows() -> Result<()>
{
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "expandable", true).await?;
    let mut ctl = create_sized(&fleet, "expandable", "1Gi").await?;
    assert_eq!(quotas(&fleet).await?.0, (512u64 << 20).to_string());
    let sts_uid = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get(STS)
        .await?
        .uid();

    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "2Gi"}}),
    )
    .await?;
    let (log, most_down) = converge_counting_down(&fleet, &mut ctl, no_hook).await?;
    let report = writer.stop().await?;

    // One claim at a time, then the StatefulSet, then the roll onto the
    // template (the quota): never two members down at once.
    assert_eq!(
        storage_kinds(&log),
        [
            "ExpandVolume",
            "ExpandVolume",
            "ExpandVolume",
            "RecreateStatefulSet",
            "RestartMember",
            "RestartMember",
            "RestartMember"
        ],
        "{:?}",
        log.steps
    );
    assert!(
        down_count(&most_down) <= 1,
        "members down at once: {most_down:?}"
    );
    for (requested, capacity) in claims(&fleet).await? {
        assert_eq!((requested.as_str(), capacity.as_str()), ("2Gi", "2Gi"));
    }
    let sts = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get(STS)
        .await?;
    assert_ne!(sts.uid(), sts_uid, "the StatefulSet was created again");
    assert_eq!(claim_template_size(&sts).as_deref(), Some("2Gi"));
    let (template, members) = quotas(&fleet).await?;
    assert_eq!(template, (1u64 << 30).to_string(), "half of 2Gi");
    assert_eq!(members, vec![template.clone(); 3]);
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");
    verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expand_that_needs_a_pod_start_restarts_each_member_once_under_the_quorum_guard()
-> Result<()> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "expandable", true).await?;
    fleet.runtime("a").set_resize(ResizeMode::AtPodStart);
    let mut ctl = create_sized(&fleet, "expandable", "1Gi").await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "2Gi"}}),
    )
    .await?;
    let (log, most_down) = converge_counting_down(&fleet, &mut ctl, no_hook).await?;
    let report = writer.stop().await?;
    let kinds = storage_kinds(&log);
    // Each member: its claim expanded, then (its file system waiting for a
    // pod start) restarted, before the next claim is touched.
    assert_eq!(
        kinds[..6],
        [
            "ExpandVolume",
            "RestartForResize",
            "ExpandVolume",
            "RestartForResize",
            "ExpandVolume",
            "RestartForResize"
        ],
        "{:?}",
        log.steps
    );
    assert_eq!(kinds[6], "RecreateStatefulSet");
    assert!(
        down_count(&most_down) <= 1,
        "members down at once: {most_down:?}"
    );
    for (requested, capacity) in claims(&fleet).await? {
        assert_eq!((requested.as_str(), capacity.as_str()), ("2Gi", "2Gi"));
    }
    verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    Ok(())
}

/// Reconciles three times with nothing else moving, and returns the
/// workload writes the controller made (none is allowed) and the refusal.
async fn refused_with_nothing_written(
    fleet: &Fleet,
    ctl: &mut TestController,
) -> Result<(String, String)> {
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        ensure!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    assert!(writes.is_empty(), "the refusal wrote: {writes:#?}");
    let status = get(fleet, "etcd-a").await?.status.context("no status")?;
    let c = conditions::find(&status.conditions, conditions::CONFLICT).context("no Conflict")?;
    assert_eq!(c.status, "True");
    Ok((c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shrink_and_a_class_that_cannot_expand_or_be_read_are_refused_with_nothing_written()
-> Result<()> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    storage_class(&fleet, "fixed", false).await?;
    let mut ctl = create_sized(&fleet, "fixed", "1Gi").await?;

    // Without the optional RBAC the class cannot be read.
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "2Gi"}}),
    )
    .await?;
    let (reason, message) = refused_with_nothing_written(&fleet, &mut ctl).await?;
    assert_eq!(reason, "StorageClassUnreadable");
    assert!(message.contains("config/workload-rbac-nodes"), "{message}");

    // Readable, and it does not allow expansion.
    grant_cluster_reads(&fleet)?;
    let (reason, message) = refused_with_nothing_written(&fleet, &mut ctl).await?;
    assert_eq!(reason, "StorageNotExpandable");
    assert!(
        message.contains("StorageClass \"fixed\" does not set allowVolumeExpansion: true"),
        "{message}"
    );

    // A shrink.
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "512Mi"}}),
    )
    .await?;
    let (reason, message) = refused_with_nothing_written(&fleet, &mut ctl).await?;
    assert_eq!(reason, "StorageShrink");
    assert!(
        message.contains("512Mi is smaller than the members' volumes"),
        "{message}"
    );

    // Back to the size the volumes have: nothing to do, no refusal.
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "1Gi"}}),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert!(!conditions::is_true(
        &status.conditions,
        conditions::CONFLICT
    ));
    for (requested, capacity) in claims(&fleet).await? {
        assert_eq!((requested.as_str(), capacity.as_str()), ("1Gi", "1Gi"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resize_cures_a_nospace_alarm_when_the_quota_follows_the_size() -> Result<()> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "expandable", true).await?;
    // 8Mi volumes, a 4 MiB quota.
    let mut ctl = create_sized(&fleet, "expandable", "8Mi").await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    // Distinct keys: live data, which compaction cannot give back.
    let fill = fill_with_live_data(&endpoints, &config, 4 << 20, 128 * 1024).await?;
    let written = fill.written;

    // Compaction and defragmentation cannot cure it; the error says how.
    // (The recovery waits while a member's health check is slow to answer.)
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let err = loop {
        fleet.sync_all().await?;
        match ctl.reconcile(NS, "etcd-a").await {
            Err(e) => break e.to_string(),
            Ok(Outcome::Waiting(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok(other) => anyhow::bail!("expected the NOSPACE recovery to fail: {other:?}"),
        }
    };
    assert!(err.contains("NOSPACE persists"), "{err}");
    assert!(err.contains("grow spec.storage.size"), "{err}");

    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"size": "32Mi"}}),
    )
    .await?;
    let log = converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let kinds: Vec<&str> = log.steps.iter().map(|(_, s)| s.kind()).collect();
    let grow = kinds
        .iter()
        .position(|k| *k == "RecreateStatefulSet")
        .context("no re-creation")?;
    let cure = kinds
        .iter()
        .position(|k| *k == "RecoverFromNoSpace")
        .context("no NOSPACE cure")?;
    assert!(
        grow < cure,
        "the volumes grow before the alarm is cured: {kinds:?}"
    );
    assert_eq!(quotas(&fleet).await?.1, vec![(16u64 << 20).to_string(); 3]);
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert!(conditions::is_true(
        &status.conditions,
        conditions::AVAILABLE
    ));
    // Every member restarted since `kv` connected: a client of the
    // converged cluster writes and reads.
    let mut kv = etcdfleet_controllers::etcd::ClusterClient::connect(&endpoints, &config)
        .await?
        .kv();
    kv.put("after-growth", "ok", None).await?;
    let all = kv
        .get(
            "live/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await?;
    // The put answered NOSPACE may be stored too (`LiveFill::written`).
    assert!(
        all.count() == written || all.count() == written + 1,
        "every key written before NOSPACE is kept: {} of {written} (+1 refused)",
        all.count()
    );
    Ok(())
}

/// (name, class) of every claim of `etcd-a`, by name.
async fn claim_classes(fleet: &Fleet) -> Result<Vec<(String, String)>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let mut out: Vec<(String, String)> = (api.list(&Default::default()).await?.items.iter())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let class = p.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            (p.name_any(), class.unwrap_or_default())
        })
        .collect();
    out.sort();
    Ok(out)
}

async fn cluster_id(
    endpoints: &[String],
    config: &etcdfleet_controllers::etcd::EtcdConfig,
) -> Result<u64> {
    let client = etcdfleet_controllers::etcd::ClusterClient::connect(endpoints, config).await?;
    Ok(client.leader().await?.1.cluster_id)
}

/// `etcd-a` on class `old`, a writer running, its class just set to `new`.
struct Moving {
    fleet: Fleet,
    ctl: TestController,
    endpoints: Vec<String>,
    config: etcdfleet_controllers::etcd::EtcdConfig,
    /// The etcd cluster id before the move.
    id: u64,
    writer: AckedWriter,
}

async fn moving_to_new() -> Result<Moving> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "old", false).await?;
    storage_class(&fleet, "new", false).await?;
    let ctl = create_sized(&fleet, "old", "1Gi").await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let id = cluster_id(&endpoints, &config).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"storageClassName": "new"}}),
    )
    .await?;
    Ok(Moving {
        fleet,
        ctl,
        endpoints,
        config,
        id,
        writer,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_class_move_replaces_members_one_at_a_time_through_a_controller_restart()
-> Result<()> {
    let Moving {
        fleet,
        mut ctl,
        endpoints,
        config,
        id,
        writer,
    } = moving_to_new().await?;

    // A fresh controller (nothing in memory) after every membership step.
    let mut restarts = 0;
    let restart = |_: &str, step: &Step, ctl: &mut TestController| {
        if matches!(step, Step::RemoveMember { .. } | Step::AddLearner { .. }) {
            *ctl = controller(&fleet);
            restarts += 1;
        }
        Ok(())
    };
    let (log, most_down) = converge_counting_down(&fleet, &mut ctl, restart).await?;
    let report = writer.stop().await?;

    let kinds: Vec<String> = (log.steps.iter())
        .filter_map(|(_, s)| match s {
            Step::Storage(s) => Some(s.kind().to_string()),
            Step::AddLearner { ordinal } => Some(format!("AddLearner {ordinal}")),
            Step::RemoveMember { ordinal, cause, .. } => {
                Some(format!("Remove {} {cause:?}", ordinal.unwrap_or(99)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "RecreateStatefulSet",
            "AddLearner 3",
            "Remove 2 StorageClassMove",
            "AddLearner 2",
            "Remove 1 StorageClassMove",
            "AddLearner 1",
            "Remove 0 StorageClassMove",
            "AddLearner 0",
            "Remove 3 ScaleDown"
        ],
        "{:?}",
        log.steps
    );
    assert!(restarts >= 8, "{restarts} restarts");
    assert!(
        down_count(&most_down) <= 1,
        "members down at once: {most_down:?}"
    );
    let new = |o: u32| (format!("data-{STS}-{o}"), "new".to_string());
    assert_eq!(claim_classes(&fleet).await?, vec![new(0), new(1), new(2)]);
    let sts = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get(STS)
        .await?;
    let template = sts
        .spec
        .volume_claim_templates
        .as_ref()
        .context("no claim template")?;
    let class = template[0]
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone());
    assert_eq!(class.as_deref(), Some("new"));
    assert_eq!(sts.spec.replicas, Some(3));
    assert_eq!(
        cluster_id(&endpoints, &config).await?,
        id,
        "the same etcd cluster"
    );
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");
    verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    Ok(())
}

/// Reconciles `etcd-a` until it takes `wanted` (errors and waits aside).
async fn reconcile_until(fleet: &Fleet, ctl: &mut TestController, wanted: &Step) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        fleet.sync_all().await?;
        if let Ok(Outcome::Acted(step)) = ctl.reconcile(NS, "etcd-a").await
            && &step == wanted
        {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "never took {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_class_move_reverted_half_way_brings_every_member_back_to_the_first_class()
-> Result<()> {
    let Moving {
        fleet,
        mut ctl,
        endpoints,
        config,
        id,
        writer,
    } = moving_to_new().await?;
    let class = |name: &str| serde_json::json!({"storage": {"storageClassName": name}});
    // Half way: the spare (3) and ordinal 2 are on `new`, 0 and 1 on `old`.
    reconcile_until(&fleet, &mut ctl, &Step::AddLearner { ordinal: 2 }).await?;
    patch_spec(&fleet, "etcd-a", class("old")).await?;
    let (log, most_down) = converge_counting_down(&fleet, &mut ctl, no_hook).await?;
    let report = writer.stop().await?;

    let old = |o: u32| (format!("data-{STS}-{o}"), "old".to_string());
    assert_eq!(claim_classes(&fleet).await?, vec![old(0), old(1), old(2)]);
    // The StatefulSet takes `old` back once. (Members 0 and 1, made from
    // the template before the move, are first rolled onto the template of
    // the move's re-creation, then back: a roll the StatefulSet's hash of
    // every input asks for; see docs/storage.md.)
    let kinds = storage_kinds(&log);
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "RecreateStatefulSet")
            .count(),
        1,
        "{:?}",
        log.steps
    );
    let moved: Vec<u32> = (log.steps.iter())
        .filter_map(|(_, s)| match s {
            Step::RemoveMember {
                ordinal: Some(o),
                cause: etcdfleet_controllers::etcdcluster::plan::RemovalCause::StorageClassMove,
                ..
            } => Some(*o),
            _ => None,
        })
        .collect();
    // Members 0 and 1 never left `old`: only those on `new` (2, and the
    // spare at 3 if it is moved before it leaves) move back.
    assert!(
        moved.contains(&2) && moved.iter().all(|o| *o >= 2),
        "moved back {moved:?}: {:?}",
        log.steps
    );
    assert!(
        down_count(&most_down) <= 1,
        "members down at once: {most_down:?}"
    );
    let sts = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get(STS)
        .await?;
    assert_eq!(sts.spec.replicas, Some(3));
    assert_eq!(
        cluster_id(&endpoints, &config).await?,
        id,
        "the same etcd cluster"
    );
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");
    verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_class_that_cannot_provision_holds_the_move_naming_the_class_and_the_event()
-> Result<()> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "old", false).await?;
    storage_class(&fleet, "broken", false).await?;
    fleet.runtime("a").set_provisioning("broken", false);
    let mut ctl = create_sized(&fleet, "old", "1Gi").await?;
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"storageClassName": "broken"}}),
    )
    .await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let held = loop {
        fleet.sync_all().await?;
        if let Outcome::Held(why) = ctl.reconcile(NS, "etcd-a").await? {
            break why;
        }
        ensure!(std::time::Instant::now() < deadline, "the move never held");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        held.contains("the move to StorageClass broken waits"),
        "{held}"
    );
    assert!(
        held.contains(&format!("the volume of {STS}-3 is not provisioned")),
        "{held}"
    );
    assert!(
        held.contains("ProvisioningFailed: no volume can be provisioned"),
        "{held}"
    );
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    let progressing =
        conditions::find(&status.conditions, conditions::PROGRESSING).context("no Progressing")?;
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "NeedsAttention")
    );
    assert_eq!(progressing.message, held);
    // Every member still serves on its old volume.
    for o in 0..3 {
        let (name, class) = &claim_classes(&fleet).await?[o];
        assert_eq!(
            (name.as_str(), class.as_str()),
            (format!("data-{STS}-{o}").as_str(), "old")
        );
    }
    assert_eq!(members_down(&fleet).await?, Vec::<String>::new());

    // The provisioner fixed: the move goes on to the end.
    fleet.runtime("a").set_provisioning("broken", true);
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let broken = |o: u32| (format!("data-{STS}-{o}"), "broken".to_string());
    assert_eq!(
        claim_classes(&fleet).await?,
        vec![broken(0), broken(1), broken(2)]
    );
    Ok(())
}

/// A one-member cluster of `ClusterEtcdTemplate` `sized` (`size` volumes of
/// the expandable class, created first).
async fn from_sized_template(fleet: &Fleet, size: &str) -> Result<TestController> {
    use etcdfleet_api::{
        ClusterEtcdTemplate, ClusterRef, EtcdCluster, EtcdClusterSpec, EtcdConfig, TemplateKind,
        TemplateRef,
    };
    let templates: Api<ClusterEtcdTemplate> = Api::all(fleet.management_direct());
    templates
        .create(&PostParams::default(), &sized_template(size))
        .await?;
    let mut c = EtcdCluster::new(
        "etcd-a",
        EtcdClusterSpec {
            cluster_ref: Some(ClusterRef { name: "a".into() }),
            template_ref: Some(TemplateRef {
                kind: TemplateKind::ClusterEtcdTemplate,
                name: "sized".into(),
            }),
            config: EtcdConfig {
                etcd: Some(fast_raft()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(NS.into());
    create(fleet, &c).await?;
    let mut ctl = controller(fleet);
    converge_all(fleet, &mut ctl, &["etcd-a"]).await?;
    Ok(ctl)
}
fn sized_template(size: &str) -> etcdfleet_api::ClusterEtcdTemplate {
    etcdfleet_api::ClusterEtcdTemplate::new(
        "sized",
        etcdfleet_api::ClusterEtcdTemplateSpec {
            description: None,
            config: etcdfleet_api::EtcdConfig {
                version: Some("3.5.1".into()),
                replicas: Some(1),
                storage: Some(StorageSpec {
                    storage_class_name: Some("expandable".into()),
                    size: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                        size.into(),
                    )),
                }),
                ..Default::default()
            },
        },
    )
}

/// (requested, capacity) of the one member's claim.
async fn claim_of_member_0(fleet: &Fleet) -> Result<(String, String)> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let pvc = api.get(&format!("data-{STS}-0")).await?;
    let requested = (pvc
        .spec
        .and_then(|s| s.resources?.requests?.get("storage").cloned()))
    .context("no request")?;
    let capacity =
        (pvc.status.and_then(|s| s.capacity?.get("storage").cloned())).context("no capacity")?;
    Ok((requested.0, capacity.0))
}

/// The template `sized` now gives `size`, and `etcd-a` is rebased onto it.
async fn rebase_onto(fleet: &Fleet, ctl: &mut TestController, size: &str) -> Result<ConvergeLog> {
    use etcdfleet_api::ClusterEtcdTemplate;
    use etcdfleet_controllers::etcdcluster::resolve::REBASE_ANNOTATION;
    use kube::api::{Patch, PatchParams};
    let templates: Api<ClusterEtcdTemplate> = Api::all(fleet.management_direct());
    let mut edited = templates.get("sized").await?;
    edited.spec = sized_template(size).spec;
    templates
        .replace("sized", &PostParams::default(), &edited)
        .await?;
    let rebase =
        serde_json::json!({ "metadata": { "annotations": { REBASE_ANNOTATION: "true" } } });
    Api::<etcdfleet_api::EtcdCluster>::namespaced(fleet.management_direct(), NS)
        .patch("etcd-a", &PatchParams::default(), &Patch::Merge(&rebase))
        .await?;
    converge_all(fleet, ctl, &["etcd-a"]).await
}

/// A rebase carries storage like every other field: the template's larger
/// size grows the volume through the storage rules, as an edit of the spec
/// would; its smaller size is not carried (volumes never shrink), and
/// `TemplateResolved` names the field and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebase_after_a_templates_storage_growth_grows_the_volumes_and_a_shrink_is_not_carried()
-> Result<()> {
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "expandable", true).await?;
    let mut ctl = from_sized_template(&fleet, "1Gi").await?;
    assert_eq!(
        claim_of_member_0(&fleet).await?,
        ("1Gi".into(), "1Gi".into())
    );

    let log = rebase_onto(&fleet, &mut ctl, "2Gi").await?;
    assert_eq!(
        storage_kinds(&log),
        ["ExpandVolume", "RecreateStatefulSet", "RestartMember"],
        "{:?}",
        log.steps
    );
    let cluster = get(&fleet, "etcd-a").await?;
    let size = (cluster.spec.config.storage.as_ref()).and_then(|s| s.size.clone());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("2Gi"));
    assert_eq!(
        claim_of_member_0(&fleet).await?,
        ("2Gi".into(), "2Gi".into())
    );
    let status = cluster.status.context("no status")?;
    let resolved = conditions::find(&status.conditions, conditions::TEMPLATE_RESOLVED)
        .context("no TemplateResolved")?;
    assert_eq!(resolved.reason, "Resolved", "{resolved:?}");

    let log = rebase_onto(&fleet, &mut ctl, "512Mi").await?;
    assert_eq!(storage_kinds(&log), Vec::<&str>::new(), "{:?}", log.steps);
    let cluster = get(&fleet, "etcd-a").await?;
    let size = (cluster.spec.config.storage.as_ref()).and_then(|s| s.size.clone());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("2Gi"), "not carried");
    let status = cluster.status.context("no status")?;
    let resolved = conditions::find(&status.conditions, conditions::TEMPLATE_RESOLVED)
        .context("no TemplateResolved")?;
    assert_eq!(
        (resolved.status.as_str(), resolved.reason.as_str()),
        ("True", "NotCarried")
    );
    assert!(
        resolved
            .message
            .contains("spec.storage.size stays 2Gi: the template's 512Mi is smaller"),
        "{resolved:?}"
    );
    let not_carried = status.template.map(|t| t.not_carried).unwrap_or_default();
    assert_eq!(not_carried.len(), 1, "{not_carried:?}");
    assert!(!conditions::is_true(
        &status.conditions,
        conditions::CONFLICT
    ));
    assert_eq!(
        claim_of_member_0(&fleet).await?,
        ("2Gi".into(), "2Gi".into())
    );
    Ok(())
}

/// Makes `name` a Ready Node of workload `a`.
async fn ready_node(fleet: &Fleet, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    let nodes = Api::<Node>::all(fleet.workload_client("a"));
    nodes.create(&PostParams::default(), &node).await?;
    let ready =
        serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    Ok(())
}

/// A move adds its spare before it removes anyone; where the pods require a
/// node each (as `ha-3` sets) and the workload cluster has no node more
/// than members, the spare could never run: the move is refused up front,
/// nothing is written, and the condition names the spare and the Nodes.
/// Once a fourth node is there, the move starts and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_class_move_with_no_spare_node_is_refused_up_front_until_one_is_added() -> Result<()>
{
    require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is needed")?;
    let fleet = Fleet::new(&["a"]).await?;
    grant_cluster_reads(&fleet)?;
    storage_class(&fleet, "old", false).await?;
    storage_class(&fleet, "new", false).await?;
    for node in ["n1", "n2", "n3"] {
        ready_node(&fleet, node).await?;
    }
    let mut c = cluster("etcd-a", "a", 3, "3.5.1");
    c.spec.config.storage = Some(StorageSpec {
        storage_class_name: Some("old".into()),
        size: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "1Gi".into(),
        )),
    });
    c.spec.config.pod_template = Some(serde_json::from_value(serde_json::json!({
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "etcd"}},
        }]}}
    }))?);
    create(&fleet, &c).await?;
    let mut ctl = controller(&fleet);
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;

    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({"storage": {"storageClassName": "new"}}),
    )
    .await?;
    let (reason, message) = refused_with_nothing_written(&fleet, &mut ctl).await?;
    assert_eq!(reason, "StorageMoveNeedsSpareNode");
    for words in [
        "a spare member (etcd-a-etcd-3)",
        "3 of the workload cluster's Nodes can run a member (n1, n2, n3), and 4 members need 4",
        "Add a node",
    ] {
        assert!(message.contains(words), "{words}: {message}");
    }
    let old = |o: u32| (format!("data-{STS}-{o}"), "old".to_string());
    assert_eq!(claim_classes(&fleet).await?, vec![old(0), old(1), old(2)]);

    ready_node(&fleet, "n4").await?;
    let log = converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    assert_eq!(
        storage_kinds(&log).first(),
        Some(&"RecreateStatefulSet"),
        "{:?}",
        log.steps
    );
    let new = |o: u32| (format!("data-{STS}-{o}"), "new".to_string());
    assert_eq!(claim_classes(&fleet).await?, vec![new(0), new(1), new(2)]);
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert!(!conditions::is_true(
        &status.conditions,
        conditions::CONFLICT
    ));
    Ok(())
}
