//! End to end on real etcd: versions come from `spec.version`, defaults from
//! templates, and a controller upgrade alone changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use etcdfleet_api::conditions::{self, VERSION_ACCEPTED};
use etcdfleet_api::{
    ClusterEtcdTemplate, ClusterEtcdTemplateSpec, ClusterRef, EtcdCluster, EtcdClusterSpec,
    EtcdConfig, PodTemplateOverrides, StorageSpec, TemplateKind, TemplateRef,
};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::etcdcluster::resolve::REBASE_ANNOTATION;
use etcdfleet_controllers::render::{self, RenderProfile};
use etcdfleet_tests::driver::converge;
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller, converge_all, create, etcd_of, fast_raft, get,
    patch_spec, put, read_everywhere, running, wait_cluster_version,
};
use etcdfleet_tests::versions::{check_flags, pods_run_their_releases_flags};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

fn require_both() -> bool {
    require_etcd(EtcdVersion::V3_4).is_some() && require_etcd(EtcdVersion::V3_5).is_some()
}

async fn pod_images(fleet: &Fleet, workload: &str) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client(workload), WORKLOAD_NS);
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| {
            let image = p.spec.unwrap().containers[0]
                .image
                .clone()
                .unwrap_or_default();
            (p.metadata.name.unwrap(), image)
        })
        .collect())
}

fn accepted(c: &EtcdCluster) -> (String, String, String) {
    let cond = conditions::find(&c.status.as_ref().unwrap().conditions, VERSION_ACCEPTED)
        .expect("VersionAccepted is set")
        .clone();
    (cond.status, cond.reason, cond.message)
}

/// 3.4 → 3.5 by editing `spec.version`, with a writer running throughout and a
/// brand-new controller (no state at all) for every single reconcile, so the
/// upgrade is resumed from the CR and the cluster alone at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_from_3_4_to_3_5_loses_no_write_across_controller_restarts() -> Result<()>
{
    if !require_both() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.4.23")]).await?;
    let before = get(&fleet, "etcd-a").await?;
    assert_eq!(
        before.status.as_ref().unwrap().current_version.as_deref(),
        Some("3.4.23")
    );
    let before_version = wait_cluster_version(&fleet, "a", "etcd-a", 0, "3.4").await?;
    assert!(before_version.starts_with("3.4"), "{before_version}");
    put(&fleet, "a", "etcd-a", 3, "written-on-3.4").await?;

    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "upgrade").await?;
    patch_spec(&fleet, "etcd-a", serde_json::json!({ "version": "3.5.1" })).await?;

    let min_ready = Arc::new(AtomicI32::new(3));
    let restarts = Arc::new(AtomicI32::new(0));
    let log = converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(180),
        || {
            let (fleet, min_ready) = (&fleet, min_ready.clone());
            async move {
                fleet.sync_all().await?;
                if let Some(s) = get(fleet, "etcd-a").await?.status {
                    min_ready.fetch_min(s.ready_members, Ordering::SeqCst);
                }
                Ok(())
            }
        },
        |_, _, ctl| {
            // The controller dies after every step; a new one takes over.
            ctl.restart();
            restarts.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
    )
    .await?;
    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "upgrade").await?;

    let restarted: Vec<u32> = log
        .steps
        .iter()
        .filter_map(|(_, s)| match s {
            Step::RestartMember { ordinal, .. } => Some(*ordinal),
            _ => None,
        })
        .collect();
    eprintln!(
        "upgrade: {} steps, {} controller restarts, members restarted in order {restarted:?}, \
         {checked} acknowledged writes verified ({} failed during the roll), min ready members {}",
        log.steps.len(),
        restarts.load(Ordering::SeqCst),
        report.failed,
        min_ready.load(Ordering::SeqCst)
    );
    assert_eq!(
        restarted.len(),
        3,
        "each member restarted once: {:?}",
        log.steps
    );
    assert!(
        log.steps
            .iter()
            .any(|(_, s)| matches!(s, Step::MoveLeader { .. })),
        "leadership moved before the leader's turn: {:?}",
        log.steps
    );
    assert!(
        min_ready.load(Ordering::SeqCst) >= 2,
        "never more than one member down"
    );
    assert!(checked > 0);
    let images = pod_images(&fleet, "a").await?;
    assert!(
        images.values().all(|i| i.ends_with(":v3.5.1")),
        "{images:?}"
    );
    let after = get(&fleet, "etcd-a").await?;
    let status = after.status.as_ref().unwrap();
    assert_eq!(status.current_version.as_deref(), Some("3.5.1"));
    assert_eq!(accepted(&after).0, "True");
    // etcd itself moved the cluster version once every member ran 3.5.
    let version = wait_cluster_version(&fleet, "a", "etcd-a", 0, "3.5").await?;
    assert_eq!(version, "3.5", "cluster version reported by etcd");
    read_everywhere(&fleet, "a", "etcd-a", 3, "written-on-3.4").await?;
    Ok(())
}

