//! CA rotation on real Kubernetes: a 3-member TLS cluster moves to a new CA
//! under a writer (the writer takes the new trust bundle and client
//! identity as the controller publishes them), with the controller
//! restarted after every step; a rotation cancelled while members are
//! being rolled returns to the old CA alone; a CA within the expiry window
//! is rotated without being asked; and a lost CA Secret is recovered from
//! the members' trust (on request) by a rotation to a new CA.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::ca_rotation::{
    CA_ROTATING, EXPIRY_REQUEST_PREFIX, RECOVER_CA_ANNOTATION, ROTATE_CA_ANNOTATION, phase,
};
use etcdfleet_api::conditions;
use etcdfleet_controllers::access::Pki;
use etcdfleet_controllers::connector::KubeconfigClientFactory;
use etcdfleet_controllers::dialer::DialerKind;
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, TlsMaterial};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::observe::read_pki;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::pki::{CertificateAuthority, LeafSpec, remaining_validity};
use etcdfleet_controllers::render::Names;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, etcd_of, get, installed_world, put, read_everywhere,
    wait_available,
};
use etcdfleet_tests::control_plane::{KubeWorld, real_settings};
use etcdfleet_tests::driver::{ConvergeLog, TestController, converge, no_hook};
use etcdfleet_tests::etcd_harness::{
    AckedWriter, EtcdVersion, WriteReport, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::Mutex;

/// The PKI Secret of cluster `name`.
async fn pki_of(world: &KubeWorld, name: &str) -> Result<Pki> {
    let cluster = get(world, name).await?;
    read_pki(
        &world.management.admin_client().await?,
        &cluster,
        &Names::new(name, WORKLOAD_NS),
    )
    .await?
    .context("no PKI Secret")
}

/// `kubectl annotate --overwrite etcdcluster/<name> etcdfleet.dev/rotate-ca=<value>`.
fn ask_rotation(world: &KubeWorld, name: &str, value: &str) -> Result<String> {
    world.kubectl(&[
        "annotate",
        "--overwrite",
        "-n",
        NS,
        &format!("etcdcluster/{name}"),
        &format!("{ROTATE_CA_ANNOTATION}={value}"),
    ])
}

/// The kinds of the steps taken on `name`, in order.
fn step_kinds(log: &ConvergeLog, name: &str) -> Vec<&'static str> {
    log.steps_of(&format!("{NS}/{name}"))
        .iter()
        .map(|s| s.kind())
        .collect()
}

/// A client of `name`'s members that trusts `trusted` and presents a client
/// certificate issued by `issuer`.
async fn client_from(
    world: &KubeWorld,
    name: &str,
    trusted: &str,
    issuer: &CertificateAuthority,
) -> Result<(Vec<String>, EtcdConfig)> {
    let (endpoints, mut config) = etcd_of(world, "w1", name, 3).await?;
    let client = issuer.issue(&LeafSpec::client("test-client", 1))?;
    config.tls = Some(TlsMaterial {
        ca_pem: trusted.to_string(),
        client_cert_pem: Some(client.cert_pem),
        client_key_pem: Some(client.key_pem),
        server_name: Some(Names::new(name, WORKLOAD_NS).client_service_host()),
    });
    Ok((endpoints, config))
}

/// For each member on its own, whether it accepts a write from `config`.
async fn accepted_by(endpoints: &[String], config: &EtcdConfig) -> Result<Vec<bool>> {
    let mut accepted = Vec::new();
    for ep in endpoints {
        let mut kv = ClusterClient::connect(std::slice::from_ref(ep), config)
            .await?
            .kv();
        let put = tokio::time::timeout(Duration::from_secs(5), kv.put("probe", "v", None));
        accepted.push(matches!(put.await, Ok(Ok(_))));
    }
    Ok(accepted)
}

/// A client of the cluster that follows what the controller publishes: when
/// the trust bundle or the client identity changes, the writer on the old
/// credentials stops and one on the new credentials starts (each writes its
/// own prefix).
struct FollowingClient {
    current: Option<(AckedWriter, String, TlsMaterial)>,
    done: Vec<(String, WriteReport)>,
    /// Samples of the `Available` condition: (samples, not available).
    available: (u32, u32),
}

impl FollowingClient {
    async fn refresh(&mut self, world: &KubeWorld, name: &str) -> Result<()> {
        let available = get(world, name).await?.status.is_some_and(|s| {
            conditions::find(&s.conditions, "Available").is_some_and(|c| c.status == "True")
        });
        self.available.0 += 1;
        self.available.1 += u32::from(!available);
        let (endpoints, config) = etcd_of(world, "w1", name, 3).await?;
        let tls = config.tls.clone().context("TLS")?;
        if self.current.as_ref().is_some_and(|(_, _, t)| *t == tls) {
            return Ok(());
        }
        if let Some((writer, prefix, _)) = self.current.take() {
            self.done.push((prefix, writer.stop().await?));
        }
        let prefix = format!("rotation-{}", self.done.len());
        let writer = AckedWriter::start(endpoints, config, &prefix).await?;
        self.current = Some((writer, prefix, tls));
        Ok(())
    }

