//! End to end on real etcd: the controller is safe on a real fleet (issue
//! 10). Each test sets up a state that today's fleets meet — two teams using
//! one name, a spec edited under a running cluster, a lost Secret, a member
//! the controller did not add, a quorum gone — and proves what the
//! controller does and, above all, what it does not do.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::conditions::{self, AVAILABLE, CONFLICT};
use etcdfleet_controllers::etcd::{ClusterClient, MemberClient};
use etcdfleet_controllers::etcdcluster::plan::{RemovalCause, Step};
use etcdfleet_controllers::etcdcluster::{self, Outcome};
use etcdfleet_tests::driver::{TestController, fast_settings};
use etcdfleet_tests::etcd_harness::{
    AckedWriter, EtcdVersion, fill_with_live_data, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::fleet::{ApiOp, Fleet, MANAGEMENT};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, converge_all, create, etcd_of, get, patch_spec, put, read_everywhere,
    running, set_replicas,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;

/// Writes the controller made to workload clusters (not to the management API).
fn workload_writes(fleet: &Fleet) -> Vec<ApiOp> {
    fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster != MANAGEMENT)
        .collect()
}

fn conflict_of(c: &EtcdCluster) -> Option<(String, String, String)> {
    let status = c.status.as_ref()?;
    let cond = conditions::find(&status.conditions, CONFLICT)?;
    Some((
        cond.status.clone(),
        cond.reason.clone(),
        cond.message.clone(),
    ))
}

/// Reconciles `name` repeatedly for `for_at_least` without letting the
/// workload runtime restart anything, returning every outcome.
async fn reconcile_for(
    ctl: &TestController,
    name: &str,
    for_at_least: Duration,
) -> Vec<Result<Outcome, String>> {
    let until = Instant::now() + for_at_least;
    let mut outcomes = Vec::new();
    while Instant::now() < until {
        outcomes.push(ctl.reconcile(NS, name).await.map_err(|e| e.to_string()));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    outcomes
}

fn destructive(outcomes: &[Result<Outcome, String>]) -> Vec<Step> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(Outcome::Acted(step)) if step.is_destructive() => Some(step.clone()),
            _ => None,
        })
        .collect()
}

/// Namespace `team-b` with its own kubeconfig Secret for workload `a`, and
/// its EtcdCluster `etcd` (1 member, 3.5.1) there: the same name as a
/// team-a cluster, in the same workload cluster.
async fn team_b_creates_etcd_on_a(fleet: &Fleet) -> Result<Api<EtcdCluster>> {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(fleet.management_direct())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({ "metadata": { "name": "team-b" } }))?,
        )
        .await?;
    let secrets: Api<Secret> = Api::namespaced(fleet.management_direct(), NS);
    let mut kubeconfig = secrets.get(&Fleet::kubeconfig_secret_name("a")).await?;
    kubeconfig.metadata = kube::api::ObjectMeta {
        name: kubeconfig.metadata.name.clone(),
        namespace: Some("team-b".into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fleet.management_direct(), "team-b")
        .create(&PostParams::default(), &kubeconfig)
        .await?;
    let mut theirs = cluster("etcd", "a", 1, "3.5.1");
    theirs.metadata.namespace = Some("team-b".into());
    let team_b: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), "team-b");
    team_b.create(&PostParams::default(), &theirs).await?;
    Ok(team_b)
}

/// Deletes EtcdCluster `name` of [`NS`] and reconciles until it is gone;
/// its PVCs stay (a StatefulSet's claims outlive it), its pods stop.
async fn delete_keeping_volumes(fleet: &Fleet, ctl: &TestController, name: &str) -> Result<()> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.delete(name, &DeleteParams::default()).await?;
    assert_eq!(ctl.reconcile(NS, name).await?, Outcome::Deleted);
    anyhow::ensure!(api.get_opt(name).await?.is_none(), "{name} still there");
    fleet.sync_all().await?;
    Ok(())
}