/// Rejected version changes set `VersionAccepted=False` with the reason and
/// touch nothing in the workload cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rejected_version_changes_touch_nothing() -> Result<()> {
    if !require_both() {
        return Ok(());
    }
    let (fleet, ctl) = running(
        &["a"],
        &[
            cluster("old", "a", 1, "3.4.23"),
            cluster("new", "a", 1, "3.5.1"),
        ],
    )
    .await?;
    let images_before = pod_images(&fleet, "a").await?;

    for (name, version, reason, words) in [
        ("old", "3.6.0", "SkipsMinor", "skips a minor version"),
        (
            "new",
            "3.4.23",
            "Downgrade",
            "downgrade from 3.5.1 to 3.4.23",
        ),
        // 4.0.0 is refused by the CRD (etcd 3 only); an unknown 3.x minor reaches the policy.
        ("new", "3.9.0", "UnsupportedVersion", "not supported"),
    ] {
        patch_spec(&fleet, name, serde_json::json!({ "version": version })).await?;
        fleet.clear_ops();
        for _ in 0..3 {
            fleet.sync_all().await?;
            let outcome = ctl.reconcile(NS, name).await?;
            assert_eq!(outcome, Outcome::Converged, "{name} → {version}");
        }
        let c = get(&fleet, name).await?;
        let (status, got_reason, message) = accepted(&c);
        assert_eq!(
            (status.as_str(), got_reason.as_str()),
            ("False", reason),
            "{message}"
        );
        assert!(message.contains(words), "{message}");
        assert!(message.contains("keeps its current version"), "{message}");
        let workload_writes: Vec<_> = fleet
            .writes()
            .into_iter()
            .filter(|o| o.cluster == "a")
            .collect();
        assert!(workload_writes.is_empty(), "{workload_writes:?}");
        assert_eq!(pod_images(&fleet, "a").await?, images_before);
    }
    // Fixing the spec clears the condition.
    patch_spec(&fleet, "new", serde_json::json!({ "version": "3.5.1" })).await?;
    ctl.reconcile(NS, "new").await?;
    assert_eq!(accepted(&get(&fleet, "new").await?).0, "True");
    Ok(())
}

#[test]
fn versions_that_are_not_full_semver_are_rejected_by_the_crd() {
    for bad in ["3.5", "latest", "v3.5.1"] {
        let c = cluster("x", "a", 1, bad);
        let err = c.validate_cel().expect_err(bad).to_string();
        assert!(err.contains("full semantic version"), "{bad}: {err}");
    }
}

fn base_template(
    generation_note: &str,
    snapshot_count: i64,
    tier: &str,
    size: &str,
) -> ClusterEtcdTemplate {
    let mut etcd = fast_raft();
    etcd.snapshot_count = Some(snapshot_count);
    ClusterEtcdTemplate::new(
        "base",
        ClusterEtcdTemplateSpec {
            description: Some(generation_note.to_string()),
            config: EtcdConfig {
                version: Some("3.5.1".into()),
                replicas: Some(1),
                storage: Some(StorageSpec {
                    storage_class_name: None,
                    size: Some(Quantity(size.into())),
                }),
                pod_template: Some(PodTemplateOverrides {
                    labels: Some(BTreeMap::from([("tier".to_string(), tier.to_string())])),
                    ..Default::default()
                }),
                etcd: Some(etcd),
                ..Default::default()
            },
        },
    )
}