    async fn finish(mut self) -> Result<Vec<(String, WriteReport)>> {
        if let Some((writer, prefix, _)) = self.current.take() {
            self.done.push((prefix, writer.stop().await?));
        }
        Ok(self.done)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ca_rotation_under_a_writer_across_controller_restarts() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("vault", "w1", 3, "3.5.1"))?;
    converge_real(&mut ctl, &["vault"]).await?;
    wait_available(&world, "vault")?;
    put(&world, "w1", "vault", 3, "before-rotation").await?;
    let old = pki_of(&world, "vault").await?;

    let client = Arc::new(Mutex::new(FollowingClient {
        current: None,
        done: Vec::new(),
        available: (0, 0),
    }));
    client.lock().await.refresh(&world, "vault").await?;
    ask_rotation(&world, "vault", "r1")?;
    let started = Instant::now();
    let log = converge(
        &mut ctl,
        &[(NS, "vault")],
        Duration::from_secs(600),
        || {
            let (client, world) = (client.clone(), &world);
            async move { client.lock().await.refresh(world, "vault").await }
        },
        |_, _, ctl| {
            // The controller dies after every step; a new one takes over.
            ctl.restart();
            Ok(())
        },
    )
    .await?;
    let took = started.elapsed();
    let client = Arc::try_unwrap(client)
        .ok()
        .context("client still shared")?
        .into_inner();
    let available = client.available;
    let reports = client.finish().await?;

    // Every acknowledged write, on any credentials, is there.
    let (endpoints, config) = etcd_of(&world, "w1", "vault", 3).await?;
    let (mut acknowledged, mut failed) = (0, 0);
    for (prefix, report) in &reports {
        verify_acknowledged(report, &endpoints, &config, prefix).await?;
        acknowledged += report.acknowledged.len();
        failed += report.failed;
    }
    let kinds = step_kinds(&log, "vault");
    let restarts = kinds.iter().filter(|k| **k == "RestartMember").count();
    eprintln!(
        "ca rotation: {took:?}, {} steps ({restarts} member restarts), {acknowledged} writes \
         acknowledged over {} writers, 0 lost, {failed} not acknowledged; Available in {} of {} \
         samples",
        kinds.len(),
        reports.len(),
        available.0 - available.1,
        available.0
    );
    assert!(acknowledged > 10, "the writers kept writing: {reports:?}");
    // Available throughout, but for etcd's own elections.
    assert!(
        available.1 * 10 <= available.0,
        "Available in only {} of {} samples",
        available.0 - available.1,
        available.0
    );
    assert_eq!(reports.len(), 4, "old, bundle, new identity, new CA alone");
    let phases: Vec<&str> = kinds.iter().copied().filter(|k| k.contains("Ca")).collect();
    assert_eq!(
        phases,
        [
            "StartCaRotation",
            "GenerateNextCa",
            "PromoteNextCa",
            "DropPreviousCa",
            "CompleteCaRotation"
        ]
    );
    assert_eq!(restarts, 9, "three rolls of three members: {kinds:?}");

    let status = get(&world, "vault").await?.status.context("status")?;
    let record = status.ca_rotation.clone().context("caRotation")?;
    assert_eq!(
        (record.request_id.as_str(), record.phase.as_str()),
        ("r1", phase::COMPLETED)
    );
    let rotating = conditions::find(&status.conditions, CA_ROTATING).context("CARotating")?;
    assert_eq!(rotating.status, "False");

    let new = pki_of(&world, "vault").await?;
    assert_ne!(new.ca.cert_pem(), old.ca.cert_pem());
    assert!(new.next.is_none() && new.previous_ca_pem.is_none());
    let bundles: Api<ConfigMap> =
        Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let bundle = bundles.get("vault-etcd-ca-bundle").await?;
    assert_eq!(
        bundle
            .data
            .context("data")?
            .get("ca.crt")
            .map(String::as_str),
        Some(new.ca.cert_pem())
    );

    // The old CA is no longer accepted; the new one is.
    let (eps, refused) = client_from(&world, "vault", new.ca.cert_pem(), &old.ca).await?;
    assert_eq!(
        accepted_by(&eps, &refused).await?,
        [false; 3],
        "old CA accepted"
    );
    let (eps, accepted) = client_from(&world, "vault", new.ca.cert_pem(), &new.ca).await?;
    assert_eq!(
        accepted_by(&eps, &accepted).await?,
        [true; 3],
        "new CA refused"
    );
    read_everywhere(&world, "w1", "vault", 3, "before-rotation").await?;
    wait_available(&world, "vault")?;
    Ok(())
}