/// The annotations of member PVC `data-<name>-etcd-<ordinal>` in workload `a`.
async fn pvc_annotations(
    fleet: &Fleet,
    name: &str,
    ordinal: u32,
) -> Result<std::collections::BTreeMap<String, String>> {
    let pvc = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        fleet.workload_client("a"),
        WORKLOAD_NS,
    )
    .get(&format!("data-{name}-etcd-{ordinal}"))
    .await?;
    Ok(pvc.metadata.annotations.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_recreated_over_kept_volumes_refuses_a_downgrade_and_resumes_on_its_version()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    put(&fleet, "a", "etcd-a", 1, "kept").await?;
    // Each volume says whose data it holds and which etcd last ran on it.
    let recorded = pvc_annotations(&fleet, "etcd-a", 0).await?;
    assert_eq!(
        recorded
            .get("etcdfleet.dev/etcd-version")
            .map(String::as_str),
        Some("3.5.1"),
        "{recorded:?}"
    );
    assert_eq!(
        recorded.get("etcdfleet.dev/owner").map(String::as_str),
        Some("team-a.etcd-a")
    );
    delete_keeping_volumes(&fleet, &ctl, "etcd-a").await?;

    // Recreated asking for 3.4: the 3.5 data must not be started by it.
    create(&fleet, &cluster("etcd-a", "a", 1, "3.4.23")).await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    assert!(
        Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
            .get_opt("etcd-a-etcd")
            .await?
            .is_none(),
        "no StatefulSet was started on the kept data"
    );
    let statefulset_writes: Vec<ApiOp> = workload_writes(&fleet)
        .into_iter()
        .filter(|o| o.resource == "statefulsets")
        .collect();
    assert!(statefulset_writes.is_empty(), "{statefulset_writes:#?}");
    let c = get(&fleet, "etcd-a").await?;
    let (status, reason, message) = conflict_of(&c).context("no Conflict condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "VersionRejected")
    );
    assert!(
        message.contains("data-etcd-a-etcd-0") && message.contains("3.5.1"),
        "{message}"
    );

    // Asking for the version of the data: it starts on it, data intact.
    patch_spec(&fleet, "etcd-a", serde_json::json!({ "version": "3.5.1" })).await?;
    let mut ctl = ctl;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    read_everywhere(&fleet, "a", "etcd-a", 1, "kept").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_volume_of_another_cluster_is_never_reused_or_deleted() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd", "a", 1, "3.5.1")]).await?;
    put(&fleet, "a", "etcd", 1, "team-a-data").await?;
    delete_keeping_volumes(&fleet, &ctl, "etcd").await?;
    let before = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        fleet.workload_client("a"),
        WORKLOAD_NS,
    )
    .get("data-etcd-etcd-0")
    .await?;

    // team-b's `etcd` has the same workload names; team-a's volume is there.
    let team_b = team_b_creates_etcd_on_a(&fleet).await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile("team-b", "etcd").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let writes = workload_writes(&fleet);
    assert!(writes.is_empty(), "team-b wrote: {writes:#?}");
    let (status, reason, message) =
        conflict_of(&team_b.get("etcd").await?).context("no Conflict condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ObjectOwnedElsewhere")
    );
    assert!(
        message
            .contains("PersistentVolumeClaim/etcd-system/data-etcd-etcd-0 (owned by team-a.etcd)"),
        "{message}"
    );
    let after = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        fleet.workload_client("a"),
        WORKLOAD_NS,
    )
    .get("data-etcd-etcd-0")
    .await?;
    assert_eq!(before.metadata.uid, after.metadata.uid);
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_name_in_two_namespaces_conflicts_and_never_overwrites_or_deletes_the_other()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd", "a", 1, "3.5.1")]).await?;
    put(&fleet, "a", "etcd", 1, "team-a-data").await?;

    // team-b: same name, same workload cluster, its own kubeconfig Secret.
    let team_b = team_b_creates_etcd_on_a(&fleet).await?;

    let sts_before = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get("etcd-etcd")
        .await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile("team-b", "etcd").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    assert!(
        workload_writes(&fleet).is_empty(),
        "team-b wrote into team-a's etcd: {:#?}",
        workload_writes(&fleet)
    );
    let b = team_b.get("etcd").await?;
    let (status, reason, message) = conflict_of(&b).context("no Conflict condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ObjectOwnedElsewhere")
    );
    assert!(
        message.contains("StatefulSet/etcd-system/etcd-etcd (owned by team-a.etcd)"),
        "{message}"
    );
    assert!(
        message.contains("Secret/etcd-system/etcd-etcd-server-tls (owned by team-a.etcd)"),
        "{message}"
    );

    // Deleting team-b's cluster deletes nothing of team-a's.
    let mut deleting = b.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    fleet.clear_ops();
    let outcome =
        etcdfleet_controllers::etcdcluster::reconcile_cluster(&deleting, &ctl.ctx).await?;
    assert_eq!(outcome, Outcome::Deleted);
    assert!(
        workload_writes(&fleet).is_empty(),
        "cleanup of team-b deleted: {:#?}",
        workload_writes(&fleet)
    );
    let sts_after = Api::<StatefulSet>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get("etcd-etcd")
        .await?;
    assert_eq!(sts_before.metadata.uid, sts_after.metadata.uid);
    assert_eq!(
        sts_before.metadata.resource_version,
        sts_after.metadata.resource_version
    );
    // team-a is untouched and still converged with its data.
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    read_everywhere(&fleet, "a", "etcd", 1, "team-a-data").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_identity_is_refused_before_any_workload_call() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    let identity = get(&fleet, "etcd-a")
        .await?
        .status
        .and_then(|s| s.identity)
        .context("identity not recorded")?;
    assert_eq!(identity.workload_namespace, WORKLOAD_NS);
    assert!(identity.tls);
    assert_eq!(identity.kubeconfig_secret, "a-kubeconfig/value");

    // An API server without the CEL rules (CRDs of an older release) lets
    // these edits through; the recorded identity does not.
    fleet.management_api().set_crd_transition_rules(false);
    for edit in [
        serde_json::json!({ "workloadNamespace": "elsewhere" }),
        serde_json::json!({ "tls": { "enabled": false } }),
        serde_json::json!({ "clusterRef": { "name": "b" } }),
    ] {
        let before = get(&fleet, "etcd-a").await?.spec;
        patch_spec(&fleet, "etcd-a", edit.clone()).await?;
        fleet.clear_ops();
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert!(
            matches!(outcome, Outcome::Blocked(_)),
            "{edit}: {outcome:?}"
        );
        let touched: Vec<ApiOp> = fleet
            .ops()
            .into_iter()
            .filter(|o| o.cluster != MANAGEMENT)
            .collect();
        assert!(touched.is_empty(), "{edit}: {touched:#?}");
        let (status, reason, message) =
            conflict_of(&get(&fleet, "etcd-a").await?).context("no Conflict condition")?;
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "IdentityChanged")
        );
        assert!(message.contains("Revert the spec"), "{message}");
        // Put the spec back: the cluster is managed again.
        let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
        let mut c = api.get("etcd-a").await?;
        c.spec = before;
        api.replace("etcd-a", &PostParams::default(), &c).await?;
        assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
        let (status, _, _) = conflict_of(&get(&fleet, "etcd-a").await?).unwrap();
        assert_eq!(status, "False");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn built_in_defaults_are_materialized_and_a_storage_change_the_volumes_cannot_take_is_refused()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let mut bare = cluster("etcd-a", "a", 1, "3.5.1");
    bare.spec.config.etcd = None;
    let (fleet, ctl) = running(&["a"], &[bare]).await?;
    let spec = get(&fleet, "etcd-a").await?.spec.config;
    assert_eq!(
        spec.image_repository.as_deref(),
        Some(etcdfleet_api::version::DEFAULT_IMAGE_REPOSITORY)
    );
    assert_eq!(spec.workload_namespace.as_deref(), Some(WORKLOAD_NS));
    assert_eq!(
        spec.storage
            .as_ref()
            .and_then(|s| s.size.as_ref())
            .map(|q| q.0.as_str()),
        Some(etcdfleet_api::template::DEFAULT_STORAGE_SIZE)
    );
    assert_eq!(spec.tls.as_ref().and_then(|t| t.enabled), Some(true));
    let tuning = spec.etcd.context("tuning not materialized")?;
    assert_eq!(
        tuning.quota_backend_bytes,
        Some(etcdfleet_api::template::DEFAULT_QUOTA_BACKEND_BYTES)
    );
    assert_eq!(
        tuning.heartbeat_interval_millis,
        Some(etcdfleet_api::template::DEFAULT_HEARTBEAT_INTERVAL_MILLIS)
    );
    assert!(tuning.election_timeout_millis.is_some());
    assert!(tuning.snapshot_count.is_some());
    assert!(tuning.auto_compaction_retention.is_some());

    // Materialized once: a converged reconcile writes nothing.
    fleet.clear_ops();
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    assert!(fleet.writes().is_empty(), "{:#?}", fleet.writes());

    // A larger size for volumes whose claims name no StorageClass (no
    // provisioner can grow them) is refused, and nothing is written.
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({ "storage": { "size": "16Gi" } }),
    )
    .await?;
    fleet.clear_ops();
    let outcome = ctl.reconcile(NS, "etcd-a").await?;
    assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    assert!(
        workload_writes(&fleet).is_empty(),
        "{:#?}",
        workload_writes(&fleet)
    );
    let (status, reason, message) =
        conflict_of(&get(&fleet, "etcd-a").await?).context("no Conflict condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "StorageNotExpandable")
    );
    assert!(
        message.contains("16Gi") && message.contains("the members' claims name no StorageClass"),
        "{message}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scale_config_roll_and_replacement_lose_no_acknowledged_write() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    // Boxed: the reconcile futures are large in debug builds, and this test
    // awaits many of them on the test thread's stack.
    let (fleet, mut ctl) = Box::pin(running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")])).await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Scale 3 → 5 → 3.
    set_replicas(&fleet, "etcd-a", 5).await?;
    Box::pin(converge_all(&fleet, &mut ctl, &["etcd-a"])).await?;
    set_replicas(&fleet, "etcd-a", 3).await?;
    Box::pin(converge_all(&fleet, &mut ctl, &["etcd-a"])).await?;

    // A flag change (what the NOSPACE condition tells users to do) reaches
    // every member: each is restarted from the new template, one at a time.
    let quota: i64 = 3 << 30;
    patch_spec(
        &fleet,
        "etcd-a",
        serde_json::json!({ "etcd": { "quotaBackendBytes": quota } }),
    )
    .await?;
    let log = Box::pin(converge_all(&fleet, &mut ctl, &["etcd-a"])).await?;
    let mut restarted: Vec<u32> = log
        .steps
        .iter()
        .filter_map(|(_, s)| match s {
            Step::RestartMember { ordinal, .. } => Some(*ordinal),
            _ => None,
        })
        .collect();
    restarted.sort();
    assert_eq!(restarted, vec![0, 1, 2], "{:?}", log.steps);
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    for o in 0..3 {
        let pod = pods.get(&format!("etcd-a-etcd-{o}")).await?;
        let args = pod.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap_or_default();
        assert!(
            args.iter()
                .any(|a| a == &format!("--quota-backend-bytes={quota}")),
            "pod {o} runs without the new quota: {args:?}"
        );
    }

    // An admission webhook rewrites the pods' images (a registry mirror): no
    // restart loop, the pods come from the current template.
    for o in 0..3 {
        let patch = serde_json::json!({ "spec": { "containers": [
            { "name": "etcd", "image": "mirror.example/etcd:v3.5.1" }
        ] } });
        pods.patch(
            &format!("etcd-a-etcd-{o}"),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
    }
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);

    // A wiped member is replaced. A follower: the leader still counts the
    // raft log the wipe removed, so the member cannot rejoin by itself (a
    // wiped leader's successor could feed it the log again).
    let before = get(&fleet, "etcd-a").await?.status.unwrap();
    let wiped = before
        .members
        .iter()
        .find(|m| !m.leader)
        .cloned()
        .context("a follower")?;
    fleet
        .runtime("a")
        .wipe_pvc(WORKLOAD_NS, &format!("data-{}", wiped.name))
        .await?;
    let log = Box::pin(converge_all(&fleet, &mut ctl, &["etcd-a"])).await?;
    assert!(
        log.steps.iter().any(|(_, s)| matches!(
            s,
            Step::RemoveMember {
                cause: RemovalCause::Failed,
                ..
            }
        )),
        "the wiped member {} was replaced: {:?}",
        wiped.name,
        log.steps
    );
    let after = get(&fleet, "etcd-a").await?.status.unwrap();
    let new_id = after
        .members
        .iter()
        .find(|m| m.name == wiped.name)
        .and_then(|m| m.id.clone());
    assert_ne!(wiped.id, new_id, "a replaced member has a new id");

    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    eprintln!(
        "acknowledged writes verified through scale, roll and replacement: {checked} (failed: {})",
        report.failed
    );
    assert!(checked > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_member_list_is_linearizable_and_names_the_member_that_answered() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let member = MemberClient::connect(&endpoints[2], &config).await?;
    let own_id = member.status().await?.member_id;
    let (answered_by, members) = member.fresh_members().await?;
    assert_eq!(answered_by, own_id);
    assert_eq!(members.len(), 3);

    // Members 0 and 1 down: member 2 alone still answers the plain (local)
    // member list, but can no longer prove its membership is current.
    for o in 0..2 {
        fleet
            .runtime("a")
            .kill_pod_process(WORKLOAD_NS, &format!("etcd-a-etcd-{o}"))
            .await?;
    }
    let stale = ClusterClient::connect(std::slice::from_ref(&endpoints[2]), &config)
        .await?
        .list_members()
        .await;
    assert!(stale.is_ok(), "the local member list answers: {stale:?}");
    let fresh = member.fresh_members().await;
    assert!(fresh.is_err(), "no quorum, yet a fresh list: {fresh:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_copy_cannot_overwrite_newer_status() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    let old = get(&fleet, "etcd-a").await?;
    // Someone else writes newer status; then a reconcile of the old copy
    // would change the status too (its only member is down, so it differs).
    fleet
        .runtime("a")
        .kill_pod_process(WORKLOAD_NS, "etcd-a-etcd-0")
        .await?;
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.patch_status(
        "etcd-a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": { "selector": "newer" } })),
    )
    .await?;
    let result = etcdfleet_controllers::etcdcluster::reconcile_cluster(&old, &ctl.ctx).await;
    assert!(
        result.is_err(),
        "the stale reconcile's status write must be refused: {result:?}"
    );
    let now = get(&fleet, "etcd-a").await?;
    assert_eq!(
        now.status.unwrap().selector.as_deref(),
        Some("newer"),
        "a reconcile of a stale copy overwrote newer status ({result:?})"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_member_is_reported_and_never_removed() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let etcd = ClusterClient::connect(&endpoints, &config).await?;
    // Added by a person (or another tool): a learner at a peer URL that is
    // not this cluster's; it never starts.
    // etcd refuses member changes for a few seconds after a member starts
    // (strict reconfiguration check): retry like a person would.
    let started = Instant::now();
    let added = loop {
        match etcd
            .add_learner(&["https://10.255.0.9:2380".to_string()])
            .await
        {
            Ok(a) => break a,
            Err(e) if started.elapsed() < Duration::from_secs(40) => {
                eprintln!("member add refused, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    fleet.sync_all().await?;
    let outcomes = reconcile_for(&ctl, "etcd-a", fast_settings().member_failure_grace * 2).await;
    assert!(destructive(&outcomes).is_empty(), "{outcomes:?}");
    let last = outcomes.last().unwrap();
    match last {
        Ok(Outcome::Held(why)) => assert!(why.contains("by hand"), "{why}"),
        other => panic!("expected a hold naming the foreign member, got {other:?}"),
    }
    // Nothing changes by itself: kube-runtime is asked to look again after
    // 1, 2, 4, 8 s — not every poll interval — and Progressing says a
    // person is needed.
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let mut requeues = Vec::new();
    for _ in 0..4 {
        let live = std::sync::Arc::new(api.get("etcd-a").await?);
        requeues.push(etcdcluster::reconcile(live, ctl.ctx.clone()).await?);
    }
    let expected: Vec<Action> = [1, 2, 4, 8]
        .map(|s| Action::requeue(Duration::from_secs(s)))
        .to_vec();
    assert_eq!(requeues, expected);
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    let progressing = conditions::find(&status.conditions, "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "NeedsAttention"),
        "{progressing:?}"
    );
    let members = etcd.list_members().await?;
    assert!(members.iter().any(|m| m.id == added.id), "{members:?}");
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    assert!(
        status
            .members
            .iter()
            .any(|m| m.id.as_deref() == Some(&format!("{:x}", added.id))),
        "the foreign member is reported: {:#?}",
        status.members
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_unreachable_from_the_controller_but_healthy_in_etcd_is_never_replaced()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put(&fleet, "a", "etcd-a", 3, "before-the-partition").await?;
    // The network between the controller and member 2 is cut; the members
    // still talk to each other, and the kubelet's readiness probe (etcd's own
    // /health in the pod) keeps passing. A fresh controller: no open
    // connection to member 2 survives from before the cut.
    let dialer = fleet.dialer();
    dialer.block("etcd-a-etcd-2.");
    let ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        dialer.clone(),
        fast_settings(),
    );
    let grace = fast_settings().member_failure_grace;
    let outcomes = reconcile_for(
        &ctl,
        "etcd-a",
        grace * (etcdfleet_controllers::etcdcluster::plan::READY_POD_GRACE_FACTOR + 1),
    )
    .await;
    assert!(destructive(&outcomes).is_empty(), "{outcomes:?}");
    match outcomes.last() {
        Some(Ok(Outcome::Held(why))) => assert!(
            why.contains("etcd-a-etcd-2") && why.contains("health check in its pod passes"),
            "{why}"
        ),
        other => panic!("expected a hold naming the member, got {other:?}"),
    }
    let pod = Api::<Pod>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get("etcd-a-etcd-2")
        .await?;
    let ready = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "etcd's own health check passes in the pod");
    // (A member whose own health check fails too is replaced after the
    // grace: `a_wiped_member_is_replaced_without_losing_an_acknowledged_write`.)
    // The network comes back: nothing was replaced, the data is all there.
    dialer.unblock_all();
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-the-partition").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scale_down_is_refused_while_a_member_is_unhealthy() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    fleet
        .runtime("a")
        .kill_pod_process(WORKLOAD_NS, "etcd-a-etcd-0")
        .await?;
    set_replicas(&fleet, "etcd-a", 1).await?;
    // No sync: the member stays down.
    let outcomes = reconcile_for(&ctl, "etcd-a", Duration::from_secs(3)).await;
    assert!(destructive(&outcomes).is_empty(), "{outcomes:?}");
    assert!(
        outcomes.iter().any(
            |o| matches!(o, Ok(Outcome::Waiting(w)) if w.contains("scale-down to 1 members waits"))
        ),
        "{outcomes:?}"
    );
    // Once it is back, the scale-down goes ahead.
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    assert_eq!(get(&fleet, "etcd-a").await?.status.unwrap().replicas, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_cluster_writes_nothing_but_its_status() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let ctl = etcdfleet_tests::scenario::controller(&fleet);
    let mut paused = cluster("etcd-a", "a", 1, "3.5.1");
    paused.spec.paused = Some(true);
    paused
        .annotations_mut()
        .insert("etcdfleet.dev/rebase-template".into(), "true".into());
    create(&fleet, &paused).await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert!(matches!(outcome, Outcome::Paused(_)), "{outcome:?}");
    }
    let writes: Vec<ApiOp> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.verb != "patch_status")
        .collect();
    assert!(writes.is_empty(), "paused, yet wrote: {writes:#?}");
    let c = get(&fleet, "etcd-a").await?;
    assert!(c.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        c.spec.config.workload_namespace.is_none(),
        "materialized while paused"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nospace_from_live_data_backs_off_instead_of_defragmenting_every_five_seconds() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = etcdfleet_tests::scenario::controller(&fleet);
    let mut small = cluster("etcd-a", "a", 1, "3.5.1");
    let quota = 4 << 20;
    small.spec.config.etcd.as_mut().unwrap().quota_backend_bytes = Some(quota);
    create(&fleet, &small).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    // Distinct keys: the space is live data, which compaction cannot free.
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 1).await?;
    let fill = fill_with_live_data(&endpoints, &config, quota, 64 * 1024).await?;
    assert!(fill.in_use * 10 > quota * 9, "{fill:?} of {quota}");
    fleet.sync_all().await?;
    let outcomes = reconcile_for(&ctl, "etcd-a", Duration::from_secs(8)).await;
    let attempts = outcomes
        .iter()
        .filter(|o| match o {
            Ok(Outcome::Acted(Step::RecoverFromNoSpace)) => true,
            Err(e) => e.contains("NOSPACE persists"),
            _ => false,
        })
        .count();
    eprintln!(
        "{} reconciles in 8 s, {attempts} recovery attempts",
        outcomes.len()
    );
    assert!(outcomes.len() >= 10, "{outcomes:?}");
    // Two attempts (the second right after the first), then a 5 s wait.
    assert!(
        (1..=3).contains(&attempts),
        "{attempts} attempts: {outcomes:?}"
    );
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    let op = status.last_operation.context("no last operation")?;
    assert_eq!(op.outcome, "Failed");
    assert!(op.failures.unwrap_or(0) >= 2, "{op:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_pki_secret_is_refused_and_never_rekeyed() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    put(&fleet, "a", "etcd-a", 1, "before").await?;
    let secrets: Api<Secret> = Api::namespaced(fleet.management_direct(), NS);
    secrets
        .delete("etcd-a-etcd-pki", &DeleteParams::default())
        .await?;
    let workload_secrets: Api<Secret> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let server_before = workload_secrets.get("etcd-a-etcd-server-tls").await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let writes: Vec<ApiOp> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.verb != "patch_status")
        .collect();
    assert!(writes.is_empty(), "re-keyed: {writes:#?}");
    assert!(secrets.get_opt("etcd-a-etcd-pki").await?.is_none());
    let server_after = workload_secrets.get("etcd-a-etcd-server-tls").await?;
    assert_eq!(server_before.data, server_after.data);
    let (status, reason, message) =
        conflict_of(&get(&fleet, "etcd-a").await?).context("no Conflict condition")?;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PkiLost"));
    assert!(message.contains("etcd-a-etcd-pki"), "{message}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_is_reported_with_recovery_steps_and_nothing_destructive() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    for o in 0..2 {
        fleet
            .runtime("a")
            .kill_pod_process(WORKLOAD_NS, &format!("etcd-a-etcd-{o}"))
            .await?;
    }
    // The kubelet sees the processes gone: their pods are not Ready (this one
    // sync only schedules their restarts, and no other sync runs). Quorum
    // loss is what the members' own health says, not only the controller.
    fleet.sync_all().await?;
    // Well past the failure grace, with the members kept down.
    let outcomes = reconcile_for(&ctl, "etcd-a", fast_settings().member_failure_grace * 2).await;
    assert!(destructive(&outcomes).is_empty(), "{outcomes:?}");
    assert!(
        !outcomes.iter().any(|o| matches!(o, Ok(Outcome::Acted(_)))),
        "acted without quorum: {outcomes:?}"
    );
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    let available = conditions::find(&status.conditions, AVAILABLE).unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("False", "QuorumLost"),
        "{available:?}"
    );
    assert!(
        available.message.contains("snapshot") && available.message.contains("restore"),
        "{}",
        available.message
    );
    Ok(())
}

/// Whether the pod's Ready condition is True.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_unreachable_from_every_member_of_a_ready_cluster_never_reports_quorum_lost_and_takes_no_step()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put(&fleet, "a", "etcd-a", 3, "before-the-cut").await?;
    // The path between the controller and every member is cut (a broken
    // port-forward, a workload API server restarting); etcd itself is
    // healthy and every pod passes etcd's own health check. A fresh
    // controller: no connection opened before the cut survives.
    let dialer = fleet.dialer();
    dialer.block("etcd-a-etcd-");
    let ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        dialer.clone(),
        fast_settings(),
    );
    fleet.clear_ops();
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let until = Instant::now() + fast_settings().member_failure_grace * 2;
    let mut outcomes = Vec::new();
    while Instant::now() < until {
        // The kubelet keeps probing: every pod stays Ready by etcd's /health.
        fleet.sync_all().await?;
        outcomes.push(ctl.reconcile(NS, "etcd-a").await.map_err(|e| e.to_string()));
        let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
        let available =
            conditions::find(&status.conditions, AVAILABLE).context("no Available condition")?;
        assert_ne!(available.reason, "QuorumLost", "{available:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for o in 0..3 {
        let pod = pods.get(&format!("etcd-a-etcd-{o}")).await?;
        assert!(
            is_ready(&pod),
            "etcd-a-etcd-{o} is not Ready: {:?}",
            pod.status
        );
    }
    assert!(
        !outcomes.iter().any(|o| matches!(o, Ok(Outcome::Acted(_)))),
        "acted while cut off: {outcomes:?}"
    );
    assert!(
        workload_writes(&fleet).is_empty(),
        "wrote while cut off: {:#?}",
        workload_writes(&fleet)
    );
    match outcomes.last() {
        Some(Ok(Outcome::Held(why))) => assert!(
            why.contains("network")
                && !why.contains("quorum lost")
                && !why.contains("restore")
                && !why.contains("snapshot"),
            "{why}"
        ),
        other => panic!("expected a hold naming the network, got {other:?}"),
    }
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    let available = conditions::find(&status.conditions, AVAILABLE).context("no Available")?;
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("Unknown", "MembersUnreachableFromController"),
        "{available:?}"
    );
    assert!(
        available.message.contains("3 of 3")
            && !available.message.contains("restore")
            && !available.message.contains("snapshot"),
        "{}",
        available.message
    );
    // The path comes back: nothing was touched, the data is all there.
    dialer.unblock_all();
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    let available = conditions::find(&status.conditions, AVAILABLE).context("no Available")?;
    assert_eq!(available.status, "True", "{available:?}");
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-the-cut").await?;
    Ok(())
}