fn from_template(name: &str) -> EtcdCluster {
    let mut c = EtcdCluster::new(
        name,
        EtcdClusterSpec {
            cluster_ref: Some(ClusterRef { name: "a".into() }),
            template_ref: Some(TemplateRef {
                kind: TemplateKind::ClusterEtcdTemplate,
                name: "base".into(),
            }),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(NS.into());
    c
}

/// Materialization: template values are written into the cluster's spec once;
/// a later template edit changes nothing on that cluster; a new cluster gets
/// the new defaults; a rebase moves the old cluster explicitly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn template_edits_reach_existing_clusters_only_by_rebase() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    let templates: Api<ClusterEtcdTemplate> = Api::all(fleet.management_direct());
    templates
        .create(
            &PostParams::default(),
            &base_template("v1", 10000, "gold", "1Gi"),
        )
        .await?;
    create(&fleet, &from_template("old")).await?;
    converge_all(&fleet, &mut ctl, &["old"]).await?;
    let old = get(&fleet, "old").await?;
    assert_eq!(
        old.spec.config.version.as_deref(),
        Some("3.5.1"),
        "materialized"
    );
    assert_eq!(
        old.spec.config.etcd.as_ref().unwrap().snapshot_count,
        Some(10000)
    );
    let applied = old
        .status
        .as_ref()
        .unwrap()
        .template
        .clone()
        .context("status.template")?;
    assert_eq!(
        (applied.kind.as_str(), applied.name.as_str()),
        ("ClusterEtcdTemplate", "base")
    );
    assert!(
        applied
            .materialized_fields
            .iter()
            .any(|f| f == "spec.version"),
        "{applied:?}"
    );

    // The platform team edits the template.
    let mut edited = templates.get("base").await?;
    // (Its storage stays: a rebase carries storage through the storage
    // rules, which e2e_storage's rebase test proves with an expandable class.)
    edited.spec = base_template("v2", 5000, "platinum", "1Gi").spec;
    templates
        .replace("base", &PostParams::default(), &edited)
        .await?;

    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        assert_eq!(ctl.reconcile(NS, "old").await?, Outcome::Converged);
    }
    assert!(
        fleet.writes().is_empty(),
        "template edit wrote: {:?}",
        fleet.writes()
    );
    assert_eq!(
        get(&fleet, "old").await?.spec,
        old.spec,
        "old cluster's spec unchanged"
    );

    // A new cluster gets the new defaults.
    create(&fleet, &from_template("new")).await?;
    converge_all(&fleet, &mut ctl, &["new"]).await?;
    let new = get(&fleet, "new").await?;
    assert_eq!(
        new.spec.config.etcd.as_ref().unwrap().snapshot_count,
        Some(5000)
    );

    // The customer changed one templated field of `old` by hand; then rebases.
    patch_spec(
        &fleet,
        "old",
        serde_json::json!({ "podTemplate": { "labels": { "tier": "custom" } } }),
    )
    .await?;
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.patch(
        "old",
        &PatchParams::default(),
        &Patch::Merge(
            &serde_json::json!({ "metadata": { "annotations": { REBASE_ANNOTATION: "true" } } }),
        ),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["old"]).await?;
    let rebased = get(&fleet, "old").await?;
    let config = &rebased.spec.config;
    assert_eq!(
        config.etcd.as_ref().unwrap().snapshot_count,
        Some(5000),
        "moved to the new template value"
    );
    assert_eq!(
        config
            .pod_template
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap()["tier"],
        "custom",
        "the user's own edit is kept"
    );
    assert_eq!(
        config.storage.as_ref().unwrap().size,
        Some(Quantity("1Gi".into())),
        "the template's storage, unchanged"
    );
    assert!(
        !rebased
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(REBASE_ANNOTATION)
    );
    let sts: Api<StatefulSet> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let args = sts
        .get("old-etcd")
        .await?
        .spec
        .template
        .spec
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.contains(&"--snapshot-count=5000".to_string()),
        "{args:?}"
    );
    Ok(())
}

