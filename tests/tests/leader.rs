//! Lease leader election against a fake management API: one holder at a
//! time, takeover only after the lease expired (as this replica observed it),
//! immediate takeover after a release, and a holder that notices losing the
//! Lease.

use std::time::Duration;

use etcdfleet_controllers::config::LeaderElectionConfig;
use etcdfleet_controllers::leader::{Attempt, LeaderElector, LeaseLost};
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};

fn config() -> LeaderElectionConfig {
    LeaderElectionConfig {
        enabled: true,
        lease_name: "etcdfleet-controller".into(),
        lease_namespace: "etcdfleet-system".into(),
        lease_duration_seconds: 3,
        ..LeaderElectionConfig::default()
    }
}

/// The controller's client of a management API server with the shipped RBAC
/// (the leader-election Role grants get/create/update of Leases in
/// etcdfleet-system only).
async fn client() -> Client {
    server().await.client_as(CONTROLLER_USER)
}

/// The management API server itself, with the controller's namespace.
async fn server() -> ApiServer {
    let server = ApiServer::management().await.unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "etcdfleet-system"}}))
            .unwrap();
    Api::all(server.admin_client())
        .create(&Default::default(), &ns)
        .await
        .unwrap();
    server
}

async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "etcdfleet-system")
        .get("etcdfleet-controller")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_holder_and_takeover_only_after_expiry() {
    let client = client().await;
    let a = LeaderElector::new(client.clone(), &config(), "a".into());
    let b = LeaderElector::new(client.clone(), &config(), "b".into());

    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
    assert_eq!(holder(&client).await.as_deref(), Some("a"));
    assert_eq!(
        b.try_acquire_or_renew().await.unwrap(),
        Attempt::HeldBy("a".into())
    );
    // A renews; B, which saw the lease change, keeps waiting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
    assert_eq!(
        b.try_acquire_or_renew().await.unwrap(),
        Attempt::HeldBy("a".into())
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // 2s since B last saw a change: not expired yet.
    assert_eq!(
        b.try_acquire_or_renew().await.unwrap(),
        Attempt::HeldBy("a".into())
    );
    // A stops renewing; after the lease duration B takes over.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(b.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
    assert_eq!(holder(&client).await.as_deref(), Some("b"));
    let lease = Api::<Lease>::namespaced(client.clone(), "etcdfleet-system")
        .get("etcdfleet-controller")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));
    assert_eq!(
        a.try_acquire_or_renew().await.unwrap(),
        Attempt::HeldBy("b".into())
    );

    // A clean shutdown releases the lease: A takes it at once.
    b.release().await;
    assert_eq!(holder(&client).await, None);
    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
}

#[tokio::test]
async fn holder_notices_a_takeover() {
    let client = client().await;
    let a = LeaderElector::new(client.clone(), &config(), "a".into());
    a.acquire().await;
    assert_eq!(a.renew_interval(), Duration::from_secs(1));
    assert_eq!(a.renew_deadline(), Duration::from_secs(2));

    // Someone else writes itself in (e.g. after this replica was partitioned).
    let api = Api::<Lease>::namespaced(client.clone(), "etcdfleet-system");
    let mut lease = api.get("etcdfleet-controller").await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
    api.replace("etcdfleet-controller", &PostParams::default(), &lease)
        .await
        .unwrap();

    let lost = tokio::time::timeout(Duration::from_secs(5), a.hold())
        .await
        .expect("hold() returns once the lease is lost");
    assert!(
        matches!(&lost, LeaseLost::TakenOver { holder, .. } if holder == "intruder"),
        "{lost}"
    );
}

#[tokio::test]
async fn stale_writes_conflict() {
    let client = client().await;
    let a = LeaderElector::new(client.clone(), &config(), "a".into());
    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
    // Two replicas read the same version; only the first write may win.
    let api = Api::<Lease>::namespaced(client.clone(), "etcdfleet-system");
    let read = api.get("etcdfleet-controller").await.unwrap();
    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Leading);
    let mut stale = read.clone();
    stale.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let err = api
        .replace("etcdfleet-controller", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(e) if e.code == 409));
    assert_eq!(holder(&client).await.as_deref(), Some("a"));
}

/// A holder knows it lost the Lease by its renew deadline, even when the
/// last attempt before the deadline hangs (it is cut at the deadline), so
/// it is gone (`exit_grace` later) before others may see the Lease expire.
#[tokio::test]
async fn a_holder_gives_up_at_its_renew_deadline_even_when_the_last_attempt_hangs() {
    let server = server().await;
    let a = LeaderElector::new(server.client_as(CONTROLLER_USER), &config(), "a".into());
    a.acquire().await;
    let acquired = std::time::Instant::now();
    assert_eq!(a.exit_grace(), Duration::from_millis(500));
    // The first renewal (after 1 s) fails at once; the second, due at the
    // 2 s deadline, would hang for a whole renew interval.
    server.set_unavailable(CONTROLLER_USER, true);
    let hold = tokio::spawn(async move { a.hold().await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.set_unavailable(CONTROLLER_USER, false);
    server.set_hanging_writes(CONTROLLER_USER, true);
    let lost = tokio::time::timeout(Duration::from_secs(5), hold)
        .await
        .expect("hold() returns")
        .unwrap();
    let took = acquired.elapsed();
    assert!(matches!(lost, LeaseLost::RenewDeadline { .. }), "{lost}");
    // The deadline, plus scheduling slack; not the deadline plus a hung
    // attempt (3 s).
    assert!(took < Duration::from_millis(2500), "gave up after {took:?}");
}