/// Name → (UID, restart count) of every member pod of workload `a`.
async fn member_pods(fleet: &Fleet) -> Result<std::collections::BTreeMap<String, (String, i32)>> {
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    Ok(pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_etcdcluster_converges_without_a_restart_of_any_member() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put(&fleet, "a", "etcd-a", 3, "before-the-move").await?;
    let before = member_pods(&fleet).await?;
    assert_eq!(before.len(), 3, "{before:?}");

    // A management-plane operation: the EtcdCluster goes without its
    // finalizer running (its PKI Secret with it, by garbage collection),
    // then the same manifest and the same PKI are applied again, as a
    // management-cluster restore does. The new object has a new UID.
    let secrets: Api<Secret> = Api::namespaced(fleet.management_direct(), NS);
    let pki = secrets.get("etcd-a-etcd-pki").await?;
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let old_uid = api.get("etcd-a").await?.uid();
    api.patch(
        "etcd-a",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "metadata": { "finalizers": [] } })),
    )
    .await?;
    api.delete("etcd-a", &DeleteParams::default()).await?;
    assert!(api.get_opt("etcd-a").await?.is_none(), "etcd-a still there");
    if secrets.get_opt("etcd-a-etcd-pki").await?.is_none() {
        let mut restored = Secret {
            data: pki.data.clone(),
            type_: pki.type_.clone(),
            ..Default::default()
        };
        restored.metadata.name = Some("etcd-a-etcd-pki".into());
        restored.metadata.namespace = Some(NS.into());
        restored.metadata.labels = pki.metadata.labels.clone();
        secrets.create(&PostParams::default(), &restored).await?;
    }
    create(&fleet, &cluster("etcd-a", "a", 3, "3.5.1")).await?;
    assert_ne!(api.get("etcd-a").await?.uid(), old_uid, "a new object");

    fleet.clear_ops();
    let log = converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let steps = log.steps_of(&format!("{NS}/etcd-a"));
    assert!(
        !steps
            .iter()
            .any(|s| s.is_destructive() || matches!(s, Step::WriteObjects(k) if k.contains(&etcdcluster::plan::ObjectKind::StatefulSet))),
        "the re-created cluster rolled or rewrote its members: {steps:?}"
    );
    let statefulset_writes: Vec<ApiOp> = workload_writes(&fleet)
        .into_iter()
        .filter(|o| o.resource == "statefulsets" || o.resource == "pods")
        .collect();
    assert!(statefulset_writes.is_empty(), "{statefulset_writes:#?}");
    assert_eq!(member_pods(&fleet).await?, before, "a member was restarted");
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert!(
        conditions::is_true(&status.conditions, AVAILABLE),
        "{status:?}"
    );
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-the-move").await?;
    Ok(())
}