/// The render contract: a controller release that renders differently writes
/// nothing to any cluster until a CR changes, and then only to that cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_upgrade_changes_nothing_until_a_cr_changes() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = running(
        &["a", "b"],
        &[
            cluster("etcd-a", "a", 3, "3.5.1"),
            cluster("etcd-b", "b", 1, "3.5.1"),
        ],
    )
    .await?;

    let next = RenderProfile {
        extra_pod_labels: BTreeMap::from([(
            "etcdfleet.dev/release".to_string(),
            "next".to_string(),
        )]),
        ..Default::default()
    };
    ctl.upgrade_to(next);
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        for name in ["etcd-a", "etcd-b"] {
            assert_eq!(ctl.reconcile(NS, name).await?, Outcome::Converged);
        }
    }
    assert!(
        fleet.writes().is_empty(),
        "the new release wrote: {:?}",
        fleet.writes()
    );

    // One CR changes: only that cluster is re-rendered (with the new release's rendering).
    patch_spec(
        &fleet,
        "etcd-b",
        serde_json::json!({ "etcd": { "snapshotCount": 20000 } }),
    )
    .await?;
    fleet.clear_ops();
    converge_all(&fleet, &mut ctl, &["etcd-a", "etcd-b"]).await?;
    let writes = fleet.writes();
    assert!(writes.iter().all(|o| o.cluster != "a"), "{writes:?}");
    assert!(
        writes
            .iter()
            .any(|o| o.cluster == "b" && o.resource == "statefulsets"),
        "{writes:?}"
    );
    let label = |sts: StatefulSet| {
        sts.spec
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap()
            .get("etcdfleet.dev/release")
            .cloned()
    };
    let a: Api<StatefulSet> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let b: Api<StatefulSet> = Api::namespaced(fleet.workload_client("b"), WORKLOAD_NS);
    assert_eq!(label(a.get("etcd-a-etcd").await?), None);
    assert_eq!(label(b.get("etcd-b-etcd").await?).as_deref(), Some("next"));
    let b_sts = b.get("etcd-b-etcd").await?;
    assert!(render::carried_hash(&b_sts.metadata).is_some());
    Ok(())
}

/// StatefulSets written by the release before bootstrap-only inputs (the
/// object's UID, the restore record) left the inputs hash carry the old
/// hash: this release neither rewrites them nor restarts a member, until a
/// CR changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_written_by_the_previous_release_is_neither_rewritten_nor_rolled() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    let previous = RenderProfile {
        legacy_inputs_hash: true,
        legacy_flags: true,
        ..Default::default()
    };
    ctl.upgrade_to(previous);
    create(&fleet, &cluster("etcd-a", "a", 3, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    put(&fleet, "a", "etcd-a", 3, "before-the-upgrade").await?;
    let sts: Api<StatefulSet> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let written = sts.get("etcd-a-etcd").await?;
    let c = get(&fleet, "etcd-a").await?;
    let resolution = etcdfleet_controllers::etcdcluster::resolve::resolve_own_spec(&c.spec)?;
    let inputs = etcdfleet_controllers::etcdcluster::resolve::render_inputs(&c, &resolution);
    let carried = render::carried_hash(&written.metadata).context("no inputs hash")?;
    assert_eq!(carried, inputs.legacy_statefulset_hash());
    assert_ne!(carried, inputs.statefulset_hash());
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let uids = |list: Vec<Pod>| -> BTreeMap<String, Option<String>> {
        list.into_iter()
            .map(|p| (p.metadata.name.unwrap_or_default(), p.metadata.uid))
            .collect()
    };
    let before = uids(pods.list(&ListParams::default()).await?.items);
    assert_eq!(before.len(), 3);

    ctl.upgrade_to(RenderProfile::default());
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    }
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    assert!(writes.is_empty(), "this release wrote: {writes:?}");
    assert_eq!(uids(pods.list(&ListParams::default()).await?.items), before);
    assert_eq!(
        sts.get("etcd-a-etcd").await?.metadata.resource_version,
        written.metadata.resource_version
    );
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-the-upgrade").await?;
    Ok(())
}