/// The template hash of the StatefulSet and of each member pod.
async fn template_hashes(world: &KubeWorld, name: &str) -> Result<Vec<String>> {
    let client = world.workload("w1").admin_client().await?;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), WORKLOAD_NS);
    let sts = sts.get(&format!("{name}-etcd")).await?;
    let template = sts.spec.template.metadata.context("meta")?;
    let mut hashes = vec![template_hash(&template)];
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, WORKLOAD_NS);
    for o in 0..3 {
        hashes.push(template_hash(
            &pods.get(&format!("{name}-etcd-{o}")).await?.metadata,
        ));
    }
    Ok(hashes)
}

fn template_hash(meta: &ObjectMeta) -> String {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get("etcdfleet.dev/template-hash"))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ca_rotation_cancelled_while_trusting_returns_to_the_old_ca() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("undo", "w1", 3, "3.5.1"))?;
    converge_real(&mut ctl, &["undo"]).await?;
    let old = pki_of(&world, "undo").await?;
    let before = template_hashes(&world, "undo").await?;

    ask_rotation(&world, "undo", "r1")?;
    let mut restarts = 0;
    let log = converge(
        &mut ctl,
        &[(NS, "undo")],
        Duration::from_secs(400),
        || async { Ok(()) },
        |_, step, _| {
            // Cancelled while the second member is rolled onto the bundle
            // (the first one runs on it already).
            if matches!(step, Step::RestartMember { .. }) {
                restarts += 1;
                if restarts == 2 {
                    ask_rotation(&world, "undo", "cancel")?;
                }
            }
            Ok(())
        },
    )
    .await?;
    let kinds = step_kinds(&log, "undo");
    eprintln!("ca rotation cancelled: {kinds:?}");
    let cancel = kinds.iter().position(|k| *k == "CancelCaRotation");
    let cancel = cancel.context("no CancelCaRotation")?;
    assert!(!kinds.contains(&"PromoteNextCa"), "{kinds:?}");
    assert!(
        kinds[cancel..].contains(&"RestartMember"),
        "a member on the bundle is rolled back: {kinds:?}"
    );

    let status = get(&world, "undo").await?.status.context("status")?;
    let record = status.ca_rotation.context("caRotation")?;
    assert_eq!(record.phase, phase::CANCELLED);
    let now = pki_of(&world, "undo").await?;
    assert_eq!(now.ca.cert_pem(), old.ca.cert_pem());
    assert_eq!(now.client_cert_pem, old.client_cert_pem, "nothing reissued");
    assert!(now.next.is_none() && now.previous_ca_pem.is_none());
    let secrets: Api<Secret> =
        Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    for name in ["undo-etcd-server-tls", "undo-etcd-peer-tls"] {
        let data = secrets.get(name).await?.data.context("data")?;
        let ca = data.get("ca.crt").map(|b| b.0.as_slice());
        assert_eq!(ca, Some(old.ca.cert_pem().as_bytes()), "{name}");
    }
    assert_eq!(
        template_hashes(&world, "undo").await?,
        before,
        "members as before"
    );
    let (eps, config) = client_from(&world, "undo", old.ca.cert_pem(), &old.ca).await?;
    assert_eq!(
        accepted_by(&eps, &config).await?,
        [true; 3],
        "old CA refused"
    );
    Ok(())
}