/// The production read memo (a converged cluster's static objects are not
/// read again for `reread_after`) never carries a write: a members
/// ConfigMap another owner relabelled while the cluster sat converged is
/// refused at the next step, not force-applied back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_memo_path_a_members_configmap_taken_by_another_owner_is_never_written() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let production = etcdcluster::ReconcilerSettings {
        reread_after: etcdcluster::ReconcilerSettings::default().reread_after,
        ..fast_settings()
    };
    assert!(!production.reread_after.is_zero());
    let mut ctl = etcdfleet_tests::scenario::controller_with(&fleet, production);
    create(&fleet, &cluster("etcd", "a", 1, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd"]).await?;
    // Converged once more: the memo holds the cluster, and a poll reads
    // neither the ConfigMap nor the other static objects.
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    assert_eq!(ctl.ctx.memo.len(), 1, "the converged cluster is remembered");
    fleet.clear_ops();
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    let configmap_reads = fleet
        .ops()
        .into_iter()
        .filter(|o| o.cluster == "a" && o.resource == "configmaps")
        .count();
    assert_eq!(configmap_reads, 0, "the poll trusted the memo");

    // Another field manager takes the members ConfigMap.
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    configmaps
        .patch(
            "etcd-etcd-members",
            &PatchParams {
                field_manager: Some("someone-else".into()),
                ..Default::default()
            },
            &Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"etcdfleet.dev/owner": "team-b.other"}}
            })),
        )
        .await?;
    let taken = configmaps.get("etcd-etcd-members").await?;
    set_replicas(&fleet, "etcd", 3).await?;
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        let outcome = ctl.reconcile(NS, "etcd").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let writes = workload_writes(&fleet);
    assert!(writes.is_empty(), "wrote into the workload: {writes:#?}");
    let (status, reason, message) =
        conflict_of(&get(&fleet, "etcd").await?).context("no Conflict condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ObjectOwnedElsewhere")
    );
    assert!(
        message.contains("ConfigMap/etcd-system/etcd-etcd-members (owned by team-b.other)"),
        "{message}"
    );
    let after = configmaps.get("etcd-etcd-members").await?;
    assert_eq!(
        taken.metadata.resource_version, after.metadata.resource_version,
        "the ConfigMap is as the other owner left it"
    );
    let members = etcd_member_count(&fleet, "etcd").await?;
    assert_eq!(members, 1, "no learner was added");
    Ok(())
}