/// With real server-side apply, a field manager's apply that omits a field it
/// applied before removes it. A second materialization pass (the first one's
/// status write was lost) must keep what the first wrote; a rebase removes
/// exactly the values the template no longer supplies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_materialization_keeps_the_written_fields_and_a_rebase_removes_only_dropped_ones()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    let templates: Api<ClusterEtcdTemplate> = Api::all(fleet.management_direct());
    templates
        .create(
            &PostParams::default(),
            &base_template("v1", 10000, "gold", "1Gi"),
        )
        .await?;
    create(&fleet, &from_template("twice")).await?;
    converge_all(&fleet, &mut ctl, &["twice"]).await?;

    // The record of the materialization is lost: the next pass materializes again.
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.patch_status(
        "twice",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": { "template": null } })),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["twice"]).await?;
    let again = get(&fleet, "twice").await?;
    let config = &again.spec.config;
    assert_eq!(config.version.as_deref(), Some("3.5.1"), "{config:?}");
    assert_eq!(config.replicas, Some(1));
    assert_eq!(
        config.etcd.as_ref().and_then(|e| e.snapshot_count),
        Some(10000)
    );
    assert_eq!(
        config.storage.as_ref().and_then(|s| s.size.clone()),
        Some(Quantity("1Gi".into()))
    );

    // The template drops its pod labels; a rebase removes them and only them.
    let mut edited = templates.get("base").await?;
    // (Storage as before: a rebase carries a new size through the storage
    // rules; e2e_storage's rebase test proves it.)
    edited.spec = base_template("v2", 5000, "unused", "1Gi").spec;
    edited.spec.config.pod_template = None;
    templates
        .replace("base", &PostParams::default(), &edited)
        .await?;
    api.patch(
        "twice",
        &PatchParams::default(),
        &Patch::Merge(
            &serde_json::json!({ "metadata": { "annotations": { REBASE_ANNOTATION: "true" } } }),
        ),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["twice"]).await?;
    let rebased = get(&fleet, "twice").await?;
    let config = &rebased.spec.config;
    assert!(
        config
            .pod_template
            .as_ref()
            .and_then(|p| p.labels.as_ref())
            .is_none_or(|l| !l.contains_key("tier")),
        "a value the template no longer supplies is removed: {config:?}"
    );
    assert_eq!(
        config.etcd.as_ref().and_then(|e| e.snapshot_count),
        Some(5000)
    );
    assert_eq!(config.version.as_deref(), Some("3.5.1"));
    assert_eq!(
        config.storage.as_ref().and_then(|s| s.size.clone()),
        Some(Quantity("1Gi".into())),
        "the template's storage, unchanged"
    );
    Ok(())
}

/// Every supported release starts from the flags the controller renders for
/// it, as a 3-member mutual-TLS cluster: corruption checks on in each
/// release's spelling (etcd logs its initial check; 3.6+ report both
/// feature gates enabled), no `--experimental-*` on 3.7, no
/// `--feature-gates` before 3.6 (etcd refuses unknown flags, so a member
/// that runs accepted its command line).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flags_per_version_every_supported_release_starts_as_a_3_member_tls_cluster() -> Result<()>
{
    let mut binaries = Vec::new();
    for version in [
        EtcdVersion::V3_4,
        EtcdVersion::V3_5Old,
        EtcdVersion::V3_5Latest,
        EtcdVersion::V3_6,
        EtcdVersion::V3_7,
    ] {
        let Some(binary) = require_etcd(version) else {
            return Ok(());
        };
        binaries.push(binary);
    }
    let clusters: Vec<EtcdCluster> = binaries
        .iter()
        .map(|b| {
            cluster(
                &format!("v{}", b.release.replace('.', "-")),
                "a",
                3,
                &b.release,
            )
        })
        .collect();
    let (fleet, _ctl) = running(&["a"], &clusters).await?;
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    for (binary, c) in binaries.iter().zip(&clusters) {
        let name = c.metadata.name.clone().unwrap();
        let status = get(&fleet, &name).await?.status.context("status")?;
        assert_eq!(
            status.current_version.as_deref(),
            Some(binary.release.as_str())
        );
        assert_eq!(status.ready_members, 3, "{name}");
        assert!(c.spec.config.tls.is_none(), "TLS is on by default");
        let names = etcdfleet_controllers::render::Names::new(&name, WORKLOAD_NS);
        for ordinal in 0..3 {
            let pod = pods.get(&names.pod(ordinal)).await?;
            let args = pod.spec.unwrap().containers[0].args.clone().unwrap();
            check_flags(&names.pod(ordinal), &binary.release, &args)?;
            assert!(args.contains(&"--client-cert-auth=true".to_string()));
            // A member checks its data against its peers only when it
            // restarts on existing data (etcd skips the check for a new
            // member): here, the server configuration it logs at start
            // (3.4, 3.5) or the feature gates it reports (3.6+) say the
            // checks are on; the upgrade suite sees the check run.
            let log = fleet
                .runtime("a")
                .pod_log_tail(WORKLOAD_NS, &names.pod(ordinal), 100_000);
            let logged = |field: &str| log.contains(&format!("\"{field}\":true"));
            let ip = fleet
                .runtime("a")
                .resolve(&names.member_host(ordinal))
                .context("pod ip")?;
            let metrics =
                etcdfleet_tests::etcd_harness::http_get(&format!("{ip}:2381"), "/metrics")?;
            let reported = |gate: &str| {
                metrics.lines().any(|l| {
                    l.starts_with("etcd_server_feature_enabled{")
                        && l.contains(&format!("name=\"{gate}\""))
                        && l.ends_with(" 1")
                })
            };
            let mut parts = binary.release.split('.').skip(1).map(|p| p.parse::<u64>());
            let (minor, patch) = (
                parts.next().context("minor")??,
                parts.next().context("patch")??,
            );
            let pod = names.pod(ordinal);
            let release = &binary.release;
            // 3.4 and 3.5 log the checks in their server configuration (3.6
            // logs the deprecated field as false); 3.6+ report the gates.
            assert_eq!(
                logged("initial-corrupt-check"),
                minor < 6,
                "{pod} ({release}): initial corruption check in the logged configuration"
            );
            assert_eq!(
                logged("compact-check-time-enabled"),
                minor == 5 && patch >= 5,
                "{pod} ({release}): compact-hash check in the logged configuration"
            );
            for gate in ["InitialCorruptCheck", "CompactHashCheck"] {
                assert_eq!(
                    reported(gate),
                    minor >= 6,
                    "{pod} ({release}): feature gate {gate} reported enabled"
                );
            }
        }
        eprintln!(
            "etcd {} started as 3 TLS members with {:?}",
            binary.release,
            etcdfleet_controllers::version_flags::version_flags(&binary.release)
        );
    }
    Ok(())
}

