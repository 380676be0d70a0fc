//! End to end on real etcd: one controller, a fake management API, fake
//! workload APIs whose StatefulSets a runtime turns into real etcd processes.
//! Issue: the EtcdCluster controller (create, scale, heal, report, delete).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::conditions::{self, REMOTE_REACHABLE};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::ReconcilerSettings;
use etcdfleet_controllers::etcdcluster::plan::{RemovalCause, Step};
use etcdfleet_tests::driver::{TestController, converge, fast_settings, no_hook};
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::fleet::{Fleet, KubeconfigFault};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller, converge_all, create, etcd_of, get, put, read_everywhere,
    running, set_replicas,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};

/// Cluster names of (namespace, name) pairs.
fn names<'a>(keys: &[(&str, &'a str)]) -> Vec<&'a str> {
    keys.iter().map(|(_, n)| *n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workload_clusters_are_created_scaled_and_keep_their_data() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a", "b", "c"]).await?;
    let mut ctl = controller(&fleet);
    for w in ["a", "b", "c"] {
        create(&fleet, &cluster(&format!("etcd-{w}"), w, 3, "3.5.1")).await?;
    }
    let all = [(NS, "etcd-a"), (NS, "etcd-b"), (NS, "etcd-c")];
    let log = converge_all(&fleet, &mut ctl, &names(&all)).await?;
    for (w, name) in [("a", "etcd-a"), ("b", "etcd-b"), ("c", "etcd-c")] {
        let c = get(&fleet, name).await?;
        let status = c.status.as_ref().context("status")?;
        assert_eq!(status.ready_members, 3, "{name}: {status:#?}");
        assert_eq!(status.current_version.as_deref(), Some("3.5.1"));
        assert!(conditions::is_true(
            &status.conditions,
            conditions::AVAILABLE
        ));
        assert!(conditions::is_true(&status.conditions, REMOTE_REACHABLE));
        assert_eq!(status.observed_generation, c.metadata.generation);
        assert_eq!(status.members.iter().filter(|m| m.leader).count(), 1);
        // learners first: every added member went AddLearner → promote
        let steps = log.steps_of(&format!("{NS}/{name}"));
        assert_eq!(
            steps
                .iter()
                .filter(|s| matches!(s, Step::AddLearner { .. }))
                .count(),
            2
        );
        assert_eq!(
            steps
                .iter()
                .filter(|s| matches!(s, Step::PromoteLearner { .. }))
                .count(),
            2
        );
        put(&fleet, w, name, 3, "before-scale").await?;
    }

    // 3 → 5 on one cluster; the others stay untouched.
    set_replicas(&fleet, "etcd-a", 5).await?;
    let log = converge_all(&fleet, &mut ctl, &names(&all)).await?;
    assert!(log.steps_of(&format!("{NS}/etcd-b")).is_empty());
    assert!(log.steps_of(&format!("{NS}/etcd-c")).is_empty());
    read_everywhere(&fleet, "a", "etcd-a", 5, "before-scale").await?;
    put(&fleet, "a", "etcd-a", 5, "before-scale-down").await?;
    assert_eq!(
        get(&fleet, "etcd-a").await?.status.unwrap().ready_members,
        5
    );

    // 5 → 3: leader moved away if needed, members removed, StatefulSet shrunk, PVCs deleted.
    set_replicas(&fleet, "etcd-a", 3).await?;
    let log = converge_all(&fleet, &mut ctl, &names(&all)).await?;
    let steps = log.steps_of(&format!("{NS}/etcd-a"));
    let removed: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            Step::RemoveMember {
                ordinal,
                cause: RemovalCause::ScaleDown,
                ..
            } => *ordinal,
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![4, 3], "highest first: {steps:?}");
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-scale").await?;
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-scale-down").await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let left: BTreeSet<String> = pvcs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([
            "data-etcd-a-etcd-0".into(),
            "data-etcd-a-etcd-1".into(),
            "data-etcd-a-etcd-2".into()
        ])
    );
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    assert_eq!((status.replicas, status.ready_members), (3, 3));

    // Never lists or watches Secrets, anywhere, during all of it.
    assert!(
        fleet.secret_lists_or_watches().is_empty(),
        "{:?}",
        fleet.secret_lists_or_watches()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_converged_cluster_costs_no_write_and_few_reads() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    fleet.sync_all().await?;
    // The production setting: static objects trusted for 10 minutes once
    // seen converged (the test default re-reads everything).
    let ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        ReconcilerSettings {
            reread_after: Duration::from_secs(600),
            ..fast_settings()
        },
    );
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    for poll in 0..3 {
        fleet.clear_ops();
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert_eq!(outcome, Outcome::Converged, "{}", fleet.ops_report());
        let writes = fleet.writes();
        assert!(
            writes.is_empty(),
            "a converged reconcile wrote: {writes:#?}"
        );
        // The driver GETs the EtcdCluster itself (in production the watch
        // delivers it); every other call is the reconciler's. Budget: the
        // StatefulSet, the pod list and the PVC list of the workload cluster.
        let reads: Vec<_> = fleet
            .ops()
            .into_iter()
            .filter(|o| {
                !(o.cluster == "management" && o.resource == "etcdclusters" && o.verb == "get")
            })
            .collect();
        eprintln!("converged poll {poll}: {} reads: {reads:#?}", reads.len());
        assert!(reads.len() <= 3, "{reads:#?}");
        assert!(
            reads.iter().all(|o| o.cluster == "a"),
            "no management read: {reads:#?}"
        );
    }
    assert!(fleet.secret_lists_or_watches().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_converged_cluster_taking_writes_makes_no_status_write() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    let sizes = |c: &EtcdCluster| -> Vec<Option<i64>> {
        c.status
            .as_ref()
            .map(|s| s.members.iter().map(|m| m.db_size_in_use_bytes).collect())
            .unwrap_or_default()
    };
    let shown = sizes(&get(&fleet, "etcd-a").await?);
    fleet.clear_ops();
    // The database grows between polls (the application keeps writing);
    // nothing a person acts on changes, so status is not rewritten.
    for poll in 0..4 {
        for i in 0..20 {
            kv.put(format!("app/{poll}/{i}"), vec![b'x'; 2048], None)
                .await?;
        }
        assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    }
    let status_writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.resource == "etcdclusters")
        .collect();
    assert!(status_writes.is_empty(), "{status_writes:#?}");
    assert_eq!(sizes(&get(&fleet, "etcd-a").await?), shown);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_member_is_replaced_without_losing_an_acknowledged_write() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = get(&fleet, "etcd-a").await?.status.unwrap();
    let old_id = before
        .members
        .iter()
        .find(|m| m.name == "etcd-a-etcd-1")
        .and_then(|m| m.id.clone());
    // A follower (the cluster grew from member 0 through learners): the
    // leader still counts the raft log the wipe removed, so the member cannot
    // rejoin by itself and must be replaced.
    assert!(
        before
            .members
            .iter()
            .any(|m| m.name == "etcd-a-etcd-1" && !m.leader),
        "etcd-a-etcd-1 is a follower: {before:#?}"
    );
    fleet
        .runtime("a")
        .wipe_pvc(WORKLOAD_NS, "data-etcd-a-etcd-1")
        .await?;

    // Converge, checking between reconciles that a quorum stayed healthy.
    let min_ready = Arc::new(AtomicI32::new(3));
    let log = converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(120),
        || {
            let min_ready = min_ready.clone();
            let fleet = &fleet;
            async move {
                fleet.sync_all().await?;
                if let Some(s) = get(fleet, "etcd-a").await?.status {
                    min_ready.fetch_min(s.ready_members, Ordering::SeqCst);
                }
                Ok(())
            }
        },
        no_hook,
    )
    .await
    .map_err(|e| {
        e.context(
            fleet
                .runtime("a")
                .pod_log_tail(WORKLOAD_NS, "etcd-a-etcd-1", 60),
        )
    })?;
    let removals: Vec<RemovalCause> = log
        .steps
        .iter()
        .filter_map(|(_, step)| match step {
            Step::RemoveMember { cause, .. } => Some(*cause),
            _ => None,
        })
        .collect();
    assert!(
        removals.iter().all(|cause| *cause == RemovalCause::Failed),
        "only the failed member is removed: {removals:?}"
    );
    let after = get(&fleet, "etcd-a").await?.status.unwrap();
    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    eprintln!(
        "acknowledged writes verified: {checked}, failed writes: {}, steps: {:?}",
        report.failed, log.steps
    );
    assert!(checked > 0);
    assert_eq!(after.ready_members, 3, "{after:#?}");
    assert!(
        min_ready.load(Ordering::SeqCst) >= 2,
        "a quorum of 2 stayed healthy throughout"
    );
    // Deletes carry UID and resourceVersion preconditions (the test API
    // server enforces them; the recorded request bodies prove they are sent);
    // the removed member's pod is deleted by UID alone: it crash-loops, and
    // each status update would fail a resourceVersion precondition.
    let deletes: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|o| o.cluster == "a" && o.verb == "delete")
        .collect();
    assert!(!deletes.is_empty(), "the stale pod and PVC were deleted");
    for d in &deletes {
        let pre = d.body.as_ref().and_then(|b| b.get("preconditions"));
        let by_version = d.resource != "pods";
        assert!(
            pre.and_then(|p| p["uid"].as_str()).is_some()
                && pre.and_then(|p| p["resourceVersion"].as_str()).is_some() == by_version,
            "delete without its preconditions: {d}"
        );
    }
    // Every step was reported as an Event on the EtcdCluster.
    let events = fleet
        .ops()
        .into_iter()
        .filter(|o| o.cluster == "management" && o.resource == "events" && o.verb == "create")
        .count();
    assert!(
        events >= log.steps.len(),
        "{events} events for {} steps",
        log.steps.len()
    );
    let new_id = after
        .members
        .iter()
        .find(|m| m.name == "etcd-a-etcd-1")
        .and_then(|m| m.id.clone());
    let replaced = log.steps.iter().any(|(_, s)| {
        matches!(
            s,
            Step::RemoveMember {
                cause: RemovalCause::Failed,
                ..
            }
        )
    });
    assert!(replaced, "the wiped member was replaced: {:?}", log.steps);
    assert_ne!(old_id, new_id, "a replaced member has a new id");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_workload_cluster_is_reported_while_the_others_converge() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(
        &["a", "b", "c"],
        &[
            cluster("etcd-a", "a", 1, "3.5.1"),
            cluster("etcd-b", "b", 1, "3.5.1"),
            cluster("etcd-c", "c", 1, "3.5.1"),
        ],
    )
    .await?;
    let all = [(NS, "etcd-a"), (NS, "etcd-b"), (NS, "etcd-c")];

    // b's API fails; a and c are scaled and converge; b is left alone.
    fleet.set_unreachable("b", true);
    for name in ["etcd-a", "etcd-b", "etcd-c"] {
        set_replicas(&fleet, name, 3).await?;
    }
    fleet.clear_ops();
    let log = converge_all(&fleet, &mut ctl, &names(&all)).await?;
    assert!(log.steps_of(&format!("{NS}/etcd-b")).is_empty());
    assert!(!log.steps_of(&format!("{NS}/etcd-a")).is_empty());
    assert!(matches!(
        etcdfleet_tests::driver::outcome_of(&log, &format!("{NS}/etcd-b"))?,
        Outcome::Blocked(_)
    ));
    let b = get(&fleet, "etcd-b").await?.status.unwrap();
    let reachable = conditions::find(&b.conditions, REMOTE_REACHABLE).unwrap();
    assert_eq!(reachable.status, "False");
    assert_eq!(reachable.reason, "WorkloadAPIUnreachable", "{reachable:?}");
    assert!(
        reachable.message.contains(&fleet.server_url("b")),
        "{reachable:?}"
    );
    assert!(
        fleet.writes().iter().all(|o| o.cluster != "b"),
        "no write reached b: {:?}",
        fleet.writes()
    );
    for name in ["etcd-a", "etcd-c"] {
        assert_eq!(get(&fleet, name).await?.status.unwrap().ready_members, 3);
    }
    fleet.set_unreachable("b", false);
    converge_all(&fleet, &mut ctl, &names(&all)).await?;
    assert_eq!(
        get(&fleet, "etcd-b").await?.status.unwrap().ready_members,
        3
    );

    // Broken kubeconfigs: each a specific reason, no action.
    for (broken, reason) in [
        (KubeconfigFault::Garbage, "KubeconfigInvalid"),
        (KubeconfigFault::ExecPlugin, "KubeconfigNotAllowed"),
        (KubeconfigFault::Missing, "KubeconfigSecretNotFound"),
    ] {
        fleet.break_kubeconfig("b", broken).await?;
        set_replicas(&fleet, "etcd-b", 1).await?;
        fleet.clear_ops();
        let outcome = ctl.reconcile(NS, "etcd-b").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
        let status = get(&fleet, "etcd-b").await?.status.unwrap();
        let c = conditions::find(&status.conditions, REMOTE_REACHABLE).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason),
            "{c:?}"
        );
        assert!(
            !c.message.contains("token"),
            "no secret content in messages: {c:?}"
        );
        assert!(
            fleet.ops().iter().all(|o| o.cluster != "b"),
            "nothing sent to b"
        );
        assert_eq!(status.ready_members, 3, "still 3 members: nothing removed");
    }
    assert!(fleet.secret_lists_or_watches().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scaling_while_a_member_is_down_waits_and_says_why() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut settings = fast_settings();
    settings.member_failure_grace = Duration::from_secs(3600);
    let mut ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        settings,
    );
    create(&fleet, &cluster("etcd-a", "a", 3, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    // Member 2 loses its data: it crash-loops (etcd refuses a truncated log).
    fleet
        .runtime("a")
        .wipe_pvc(WORKLOAD_NS, "data-etcd-a-etcd-2")
        .await?;
    set_replicas(&fleet, "etcd-a", 5).await?;
    let mut waited = None;
    for _ in 0..40 {
        fleet.sync_all().await?;
        match ctl.reconcile(NS, "etcd-a").await? {
            Outcome::Waiting(why) if why.contains("waits until every member is healthy") => {
                waited = Some(why);
                break;
            }
            Outcome::Acted(step) => panic!("no step while a member is down, got {step:?}"),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let why = waited.context("the controller never said it waits")?;
    assert!(why.contains("etcd-a-etcd-2"), "{why}");
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    let progressing = conditions::find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert!(
        progressing.message.contains("etcd-a-etcd-2"),
        "{progressing:?}"
    );
    assert_eq!(status.replicas, 3, "no member added");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_cluster_removes_workload_objects_but_keeps_the_pvcs() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    let c = get(&fleet, "etcd-a").await?;
    assert!(
        c.metadata
            .finalizers
            .as_ref()
            .unwrap()
            .contains(&"etcdfleet.dev/cleanup".to_string())
    );
    // Hand the reconciler the object as the API server shows it during
    // deletion (deletionTimestamp set, finalizer still there).
    let mut deleting = c.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let outcome =
        etcdfleet_controllers::etcdcluster::reconcile_cluster(&deleting, &ctl.ctx).await?;
    assert_eq!(outcome, Outcome::Deleted);
    let w = fleet.workload_client("a");
    assert!(
        Api::<StatefulSet>::namespaced(w.clone(), WORKLOAD_NS)
            .get_opt("etcd-a-etcd")
            .await?
            .is_none()
    );
    assert!(
        Api::<Service>::namespaced(w.clone(), WORKLOAD_NS)
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    assert!(
        Api::<ConfigMap>::namespaced(w.clone(), WORKLOAD_NS)
            .get_opt("etcd-a-etcd-members")
            .await?
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(w.clone(), WORKLOAD_NS)
            .get_opt("etcd-a-etcd-server-tls")
            .await?
            .is_none()
    );
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(w, WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    assert_eq!(pvcs.items.len(), 1, "the PVC outlives the cluster");
    let c = get(&fleet, "etcd-a").await?;
    assert!(
        c.metadata.finalizers.unwrap_or_default().is_empty(),
        "finalizer released"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deletion_completes_when_the_workload_cluster_is_gone() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    let mut deleting = get(&fleet, "etcd-a").await?;
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    // Unreachable: waits, bounded by the deletion timeout (5 s in tests).
    fleet.set_unreachable("a", true);
    let outcome =
        etcdfleet_controllers::etcdcluster::reconcile_cluster(&deleting, &ctl.ctx).await?;
    assert!(
        matches!(outcome, Outcome::Waiting(ref w) if w.contains("gives up after")),
        "{outcome:?}"
    );
    tokio::time::sleep(fast_settings().deletion_timeout).await;
    let outcome =
        etcdfleet_controllers::etcdcluster::reconcile_cluster(&deleting, &ctl.ctx).await?;
    assert_eq!(outcome, Outcome::Deleted);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_cluster_reports_the_next_step_and_writes_nothing_else() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    // This one runs without TLS: the plain-HTTP path end to end.
    let mut plain = cluster("etcd-a", "a", 1, "3.5.1");
    plain.spec.config.tls = Some(etcdfleet_api::TlsSpec {
        enabled: Some(false),
    });
    create(&fleet, &plain).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.patch(
        "etcd-a",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "spec": { "paused": true, "replicas": 3 } })),
    )
    .await?;
    fleet.clear_ops();
    let outcome = ctl.reconcile(NS, "etcd-a").await?;
    assert!(
        matches!(outcome, Outcome::Paused(Some(ref s)) if s.contains("add member 1")),
        "{outcome:?}"
    );
    assert!(
        fleet
            .writes()
            .iter()
            .all(|o| o.cluster == "management" && o.verb.contains("status")),
        "{:?}",
        fleet.writes()
    );
    // Unpaused, it grows to three members over plain HTTP.
    api.patch(
        "etcd-a",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "spec": { "paused": false } })),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    assert_eq!((status.replicas, status.ready_members), (3, 3));
    assert!(
        status
            .members
            .iter()
            .all(|m| m.client_urls.iter().all(|u| u.starts_with("http://")))
    );
    let secrets = Api::<Secret>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    assert!(secrets.items.is_empty(), "no TLS secrets without TLS");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nospace_alarm_is_reported_and_recovered() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    let mut small = cluster("etcd-a", "a", 3, "3.5.1");
    small.spec.config.etcd.as_mut().unwrap().quota_backend_bytes = Some(4 << 20);
    create(&fleet, &small).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;

    // Overwrite one key until etcd runs out of its 4 MiB quota: the space is
    // all history, which compaction and defragmentation give back.
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let mut kv = etcdfleet_controllers::etcd::ClusterClient::connect(&endpoints, &config)
        .await?
        .kv();
    let value = vec![b'x'; 256 * 1024];
    let mut full = false;
    for _ in 0..200 {
        match kv.put("big", value.clone(), None).await {
            Ok(_) => {}
            Err(e) if e.to_string().contains("space exceeded") => {
                full = true;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    assert!(full, "etcd never raised NOSPACE");

    fleet.sync_all().await?;
    let outcome = ctl.reconcile(NS, "etcd-a").await?;
    assert_eq!(outcome, Outcome::Acted(Step::RecoverFromNoSpace));
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    let available = conditions::find(&status.conditions, conditions::AVAILABLE).unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("False", "NoSpace")
    );
    let degraded = conditions::find(&status.conditions, conditions::DEGRADED).unwrap();
    assert_eq!(degraded.reason, "AlarmNOSPACE", "{degraded:?}");

    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    let status = get(&fleet, "etcd-a").await?.status.unwrap();
    assert!(conditions::is_true(
        &status.conditions,
        conditions::AVAILABLE
    ));
    kv.put("after-recovery", "ok", None).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificates_near_expiry_are_reissued_and_members_restart_with_them() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    let secrets: Api<Secret> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let cert_of = |s: Secret| s.data.unwrap()["tls.crt"].0.clone();
    let server_before = cert_of(secrets.get("etcd-a-etcd-server-tls").await?);
    let peer_before = cert_of(secrets.get("etcd-a-etcd-peer-tls").await?);

    // Leaves are valid 365 days: a controller that renews 400 days ahead sees
    // every leaf as expiring.
    let mut settings = fast_settings();
    settings.cert_renew_before = Duration::from_secs(400 * 86400);
    let eager = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        settings,
    );
    let outcome = eager.reconcile(NS, "etcd-a").await?;
    assert_eq!(
        outcome,
        Outcome::Acted(Step::WriteObjects(vec![
            etcdfleet_controllers::etcdcluster::plan::ObjectKind::Pki,
            etcdfleet_controllers::etcdcluster::plan::ObjectKind::ServerTlsSecret,
            etcdfleet_controllers::etcdcluster::plan::ObjectKind::PeerTlsSecret,
        ]))
    );
    assert_ne!(
        cert_of(secrets.get("etcd-a-etcd-server-tls").await?),
        server_before
    );
    assert_ne!(
        cert_of(secrets.get("etcd-a-etcd-peer-tls").await?),
        peer_before
    );

    // With the normal window nothing is due; members restarted onto the new
    // certificates rejoin, and the controller reaches them with its new identity.
    let mut ctl = controller(&fleet);
    for pod in ["etcd-a-etcd-0", "etcd-a-etcd-1", "etcd-a-etcd-2"] {
        fleet
            .runtime("a")
            .kill_pod_process(WORKLOAD_NS, pod)
            .await?;
        converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
        let status = get(&fleet, "etcd-a").await?.status.unwrap();
        assert_eq!(status.ready_members, 3, "{pod} rejoined: {status:#?}");
    }
    // Let the restarted members' reported sizes settle, then nothing is due.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    fleet.clear_ops();
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    assert!(
        fleet
            .writes()
            .iter()
            .all(|o| o.cluster == "management" && o.verb == "patch_status"),
        "only observed status may change: {:?}",
        fleet.writes()
    );
    put(&fleet, "a", "etcd-a", 3, "after-renewal").await?;
    Ok(())
}
