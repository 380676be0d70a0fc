//! Adoption on real Kubernetes: an etcd run by a plain StatefulSet (no
//! etcdfleet label anywhere, its own CA) is taken over by an EtcdCluster
//! with `spec.bootstrap.join`, under a writer, with the controller
//! restarted after every step; the preflight refusals write nothing; and a
//! change of the old membership underneath the takeover halts it.
//! The old and the new members are pods of one workload cluster, reaching
//! each other by their DNS names as they would in one pod network.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::adopt::{ADOPTED, phase, reason};
use etcdfleet_api::conditions;
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, TlsMaterial};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::pki::{CertificateAuthority, LeafSpec};
use etcdfleet_controllers::render::Names;
use etcdfleet_tests::control_plane::KubeWorld;
use etcdfleet_tests::control_plane::scenario::{NS, STAGE_LABEL, get, installed_world, patch_spec};
use etcdfleet_tests::control_plane::world::WORKLOAD_USER;
use etcdfleet_tests::driver::{ConvergeLog, TestController, converge, fast_settings};
use etcdfleet_tests::etcd_harness::{
    EtcdVersion, FollowingWriter, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::legacy_etcd::{
    LEGACY, LegacyEtcd, LegacyTrust, legacy_client_urls, legacy_pod, put_join_secret,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

const NAME: &str = "adopted";
const JOIN_SECRET: &str = "legacy-etcd-ca";

fn adopt_yaml(version: &str) -> String {
    let endpoints: Vec<String> = legacy_client_urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: {NAME}
  namespace: {NS}
  labels:
    {STAGE_LABEL}: dev
spec:
  clusterRef:
    name: w1
  version: {version}
  replicas: 3
  etcd:
    heartbeatIntervalMillis: 50
    electionTimeoutMillis: 500
  bootstrap:
    join:
      endpoints: [{}]
      credentialsSecretName: {JOIN_SECRET}
",
        endpoints.join(", ")
    )
}

/// A client configuration for this cluster's members (pod IPs, or their
/// advertised names through the pod network), with a client identity
/// issued from the old cluster's CA (which becomes this cluster's).
fn ours_config(legacy: &LegacyEtcd) -> Result<EtcdConfig> {
    let ca = &legacy.ca;
    let client = ca.issue(&LeafSpec::client("test-client", 2))?;
    Ok(EtcdConfig {
        tls: Some(TlsMaterial {
            ca_pem: ca.cert_pem().to_string(),
            client_cert_pem: Some(client.cert_pem),
            client_key_pem: Some(client.key_pem),
            server_name: Some(Names::new(NAME, WORKLOAD_NS).client_service_host()),
        }),
        deadlines: fast_settings().etcd_deadlines,
        transport: Some(legacy.network.clone()),
    })
}

/// `https://<pod IP>:2379` of this cluster's members the kubelet runs.
fn our_endpoints(world: &KubeWorld, members: u32) -> Vec<String> {
    let names = Names::new(NAME, WORKLOAD_NS);
    let runtime = world.workload("w1").runtime();
    (0..members)
        .filter_map(|o| runtime.pod_ip(WORKLOAD_NS, &names.pod(o)))
        .map(|ip| format!("https://{ip}:2379"))
        .collect()
}

/// Writes by the controller's workload identity to anything but
/// port-forward tunnels.
fn controller_writes(world: &KubeWorld) -> Result<Vec<String>> {
    let log = world.workload("w1").plane.audit()?;
    Ok(log
        .by(WORKLOAD_USER)
        .into_iter()
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(|e| e.to_string())
        .collect())
}

/// The `Adopted` condition's reason and message.
async fn adopted(world: &KubeWorld) -> Result<(String, String, String)> {
    let status = get(world, NAME).await?.status.context("no status")?;
    let c = conditions::find(&status.conditions, ADOPTED).context("no Adopted condition")?;
    Ok((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Reconciles until the takeover is complete, restarting the controller
/// after every step (a new one takes over from what etcd and the status
/// say), pointing the writer at each new member and, as a client that
/// follows the membership does, away from each old member the step
/// retired (`old`: the old members' ids and the writer's URLs of them). A
/// retired etcd 3.5.1 member keeps its client port open and lets every
/// request wait for the client's deadline (measured: 2 s puts, each to
/// its 2 s deadline over the 8 s watched), so a client still sending
/// to one stalls a deadline per request. A refusal (a preflight
/// check that failed for now, such as a peer port not answering yet) ends
/// a converge as it blocks a reconcile; the controller looks again after a
/// backoff, and so does this loop.
async fn take_over(
    ctl: &mut TestController,
    world: &KubeWorld,
    writer: &FollowingWriter,
    ours: &EtcdConfig,
    old: &BTreeMap<u64, String>,
) -> Result<ConvergeLog> {
    let deadline = Instant::now() + Duration::from_secs(400);
    let mut all = ConvergeLog::default();
    loop {
        let log = converge(
            ctl,
            &[(NS, NAME)],
            deadline.saturating_duration_since(Instant::now()),
            || async { Ok(()) },
            |_, step, ctl: &mut TestController| {
                ctl.restart();
                for e in our_endpoints(world, 3) {
                    writer.add(e, ours.clone());
                }
                if let Step::RetireMember { member_id } = step
                    && let Some(url) = old.get(member_id)
                {
                    writer.remove(url);
                }
                Ok(())
            },
        )
        .await?;
        all.steps.extend(log.steps);
        all.last = log.last;
        let (ok, why, message) = adopted(world).await?;
        if ok == "True" {
            return Ok(all);
        }
        ensure!(
            Instant::now() < deadline,
            "not taken over: {why}: {message}; last outcomes: {:?}",
            all.last
        );
        eprintln!("[{NS}/{NAME}] {why}: {message}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_adopt_a_statefulset_etcd_under_a_writer_across_controller_restarts() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let legacy = LegacyEtcd::deploy(&world, "w1", LegacyTrust::OneCa, "3.5.1").await?;
    let old = legacy.cluster(&world).await?;
    let mut kv = old.kv();
    for i in 0..200 {
        kv.put(format!("before/{i:03}"), format!("v{i}"), None)
            .await?;
    }
    let before = old.observe().await?;
    let old_ids: BTreeSet<u64> = before.members().iter().map(|m| m.member.id).collect();
    // The writer's URL of each old member (its pod's IP), by member id:
    // each member is named after its pod.
    let runtime = world.workload("w1").runtime();
    let old_urls: BTreeMap<u64, String> = (before.members().iter())
        .filter_map(|m| {
            let ip = runtime.pod_ip(WORKLOAD_NS, &m.member.name)?;
            Some((m.member.id, format!("https://{ip}:2379")))
        })
        .collect();
    ensure!(old_urls.len() == 3, "old members' URLs: {old_urls:?}");
    let cluster_id = old
        .member(&legacy.endpoints(&world)[0])
        .await?
        .status()
        .await?
        .cluster_id;
    let untouched = legacy.objects(&world).await?;
    put_join_secret(&world, NS, JOIN_SECRET, &legacy.ca).await?;

    let config = legacy.config()?;
    let writer = FollowingWriter::start(
        legacy
            .endpoints(&world)
            .into_iter()
            .map(|e| (e, config.clone()))
            .collect(),
        "adopt",
    );
    let ours = ours_config(&legacy)?;
    let mut ctl = world.controller().await?;
    world.apply(&adopt_yaml("3.5.1"))?;
    let started = Instant::now();
    let log = take_over(&mut ctl, &world, &writer, &ours, &old_urls).await?;
    let took = started.elapsed();
    let (ok, why, message) = adopted(&world).await?;
    assert_eq!(
        (ok.as_str(), why.as_str()),
        ("True", reason::TAKEN_OVER),
        "{message}; last outcomes: {:?}",
        log.last
    );
    let report = writer.stop().await?;
    let endpoints = our_endpoints(&world, 3);
    let checked = verify_acknowledged(&report, &endpoints, &ours, "adopt").await?;
    eprintln!(
        "adoption: {} writes acknowledged, {checked} verified, 0 lost, {} failed (outcome unknown), \
         takeover {took:?}; {}",
        report.acknowledged.len(),
        report.failed,
        report.pause_story()
    );
    assert!(
        report.acknowledged.len() > 50,
        "the writer kept writing: {report:?}"
    );
    // Clients barely notice the takeover (docs/adoption.md: the longest
    // pause 65 ms to about 1 s): no step may stop writes for longer than
    // one of the writer's 2 s put timeouts plus an election (1 s), and a
    // retired member fails at most the few writes in flight to it.
    assert!(
        report.longest_pause <= Duration::from_secs(3),
        "writes paused too long during the takeover: {}",
        report.pause_story()
    );
    let retired = 3;
    assert!(
        report.failed <= 3 * retired,
        "{} writes failed during the takeover: {:#?}",
        report.failed,
        report.failures
    );

    let steps = log.steps_of(&format!("{NS}/{NAME}"));
    let count = |f: fn(&Step) -> bool| steps.iter().filter(|s| f(s)).count();
    assert_eq!(count(|s| matches!(s, Step::ImportCa)), 1, "{steps:?}");
    assert_eq!(
        count(|s| matches!(s, Step::AddLearner { .. })),
        3,
        "{steps:?}"
    );
    assert_eq!(
        count(|s| matches!(s, Step::PromoteLearner { .. })),
        3,
        "{steps:?}"
    );
    assert_eq!(
        count(|s| matches!(s, Step::RetireMember { .. })),
        3,
        "{steps:?}"
    );
    assert!(
        !steps.iter().any(|s| matches!(s, Step::RemoveMember { .. })),
        "{steps:?}"
    );

    // The same cluster: its ID, every key, on every new member; only the
    // new members in the membership.
    let new = ClusterClient::connect(&endpoints, &ours).await?;
    let after = new.observe().await?;
    let ids: BTreeSet<u64> = after.members().iter().map(|m| m.member.id).collect();
    assert_eq!(ids.len(), 3, "{after:?}");
    assert!(ids.is_disjoint(&old_ids), "old members left: {after:?}");
    for ep in &endpoints {
        let member = new.member(ep).await?;
        assert_eq!(member.status().await?.cluster_id, cluster_id, "{ep}");
        let mut kv = ClusterClient::connect(std::slice::from_ref(ep), &ours)
            .await?
            .kv();
        let got = kv
            .get(
                "before/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_serializable(),
                ),
            )
            .await?;
        assert_eq!(got.kvs().len(), 200, "keys on {ep}");
    }
    let status = get(&world, NAME).await?.status.context("status")?;
    let adoption = status.adoption.clone().context("status.adoption")?;
    assert_eq!(adoption.phase, phase::COMPLETED, "{adoption:?}");
    assert_eq!(adoption.cluster_id, Some(format!("{cluster_id:x}")));
    assert_eq!(adoption.retired.len(), 3, "{adoption:?}");
    for object in [
        format!("StatefulSet/{WORKLOAD_NS}/{LEGACY}"),
        format!("Service/{WORKLOAD_NS}/{LEGACY}"),
        format!("PersistentVolumeClaim/{WORKLOAD_NS}/data-{LEGACY}-0"),
    ] {
        assert!(
            adoption.deletable_objects.contains(&object),
            "{object}: {adoption:?}"
        );
    }
    let (ok, why, _) = adopted(&world).await?;
    assert_eq!((ok.as_str(), why.as_str()), ("True", reason::TAKEN_OVER));
    assert!(conditions::is_true(
        &status.conditions,
        conditions::AVAILABLE
    ));

    // The old objects are untouched: same UIDs, generations and specs, and
    // not one write to them by the controller's identity.
    assert_eq!(legacy.objects(&world).await?, untouched);
    let legacy_writes: Vec<String> = controller_writes(&world)?
        .into_iter()
        .filter(|w| w.contains(LEGACY))
        .collect();
    assert!(legacy_writes.is_empty(), "{legacy_writes:#?}");

    // From now on etcdfleet manages it like any other cluster: scale to 5.
    world.kubectl(&[
        "scale",
        "-n",
        NS,
        &format!("etcdcluster/{NAME}"),
        "--replicas=5",
    ])?;
    converge(
        &mut ctl,
        &[(NS, NAME)],
        Duration::from_secs(240),
        || async { Ok(()) },
        |_, _, _| Ok(()),
    )
    .await?;
    let status = get(&world, NAME).await?.status.context("status")?;
    assert_eq!(status.ready_members, 5, "{status:#?}");
    Ok(())
}

/// Reconciles until the `Adopted` condition carries `want` (a refusal is
/// looked at again on every reconcile here).
async fn refused_with(ctl: &TestController, world: &KubeWorld, want: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = ctl.reconcile(NS, NAME).await;
        if let Ok((status, reason, message)) = adopted(world).await
            && reason == want
        {
            ensure!(status == "False", "{reason}: {message}");
            return Ok(message);
        }
        ensure!(
            Instant::now() < deadline,
            "no {want} refusal: {:?}",
            adopted(world).await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Nothing was written: no PKI Secret, no workload object, no write by the
/// controller's workload identity, and the old membership as it was.
async fn nothing_written(
    world: &KubeWorld,
    legacy: &LegacyEtcd,
    ids: &BTreeSet<u64>,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(world.management.admin_client().await?, NS);
    ensure!(
        secrets
            .get_opt(&format!("{NAME}-etcd-pki"))
            .await?
            .is_none(),
        "a PKI Secret was written"
    );
    let writes = controller_writes(world)?;
    ensure!(writes.is_empty(), "workload writes: {writes:#?}");
    let members = legacy.cluster(world).await?.list_members().await?;
    let now: BTreeSet<u64> = members.iter().map(|m| m.id).collect();
    ensure!(&now == ids, "membership changed: {members:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_adopt_refusals_missing_trust_version_skew_and_an_unhealthy_member_write_nothing()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    // Servers and clients on one CA, peers on another.
    let legacy = LegacyEtcd::deploy(&world, "w1", LegacyTrust::SeparatePeerCa, "3.5.1").await?;
    let ids: BTreeSet<u64> = legacy
        .cluster(&world)
        .await?
        .list_members()
        .await?
        .iter()
        .map(|m| m.id)
        .collect();
    let ctl = world.controller().await?;

    // A CA that signed nothing of the old cluster's: the controller cannot
    // trust its servers.
    let stranger = CertificateAuthority::generate("not the legacy CA")?;
    put_join_secret(&world, NS, JOIN_SECRET, &stranger).await?;
    world.apply(&adopt_yaml("3.5.1"))?;
    let why = refused_with(&ctl, &world, reason::SERVER_TRUST_MISSING).await?;
    eprintln!("refused: {why}");
    nothing_written(&world, &legacy, &ids).await?;

    // The servers' CA, but the peers trust another one: the old members
    // would refuse etcdfleet's members.
    put_join_secret(&world, NS, JOIN_SECRET, &legacy.ca).await?;
    let why = refused_with(&ctl, &world, reason::PEER_TRUST_MISSING).await?;
    eprintln!("refused: {why}");
    assert!(why.contains(":2380"), "{why}");
    nothing_written(&world, &legacy, &ids).await?;

    // A downgrade of the existing members.
    patch_spec(&world, NAME, json!({ "version": "3.4.23" }))?;
    let why = refused_with(&ctl, &world, reason::VERSION_SKEW).await?;
    eprintln!("refused: {why}");
    nothing_written(&world, &legacy, &ids).await?;

    // An existing member down (its owner scaled its StatefulSet down).
    patch_spec(&world, NAME, json!({ "version": "3.5.1" }))?;
    world.kubectl_workload(
        "w1",
        &[
            "scale",
            "-n",
            WORKLOAD_NS,
            &format!("statefulset/{LEGACY}"),
            "--replicas=2",
        ],
    )?;
    let why = refused_with(&ctl, &world, reason::MEMBER_UNHEALTHY).await?;
    eprintln!("refused: {why}");
    assert!(why.contains("legacy-etcd-2"), "{why}");
    let writes = controller_writes(&world)?;
    assert!(writes.is_empty(), "workload writes: {writes:#?}");
    let secrets: Api<Secret> = Api::namespaced(world.management.admin_client().await?, NS);
    assert!(
        secrets
            .get_opt(&format!("{NAME}-etcd-pki"))
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_adopt_halts_when_the_old_membership_changes_underneath() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let legacy = LegacyEtcd::deploy(&world, "w1", LegacyTrust::OneCa, "3.5.1").await?;
    put_join_secret(&world, NS, JOIN_SECRET, &legacy.ca).await?;
    let ctl = world.controller().await?;
    world.apply(&adopt_yaml("3.5.1"))?;
    // The takeover runs until this cluster's first member is a voter.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let outcome = ctl.reconcile(NS, NAME).await;
        if let Ok(Outcome::Acted(Step::PromoteLearner { .. })) = outcome {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the first member was not promoted: {outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The old owner, still at work, removes one of its members.
    let old = legacy.cluster(&world).await?;
    let gone = (old.list_members().await?.into_iter())
        .find(|m| m.name == legacy_pod(2))
        .context("legacy-etcd-2 in the membership")?;
    old.remove_member(gone.id).await?;
    let why = refused_with(&ctl, &world, reason::MEMBERSHIP_CHANGED).await?;
    eprintln!("halted: {why}");
    assert!(why.contains(&format!("{:x}", gone.id)), "{why}");

    // Halted: nothing more is done, the membership stays as it is.
    let before: BTreeSet<u64> = old.list_members().await?.iter().map(|m| m.id).collect();
    for _ in 0..5 {
        let outcome = ctl.reconcile(NS, NAME).await?;
        assert!(!matches!(outcome, Outcome::Acted(_)), "{outcome:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after: BTreeSet<u64> = old.list_members().await?.iter().map(|m| m.id).collect();
    assert_eq!(after, before);
    let status = get(&world, NAME).await?.status.context("status")?;
    let adoption = status.adoption.context("status.adoption")?;
    assert_eq!(adoption.phase, phase::HALTED, "{adoption:?}");
    Ok(())
}