/// Creates the PKI Secret of cluster `name` with a CA valid `days` days;
/// returns the CA certificate.
async fn put_short_lived_pki(world: &KubeWorld, name: &str, days: u32) -> Result<String> {
    let ca = CertificateAuthority::generate_with_validity(&format!("etcdfleet {name}"), days)?;
    let client = ca.issue(&LeafSpec::client("etcdfleet-controller", days))?;
    let ca_pem = ca.cert_pem().to_string();
    let data = [
        ("ca.crt", ca.cert_pem().to_string()),
        ("ca.key", ca.key_pem().to_string()),
        ("client.crt", client.cert_pem),
        ("client.key", client.key_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-etcd-pki")),
            namespace: Some(NS.to_string()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(world.management.admin_client().await?, NS);
    api.create(&PostParams::default(), &secret).await?;
    Ok(ca_pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ca_rotation_starts_on_its_own_within_the_expiry_window() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut settings = real_settings();
    settings.ca_rotate_before = Some(Duration::from_secs(30 * 86400));
    let mut ctl = TestController::new(
        world.controller_client().await?,
        Arc::new(KubeconfigClientFactory::default()),
        DialerKind::PortForward.build(),
        settings,
    );
    let old_ca = put_short_lived_pki(&world, "aging", 20).await?;
    world.apply(&cluster_yaml("aging", "w1", 3, "3.5.1"))?;
    let log = converge(
        &mut ctl,
        &[(NS, "aging")],
        Duration::from_secs(600),
        || async { Ok(()) },
        no_hook,
    )
    .await?;
    let kinds = step_kinds(&log, "aging");
    assert!(kinds.contains(&"CompleteCaRotation"), "{kinds:?}");
    let record = get(&world, "aging")
        .await?
        .status
        .and_then(|s| s.ca_rotation)
        .context("caRotation")?;
    assert!(
        record.request_id.starts_with(EXPIRY_REQUEST_PREFIX),
        "{record:?}"
    );
    assert_eq!(record.phase, phase::COMPLETED);
    let new = pki_of(&world, "aging").await?;
    assert_ne!(new.ca.cert_pem(), old_ca);
    let left = remaining_validity(new.ca.cert_pem())?;
    assert!(left > Duration::from_secs(3000 * 86400), "{left:?}");
    // The new CA is far from expiry: nothing more to do.
    let again = converge_real(&mut ctl, &["aging"]).await?;
    ensure!(again.steps.is_empty(), "{:?}", again.steps);
    let (eps, config) = client_from(&world, "aging", new.ca.cert_pem(), &new.ca).await?;
    assert_eq!(accepted_by(&eps, &config).await?, [true; 3]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ca_rotation_recovers_a_lost_ca_secret_from_the_members_trust() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("lost", "w1", 3, "3.5.1"))?;
    converge_real(&mut ctl, &["lost"]).await?;
    put(&world, "w1", "lost", 3, "before-loss").await?;
    let old = pki_of(&world, "lost").await?;
    let secrets: Api<Secret> =
        Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let server = secrets
        .get("lost-etcd-server-tls")
        .await?
        .data
        .context("data")?;
    let text = |key: &str| String::from_utf8(server[key].0.clone());
    let (old_leaf, old_key) = (text("tls.crt")?, text("tls.key")?);

    // The Secret is lost; a controller that starts now refuses, and says how
    // to recover.
    let management: Api<Secret> = Api::namespaced(world.management.admin_client().await?, NS);
    management
        .delete("lost-etcd-pki", &Default::default())
        .await?;
    ctl.restart();
    let refused = ctl.reconcile(NS, "lost").await?;
    assert!(
        matches!(&refused, Outcome::Blocked(why) if why.contains("recover-ca")),
        "{refused:?}"
    );

    world.kubectl(&[
        "annotate",
        "-n",
        NS,
        "etcdcluster/lost",
        &format!("{RECOVER_CA_ANNOTATION}=r1"),
    ])?;
    let started = Instant::now();
    let log = converge(
        &mut ctl,
        &[(NS, "lost")],
        Duration::from_secs(600),
        || async { Ok(()) },
        |_, _, ctl| {
            ctl.restart();
            Ok(())
        },
    )
    .await?;
    let kinds = step_kinds(&log, "lost");
    eprintln!("ca recovery: {:?}: {kinds:?}", started.elapsed());
    let phases: Vec<&str> = kinds.iter().copied().filter(|k| k.contains("Ca")).collect();
    assert_eq!(
        phases,
        [
            "RecoverCa",
            "PromoteNextCa",
            "DropPreviousCa",
            "CompleteCaRotation"
        ]
    );
    let record = get(&world, "lost")
        .await?
        .status
        .and_then(|s| s.ca_rotation)
        .context("caRotation")?;
    assert_eq!(
        (record.request_id.as_str(), record.phase.as_str()),
        ("recover-r1", phase::COMPLETED)
    );
    let new = pki_of(&world, "lost").await?;
    assert!(new.ca.can_sign() && new.next.is_none() && new.previous_ca_pem.is_none());
    assert_ne!(new.ca.cert_pem(), old.ca.cert_pem());

    // The lost CA's certificates are refused; the new CA's accepted.
    let (eps, mut refused) = client_from(&world, "lost", new.ca.cert_pem(), &new.ca).await?;
    let accepted = refused.clone();
    if let Some(tls) = refused.tls.as_mut() {
        tls.client_cert_pem = Some(old_leaf);
        tls.client_key_pem = Some(old_key);
    }
    assert_eq!(
        accepted_by(&eps, &refused).await?,
        [false; 3],
        "lost CA accepted"
    );
    assert_eq!(
        accepted_by(&eps, &accepted).await?,
        [true; 3],
        "new CA refused"
    );
    read_everywhere(&world, "w1", "lost", 3, "before-loss").await?;
    Ok(())
}