/// A StatefulSet written by the release before per-version flags keeps its
/// command line: this release writes nothing and restarts no member until
/// the CR changes; then the StatefulSet is rewritten with the flags and the
/// members roll onto them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_rendered_before_per_version_flags_is_not_rewritten_until_its_spec_changes()
-> Result<()> {
    let Some(v35) = require_etcd(EtcdVersion::V3_5Latest) else {
        return Ok(());
    };
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    ctl.upgrade_to(RenderProfile {
        legacy_flags: true,
        ..Default::default()
    });
    create(&fleet, &cluster("flags", "a", 3, &v35.release)).await?;
    converge_all(&fleet, &mut ctl, &["flags"]).await?;
    let sts: Api<StatefulSet> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let args_of = |s: StatefulSet| {
        s.spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap()
    };
    let written = sts.get("flags-etcd").await?;
    assert!(
        !args_of(written.clone())
            .iter()
            .any(|a| a.contains("corrupt-check")),
        "the previous release rendered no corruption checks"
    );
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let uids = |list: Vec<Pod>| -> BTreeMap<String, Option<String>> {
        list.into_iter()
            .map(|p| (p.metadata.name.unwrap_or_default(), p.metadata.uid))
            .collect()
    };
    let before = uids(pods.list(&ListParams::default()).await?.items);

    ctl.upgrade_to(RenderProfile::default());
    fleet.clear_ops();
    for _ in 0..3 {
        fleet.sync_all().await?;
        assert_eq!(ctl.reconcile(NS, "flags").await?, Outcome::Converged);
    }
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|o| o.cluster == "a")
        .collect();
    assert!(writes.is_empty(), "this release wrote: {writes:?}");
    assert_eq!(uids(pods.list(&ListParams::default()).await?.items), before);
    assert_eq!(
        sts.get("flags-etcd").await?.metadata.resource_version,
        written.metadata.resource_version
    );

    // The CR changes: rewritten with the flags, members rolled onto them.
    patch_spec(
        &fleet,
        "flags",
        serde_json::json!({ "etcd": { "snapshotCount": 20000 } }),
    )
    .await?;
    converge_all(&fleet, &mut ctl, &["flags"]).await?;
    let args = args_of(sts.get("flags-etcd").await?);
    for flag in etcdfleet_controllers::version_flags::version_flags(&v35.release) {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }
    let after = uids(pods.list(&ListParams::default()).await?.items);
    assert!(
        before.iter().all(|(pod, uid)| after.get(pod) != Some(uid)),
        "every member rolled"
    );
    pods_run_their_releases_flags(&fleet, "a").await?;
    Ok(())
}
