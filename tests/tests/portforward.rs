//! Reaching etcd through `pods/portforward` (issue 12): the test world's
//! port-forward handler with kube's own client on the other side, then the
//! controller's port-forward dialer end to end on real etcd: lifecycle,
//! TLS verified through the tunnel, recovery from broken tunnels, and one
//! connection per member kept across polls.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use etcdfleet_controllers::connector::WorkloadCluster;
use etcdfleet_controllers::dialer::{self, EtcdDialer, PortForwardDialer};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, EtcdError};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::render::Names;
use etcdfleet_tests::driver::{TestController, fast_settings};
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};
use etcdfleet_tests::fleet::{Fleet, FleetPortForward};
use etcdfleet_tests::portforward::{PortForwardServer, serve};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, converge_all, create, etcd_of, get, patch_spec, put, read_everywhere,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port-forward server whose only pod, `ns/etcd-0`, is at 127.0.0.1.
async fn loopback_portforward() -> Result<(
    Arc<PortForwardServer>,
    etcdfleet_tests::portforward::ServedPortForward,
)> {
    let server = PortForwardServer::new(Arc::new(|ns: &str, pod: &str| {
        (ns == "ns" && pod == "etcd-0").then_some(std::net::Ipv4Addr::LOCALHOST)
    }));
    let served = serve(server.handler()).await?;
    Ok((server, served))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubes_portforward_client_reaches_a_real_etcd_through_the_served_handler() -> Result<()> {
    let Some(binary) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let etcd = LocalEtcdCluster::start(ClusterOptions::new(1, binary)).await?;
    let port = etcd.member(0).client_port;
    let (server, served) = loopback_portforward().await?;

    // Raw protocol first: kube's Portforwarder carries an HTTP/2 preface to
    // etcd and etcd's HTTP/2 settings frame comes back.
    let pods: Api<Pod> = Api::namespaced(served.client.clone(), "ns");
    let mut forwarder = pods.portforward("etcd-0", &[port]).await?;
    let mut stream = forwarder.take_stream(port).context("no stream")?;
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await?;
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head)).await??;
    assert_eq!(
        head[3], 0x04,
        "etcd answers with a SETTINGS frame: {head:?}"
    );
    drop(stream);

    // Then the controller's dialer: etcd calls work and share one tunnel.
    let dialer: Arc<dyn EtcdDialer> = Arc::new(PortForwardDialer::with_api(Arc::new({
        let client = served.client.clone();
        move |_: &WorkloadCluster| Some(client.clone())
    })));
    let workload = WorkloadCluster {
        server: served.url.clone(),
        client: served.client.clone(),
    };
    let config = EtcdConfig {
        transport: Some(dialer::transport(dialer, &workload)),
        ..EtcdConfig::default()
    };
    let before = server.tunnels_opened();
    let client =
        ClusterClient::connect(&[format!("http://etcd-0.peer.ns.svc:{port}")], &config).await?;
    client.kv().put("through", "the tunnel", None).await?;
    let members = client.list_members().await?;
    assert_eq!(members.len(), 1);
    let got = client.kv().get("through", None).await?;
    assert_eq!(got.kvs()[0].value(), b"the tunnel");
    assert_eq!(
        server.tunnels_opened() - before,
        1,
        "every call rides one tunnel"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_is_missing_or_not_listening_fails_the_call_instead_of_hanging() -> Result<()> {
    let (_server, served) = loopback_portforward().await?;
    let dialer: Arc<dyn EtcdDialer> = Arc::new(PortForwardDialer::with_api(Arc::new({
        let client = served.client.clone();
        move |_: &WorkloadCluster| Some(client.clone())
    })));
    let workload = WorkloadCluster {
        server: served.url.clone(),
        client: served.client.clone(),
    };
    let config = EtcdConfig {
        transport: Some(dialer::transport(dialer, &workload)),
        ..EtcdConfig::default()
    };
    // Port 1: the pod exists but nothing listens; etcd-9: no such pod.
    for url in [
        "http://etcd-0.peer.ns.svc:1",
        "http://etcd-9.peer.ns.svc:2379",
    ] {
        let client = ClusterClient::connect(&[url.to_string()], &config).await?;
        let started = std::time::Instant::now();
        let result = client.list_members().await;
        assert!(
            matches!(
                result,
                Err(EtcdError::Unreachable(_) | EtcdError::Timeout { .. })
            ),
            "{url}: {result:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{url}: took {:?}",
            started.elapsed()
        );
    }
    Ok(())
}

/// A controller reaching etcd only through port-forward tunnels.
fn tunnel_controller(fleet: &Fleet, pf: &FleetPortForward) -> TestController {
    TestController::new(
        fleet.management(),
        fleet.client_factory(),
        pf.dialer.clone(),
        fast_settings(),
    )
}

/// Workload `a` with cluster `etcd-a` of `replicas` 3.5 members, converged
/// by a controller that reaches etcd only through tunnels.
async fn converged_through_tunnels(
    replicas: i32,
) -> Result<(Fleet, FleetPortForward, TestController)> {
    let fleet = Fleet::new(&["a"]).await?;
    let pf = FleetPortForward::new(&fleet).await?;
    let mut ctl = tunnel_controller(&fleet, &pf);
    create(&fleet, &cluster("etcd-a", "a", replicas, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    Ok((fleet, pf, ctl))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_through_port_forward_creates_scales_and_keeps_data() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, pf, mut ctl) = converged_through_tunnels(3).await?;
    let status = get(&fleet, "etcd-a").await?.status.context("status")?;
    assert_eq!(status.ready_members, 3, "{status:#?}");
    assert!(
        pf.tunnels_opened() >= 3,
        "members were reached through tunnels"
    );
    put(&fleet, "a", "etcd-a", 3, "tunnelled").await?;

    etcdfleet_tests::scenario::set_replicas(&fleet, "etcd-a", 5).await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    read_everywhere(&fleet, "a", "etcd-a", 5, "tunnelled").await?;
    assert_eq!(
        get(&fleet, "etcd-a").await?.status.unwrap().ready_members,
        5
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_through_the_tunnel_is_verified_against_the_client_service_name() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, pf, _ctl) = converged_through_tunnels(1).await?;

    let (_, config) = etcd_of(&fleet, "a", "etcd-a", 1).await?;
    let names =
        etcdfleet_controllers::render::Names::new("etcd-a", etcdfleet_tests::scenario::WORKLOAD_NS);
    let workload = WorkloadCluster {
        server: fleet.server_url("a"),
        client: fleet.served_workload_client("a").await?,
    };
    let dialer: Arc<dyn EtcdDialer> = pf.dialer.clone();
    let through = |config: EtcdConfig| EtcdConfig {
        transport: Some(dialer::transport(dialer.clone(), &workload)),
        ..config
    };
    let url = names.client_url(0, true);

    let good = ClusterClient::connect(std::slice::from_ref(&url), &through(config.clone())).await?;
    assert_eq!(good.list_members().await?.len(), 1);

    let mut wrong = config.clone();
    if let Some(tls) = wrong.tls.as_mut() {
        tls.server_name = Some("not-the-etcd-service.example".into());
    }
    let bad = ClusterClient::connect(std::slice::from_ref(&url), &through(wrong)).await?;
    let result = bad.list_members().await;
    assert!(
        matches!(result, Err(EtcdError::Tls(_))),
        "a wrong server name must fail TLS verification: {result:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tunnel_broken_mid_reconcile_recovers_without_replacing_members() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, pf, ctl) = converged_through_tunnels(3).await?;
    let members_before: Vec<_> = get(&fleet, "etcd-a").await?.status.unwrap().members;

    // Cut every tunnel while a reconcile is under way, then a few more times.
    // (The reconcile under way may already redial: count from before the cut.)
    let opened_before = pf.tunnels_opened();
    let reconcile = ctl.reconcile(NS, "etcd-a");
    let cut = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        pf.break_tunnels();
    };
    let (first, ()) = tokio::join!(reconcile, cut);
    eprintln!("reconcile during the cut: {first:?}");
    let mut outcome = None;
    for _ in 0..10 {
        fleet.sync_all().await?;
        match ctl.reconcile(NS, "etcd-a").await {
            Ok(Outcome::Converged) => {
                outcome = Some(Outcome::Converged);
                break;
            }
            other => {
                eprintln!("after the cut: {other:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    assert_eq!(outcome, Some(Outcome::Converged), "the controller recovers");
    assert!(
        pf.tunnels_opened() > opened_before,
        "new tunnels replaced the broken ones"
    );
    let members_after = get(&fleet, "etcd-a").await?.status.unwrap().members;
    let ids = |m: &[etcdfleet_api::MemberStatus]| {
        let mut ids: Vec<_> = m.iter().map(|m| m.id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(
        ids(&members_before),
        ids(&members_after),
        "no member replaced"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_converged_cluster_holds_no_connection_between_polls_and_one_per_member_during_each()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, pf, _ctl) = converged_through_tunnels(3).await?;

    // A fresh controller (empty pool) polling a converged cluster N times:
    // each poll reaches every member through one tunnel, shared by all of
    // that poll's calls, and lets go of them when it ends.
    let ctl = tunnel_controller(&fleet, &pf);
    let before = pf.tunnels_opened();
    const POLLS: u64 = 4;
    for poll in 1..=POLLS {
        assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
        assert!(
            ctl.ctx.etcd_clients.is_empty(),
            "poll {poll}: no etcd client is held once the cluster is at rest"
        );
        assert_eq!(
            pf.tunnels_opened() - before,
            3 * poll,
            "poll {poll}: one tunnel per member"
        );
    }
    assert_eq!(ctl.ctx.etcd_clients.clients_built(), POLLS);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_whose_pod_is_going_is_reached_afresh_at_each_poll_while_the_others_are_kept()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, pf, ctl) = converged_through_tunnels(3).await?;
    // Pod 2 being deleted while its etcd still runs: the moment between a
    // delete and the kubelet's SIGTERM (no runtime sync runs in this test; a
    // finalizer keeps the pod as a kubelet would until its process ended).
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let going = Names::new("etcd-a", WORKLOAD_NS).pod(2);
    let hold = serde_json::json!({ "metadata": { "finalizers": ["test.etcdfleet.dev/hold"] } });
    pods.patch(&going, &PatchParams::default(), &Patch::Merge(&hold))
        .await?;
    pods.delete(&going, &Default::default()).await?;
    // An operation in flight: a patch release, whose roll waits for the pod.
    patch_spec(&fleet, "etcd-a", serde_json::json!({ "version": "3.5.35" })).await?;
    let mut opened = Vec::new();
    for _ in 0..3 {
        let before = pf.tunnels_opened();
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        assert!(!outcome.is_at_rest(), "in flight: {outcome:?}");
        opened.push(pf.tunnels_opened() - before);
    }
    // Members 0 and 1 stay pooled between the polls of an operation in
    // flight; member 2 is reached on a new tunnel at each poll and let go
    // after it, so no connection of ours holds its shutdown back.
    assert_eq!(opened, [3, 1, 1], "tunnels opened per poll");
    Ok(())
}