/// Members etcd lists for `name` (1 member, reached through member 0).
async fn etcd_member_count(fleet: &Fleet, name: &str) -> Result<usize> {
    let (endpoints, config) = etcd_of(fleet, "a", name, 1).await?;
    let client = ClusterClient::connect(&endpoints, &config).await?;
    Ok(client.list_members().await?.len())
}

/// A step that removes a member or deletes its volume.
fn removes_or_deletes(step: &Step) -> bool {
    matches!(
        step,
        Step::RemoveMember { .. }
            | Step::RetireMember { .. }
            | Step::DeletePvc { .. }
            | Step::DeleteStaleStorage { .. }
    )
}

/// A binary that exits at once, as a broken release of etcd would.
fn crashing_etcd(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("etcd");
    std::fs::write(
        &path,
        "#!/bin/sh\necho 'panic: this etcd build cannot start' >&2\nexit 2\n",
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// The member ids and PVC UIDs of `name`'s three members, by pod.
async fn members_and_volumes(
    fleet: &Fleet,
    name: &str,
) -> Result<std::collections::BTreeMap<String, (Option<String>, Option<String>)>> {
    let status = get(fleet, name).await?.status.context("status")?;
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let mut out = std::collections::BTreeMap::new();
    for m in &status.members {
        let pvc = pvcs.get(&format!("data-{}", m.name)).await?;
        out.insert(m.name.clone(), (m.id.clone(), pvc.metadata.uid));
    }
    Ok(out)
}

/// A member that cannot start on the version it was upgraded to is not
/// rebuilt: no removal, no volume deleted, no other member restarted, a
/// condition naming the member, the version and how it exited. Setting
/// the version back brings it back on its own data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_cannot_start_on_a_new_version_keeps_its_volume_and_voter_count() -> Result<()>
{
    let Some(good) = require_etcd(EtcdVersion::V3_5Latest) else {
        return Ok(());
    };
    let bin = tempfile::tempdir()?;
    let broken = "3.5.99";
    let images = etcdfleet_tests::runtime::ImageTable::installed()
        .with_tag(&format!("v{broken}"), crashing_etcd(bin.path())?);
    let fleet = Fleet::with_images(
        etcdfleet_tests::apiserver::ApiServer::management().await?,
        NS,
        &["a"],
        images,
    )
    .await?;
    let mut ctl = etcdfleet_tests::scenario::controller(&fleet);
    create(&fleet, &cluster("etcd", "a", 3, &good.release)).await?;
    converge_all(&fleet, &mut ctl, &["etcd"]).await?;
    put(&fleet, "a", "etcd", 3, "before").await?;
    let before = members_and_volumes(&fleet, "etcd").await?;
    assert_eq!(before.len(), 3);

    patch_spec(&fleet, "etcd", serde_json::json!({ "version": broken })).await?;
    // Several failure graces (4 s in the test settings) of reconciles.
    let mut steps = Vec::new();
    let until = Instant::now() + Duration::from_secs(25);
    while Instant::now() < until {
        fleet.sync_all().await?;
        if let Outcome::Acted(step) = ctl.reconcile(NS, "etcd").await? {
            steps.push(step);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let destructive: Vec<&Step> = steps.iter().filter(|s| removes_or_deletes(s)).collect();
    let restarts: Vec<&Step> = (steps.iter())
        .filter(|s| matches!(s, Step::RestartMember { .. }))
        .collect();
    assert!(
        destructive.is_empty(),
        "destroyed: {destructive:?} in {steps:?}"
    );
    assert_eq!(restarts.len(), 1, "one member tried the version: {steps:?}");
    assert_eq!(members_and_volumes(&fleet, "etcd").await?, before);
    let cluster = get(&fleet, "etcd").await?;
    let status = cluster.status.as_ref().context("status")?;
    assert_eq!(status.replicas, 3, "three voters");
    assert_eq!(status.ready_members, 2);
    let held =
        conditions::find(&status.conditions, conditions::PROGRESSING).context("Progressing")?;
    let Step::RestartMember { ordinal, .. } = restarts[0] else {
        unreachable!()
    };
    let pod = format!("etcd-etcd-{ordinal}");
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "NeedsAttention"),
        "{held:?}"
    );
    for words in [
        format!("member {pod} cannot start on etcd {broken}"),
        "exited with code 2 (Error)".to_string(),
        format!("Set spec.version back to {}", good.release),
    ] {
        assert!(held.message.contains(&words), "{words}: {}", held.message);
    }

    // Back to the version its data ran: the member returns on its own data.
    patch_spec(
        &fleet,
        "etcd",
        serde_json::json!({ "version": good.release }),
    )
    .await?;
    let log = converge_all(&fleet, &mut ctl, &["etcd"]).await?;
    assert!(
        !log.steps.iter().any(|(_, s)| removes_or_deletes(s)),
        "{:?}",
        log.steps
    );
    assert_eq!(members_and_volumes(&fleet, "etcd").await?, before);
    assert_eq!(
        get(&fleet, "etcd")
            .await?
            .status
            .context("status")?
            .ready_members,
        3
    );
    read_everywhere(&fleet, "a", "etcd", 3, "before").await?;
    Ok(())
}

/// etcd 3.5.1 that exits at start while `flag` exists and it runs as
/// `pod`, as a member whose node has a broken condition would (the version
/// is the one its data ran); any other pod, or with the flag gone, runs the
/// real etcd.
fn etcd_failing_while(
    dir: &std::path::Path,
    flag: &std::path::Path,
    pod: &str,
) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let real = require_etcd(EtcdVersion::V3_5).context("etcd 3.5.1")?.etcd;
    let path = dir.join("etcd");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$POD_NAME\" = \"{pod}\" ] && [ -e {flag} ]; then\n  \
             echo 'panic: this node cannot run etcd' >&2\n  exit 2\nfi\nexec {real} \"$@\"\n",
            flag = flag.display(),
            real = real.display()
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// A member that crash-loops for a cause outside its data (its node), on
/// the version its data ran, is replaced, but a replacement that did not
/// cure it is not made again without a back-off, and never more than the
/// bound (`etcdfleet_api::replacement`): then the cluster holds naming the
/// member, its last exit and the replacements made. Once the cause is
/// gone, the member comes back and the cluster converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_whose_replacement_cures_nothing_is_not_replaced_again_past_the_bound()
-> Result<()> {
    use etcdfleet_api::replacement::{MAX_REPLACEMENTS, back_off};
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let bin = tempfile::tempdir()?;
    let flag = bin.path().join("node-broken");
    let pod = "etcd-etcd-1";
    let images = etcdfleet_tests::runtime::ImageTable::installed().with_image(
        "gcr.io/etcd-development/etcd:v3.5.1",
        etcd_failing_while(bin.path(), &flag, pod)?,
    );
    let fleet = Fleet::with_images(
        etcdfleet_tests::apiserver::ApiServer::management().await?,
        NS,
        &["a"],
        images,
    )
    .await?;
    // A 2 s grace: replacements may come 2, 4 then 8 s apart.
    let grace = Duration::from_secs(2);
    let settings = etcdcluster::ReconcilerSettings {
        member_failure_grace: grace,
        ..fast_settings()
    };
    let mut ctl = etcdfleet_tests::scenario::controller_with(&fleet, settings);
    create(&fleet, &cluster("etcd", "a", 3, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd"]).await?;
    put(&fleet, "a", "etcd", 3, "before").await?;

    std::fs::write(&flag, "")?;
    fleet
        .runtime("a")
        .kill_pod_process(WORKLOAD_NS, pod)
        .await?;
    let mut removals = Vec::new();
    let until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < until {
        fleet.sync_all().await?;
        let started = Instant::now();
        if let Outcome::Acted(step @ Step::RemoveMember { .. }) = ctl.reconcile(NS, "etcd").await? {
            removals.push(((started, Instant::now()), step));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_member_1 = (removals.iter()).all(|(_, s)| {
        matches!(
            s,
            Step::RemoveMember {
                ordinal: Some(1),
                ..
            }
        )
    });
    assert!(all_member_1, "{removals:?}");
    assert_eq!(removals.len(), MAX_REPLACEMENTS as usize, "{removals:?}");
    // Each one waited its back-off after the one before, twice the one
    // before it: 4 s, then 8 s. A gap also holds the time the member took
    // to rejoin and fail again (about 5 s here unloaded, more under load),
    // so the gaps themselves need not grow: the back-offs do. A gap runs
    // from the start of the reconcile that made one replacement (its time
    // is recorded in it) to the end of the one that made the next (judged
    // in it): the back-off lies within.
    let gaps: Vec<Duration> = (removals.windows(2))
        .map(|w| (w[1].0).1 - (w[0].0).0)
        .collect();
    eprintln!("replacements of {pod}: {removals:?}, gaps {gaps:?}");
    let back_offs: Vec<Duration> = (1..MAX_REPLACEMENTS)
        .map(|made| back_off(made, grace))
        .collect();
    assert_eq!(
        back_offs,
        [Duration::from_secs(4), Duration::from_secs(8)],
        "the back-off doubles"
    );
    for (gap, wait) in gaps.iter().zip(&back_offs) {
        assert!(gap >= wait, "gaps {gaps:?}, back-offs {back_offs:?}");
    }
    let status = get(&fleet, "etcd").await?.status.context("status")?;
    let held =
        conditions::find(&status.conditions, conditions::PROGRESSING).context("Progressing")?;
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "NeedsAttention")
    );
    for words in [
        format!("member {pod} failed again after {MAX_REPLACEMENTS} replacements"),
        "exited with code 2".to_string(),
        "not replaced again".to_string(),
    ] {
        assert!(held.message.contains(&words), "{words}: {}", held.message);
    }
    let record = (status.replacements.iter()).find(|r| r.member == pod);
    assert_eq!(
        record.map(|r| r.count),
        Some(MAX_REPLACEMENTS as i32),
        "{:?}",
        status.replacements
    );

    // The node is fixed: the member comes back as its pod starts.
    std::fs::remove_file(&flag)?;
    converge_all(&fleet, &mut ctl, &["etcd"]).await?;
    let status = get(&fleet, "etcd").await?.status.context("status")?;
    assert_eq!((status.replicas, status.ready_members), (3, 3));
    read_everywhere(&fleet, "a", "etcd", 3, "before").await?;
    Ok(())
}

/// A member's failure grace is judged from the live EtcdCluster, never
/// from a copy the watch delivered late: a copy that still says a member
/// has been unhealthy for ten minutes, when the live status says it went
/// down a moment ago, removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_copy_never_removes_a_member_before_its_failure_grace_on_the_live_object()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let settings = etcdcluster::ReconcilerSettings {
        member_failure_grace: Duration::from_secs(120),
        ..fast_settings()
    };
    let mut ctl = etcdfleet_tests::scenario::controller_with(&fleet, settings);
    create(&fleet, &cluster("etcd-a", "a", 3, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let healthy_copy = get(&fleet, "etcd-a").await?;
    let ids = |c: &EtcdCluster| -> Vec<Option<String>> {
        c.status
            .iter()
            .flat_map(|s| &s.members)
            .map(|m| m.id.clone())
            .collect()
    };
    let members_before = ids(&healthy_copy);
    assert!(
        healthy_copy
            .status
            .iter()
            .flat_map(|s| &s.members)
            .any(|m| m.name == "etcd-a-etcd-1" && !m.leader),
        "etcd-a-etcd-1 is a follower"
    );
    fleet
        .runtime("a")
        .wipe_pvc(WORKLOAD_NS, "data-etcd-a-etcd-1")
        .await?;
    // The live status records the member unhealthy since now.
    let deadline = Instant::now() + Duration::from_secs(30);
    let live = loop {
        fleet.sync_all().await?;
        ctl.reconcile(NS, "etcd-a").await?;
        let live = get(&fleet, "etcd-a").await?;
        let since = (live.status.iter().flat_map(|s| &s.members))
            .find(|m| m.name == "etcd-a-etcd-1")
            .and_then(|m| m.unhealthy_since.clone());
        if since.is_some() {
            break live;
        }
        assert!(
            Instant::now() < deadline,
            "the member never turned unhealthy"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A copy from before: the member unhealthy for ten minutes (it had
    // recovered since, and failed again a moment ago), its resourceVersion
    // older than the live object's.
    let mut stale = live.clone();
    stale.metadata.resource_version = healthy_copy.metadata.resource_version.clone();
    let long_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(600);
    for m in stale.status.iter_mut().flat_map(|s| s.members.iter_mut()) {
        if m.name == "etcd-a-etcd-1" {
            m.unhealthy_since = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                long_ago,
            ));
        }
    }
    let result = etcdcluster::reconcile_cluster(&stale, &ctl.ctx).await;
    assert!(
        !matches!(result, Ok(Outcome::Acted(Step::RemoveMember { .. }))),
        "removed on a stale copy: {result:?}"
    );
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let client = ClusterClient::connect(&endpoints[..1], &config).await?;
    assert_eq!(client.list_members().await?.len(), 3, "{result:?}");
    assert_eq!(ids(&get(&fleet, "etcd-a").await?), members_before);
    Ok(())
}

/// The bootstrap writes the StatefulSet because none was observed. One that
/// another writer makes between that read and the write is never taken
/// over: the write is a server-side apply that is not forced, so it
/// conflicts, and the next reconcile refuses the object owned elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statefulset_made_by_another_writer_after_the_read_is_never_taken_over_by_the_bootstrap()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let api: Api<StatefulSet> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let theirs: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "etcd-etcd",
            "namespace": WORKLOAD_NS,
            "labels": {"etcdfleet.dev/owner": "team-b.other"},
        },
        "spec": {
            "serviceName": "other",
            "selector": {"matchLabels": {"app": "other"}},
            "template": {
                "metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "app", "image": "other:1"}]},
            },
        },
    }))?;
    let other = api.clone();
    fleet.workload_api("a").before_first_write(
        etcdfleet_tests::fleet::WORKLOAD_USER,
        "statefulsets",
        Box::pin(async move {
            let params = PostParams {
                field_manager: Some("someone-else".into()),
                ..Default::default()
            };
            other
                .create(&params, &theirs)
                .await
                .expect("the other writer's create");
        }),
    );
    create(&fleet, &cluster("etcd", "a", 1, "3.5.1")).await?;
    let ctl = etcdfleet_tests::scenario::controller(&fleet);
    let mut errors = Vec::new();
    let blocked = loop {
        ensure!(errors.len() < 5, "errors: {errors:?}");
        fleet.sync_all().await?;
        match ctl.reconcile(NS, "etcd").await {
            Ok(Outcome::Blocked(why)) => break why,
            Ok(Outcome::Acted(Step::Bootstrap { .. })) => bail!("the bootstrap took it over"),
            Ok(Outcome::Acted(_) | Outcome::Waiting(_)) => {}
            Ok(other) => bail!("unexpected {other:?}"),
            Err(e) => errors.push(e.to_string()),
        }
    };
    ensure!(
        errors.len() == 1 && errors[0].to_lowercase().contains("conflict"),
        "the bootstrap's write should conflict once: {errors:?}"
    );
    let after = api.get("etcd-etcd").await?;
    ensure!(
        after
            .labels()
            .get("etcdfleet.dev/owner")
            .map(String::as_str)
            == Some("team-b.other")
            && after.spec.service_name.as_deref() == Some("other"),
        "the StatefulSet is not as the other writer made it: {after:?}"
    );
    let (status, reason, message) =
        conflict_of(&get(&fleet, "etcd").await?).context("no Conflict condition")?;
    ensure!(
        (status.as_str(), reason.as_str()) == ("True", "ObjectOwnedElsewhere")
            && message.contains("StatefulSet/etcd-system/etcd-etcd (owned by team-b.other)"),
        "{status} {reason} {message} ({blocked})"
    );
    Ok(())
}
