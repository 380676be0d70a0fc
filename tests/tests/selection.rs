//! Staged selection: dev, staging and prod management clusters (or shards of
//! one fleet) never reconcile each other's EtcdClusters. Two reconciler
//! Contexts with disjoint label selectors each reconcile every cluster in one
//! management API; each writes (finalizer, status) only its own clusters and
//! makes no API call at all about the other's.

use std::sync::Arc;

use etcdfleet_api::{EtcdCluster, EtcdClusterSpec};
use etcdfleet_controllers::config::ControllerConfig;
use etcdfleet_controllers::connector::{
    ConnectorSettings, KubeconfigClientFactory, WorkloadClusterConnector,
};
use etcdfleet_controllers::dialer::DirectDialer;
use etcdfleet_controllers::etcdcluster::{
    Context, FINALIZER, Outcome, ReconcilerSettings, reconcile_cluster,
};
use etcdfleet_controllers::metrics::Metrics;
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::fleet::OpRecorder;
use kube::api::PostParams;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// One API call the management API server saw: verb, namespace, object name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    verb: String,
    namespace: String,
    name: String,
}

fn cluster(name: &str, namespace: &str, stage: &str) -> EtcdCluster {
    let spec: EtcdClusterSpec = serde_json::from_value(serde_json::json!({
        // The kubeconfig Secret `<name>-kubeconfig` deliberately does not exist.
        "clusterRef": { "name": name },
        "version": "3.5.1",
        "replicas": 1,
    }))
    .unwrap();
    let mut c = EtcdCluster::new(name, spec);
    c.metadata.namespace = Some(namespace.to_string());
    c.metadata.labels = Some(
        [("etcdfleet.dev/stage".to_string(), stage.to_string())]
            .into_iter()
            .collect(),
    );
    c
}

fn context(client: &Client, selector: &str) -> Context {
    let config =
        ControllerConfig::from_yaml(&format!("labelSelector: \"{selector}\"\n"), "test config")
            .unwrap();
    let connector = WorkloadClusterConnector::new(
        client.clone(),
        Arc::new(KubeconfigClientFactory::default()),
        ConnectorSettings::default(),
    );
    Context::new(
        client.clone(),
        connector,
        Arc::new(DirectDialer),
        ReconcilerSettings::default(),
        Arc::new(Metrics::new()),
    )
    .with_owner_filter(Arc::new(move |c: &EtcdCluster| config.owns(c)))
}

const WRITES: &[&str] = &[
    "create",
    "update",
    "replace",
    "patch",
    "delete",
    "patch_status",
    "replace_status",
    "delete_collection",
];

/// Whether a recorded call is about the cluster `name` (the cluster itself,
/// its kubeconfig/PKI Secrets or its events, whose names start with it).
fn about(call: &Call, name: &str) -> bool {
    call.name == name
        || call.name.starts_with(&format!("{name}-"))
        || call.name.starts_with(&format!("{name}."))
}

/// Reconciles every cluster in the API with `ctx`; returns each outcome and
/// the calls made.
async fn reconcile_all(
    client: &Client,
    ctx: &Context,
    calls: &OpRecorder,
) -> Vec<(String, Outcome, Vec<Call>)> {
    let all: Vec<EtcdCluster> = Api::<EtcdCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 4);
    let mut out = Vec::new();
    for c in all {
        calls.clear();
        let outcome = reconcile_cluster(&c, ctx)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name_any()));
        let made = calls
            .ops()
            .into_iter()
            .map(|op| Call {
                verb: op.verb,
                namespace: op.namespace.unwrap_or_default(),
                name: op.name.unwrap_or_default(),
            })
            .collect();
        out.push((c.name_any(), outcome, made));
    }
    out
}

async fn get(client: &Client, namespace: &str, name: &str) -> EtcdCluster {
    Api::<EtcdCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap()
}

fn touched(c: &EtcdCluster) -> bool {
    c.finalizers().iter().any(|f| f == FINALIZER) || c.status.is_some()
}

#[tokio::test]
async fn disjoint_selectors_reconcile_disjoint_clusters() {
    // The management API server with the shipped RBAC; the controllers run
    // as the controller's ServiceAccount and every call they make is recorded.
    let server = ApiServer::management().await.unwrap();
    let admin = server.admin_client();
    for ns in ["team-a", "team-b"] {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        Api::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    for c in [
        cluster("dev-a", "team-a", "dev"),
        cluster("prod-a", "team-a", "prod"),
        cluster("dev-b", "team-b", "dev"),
        cluster("prod-b", "team-b", "prod"),
    ] {
        Api::<EtcdCluster>::namespaced(admin.clone(), &c.namespace().unwrap())
            .create(&PostParams::default(), &c)
            .await
            .unwrap();
    }
    let calls = OpRecorder::default();
    server.set_recorder(calls.clone());
    let client = server.client_as(CONTROLLER_USER);
    let namespace_of = |name: &str| {
        if name.ends_with("-a") {
            "team-a"
        } else {
            "team-b"
        }
    };

    let dev = context(&client, "etcdfleet.dev/stage=dev");
    // A selector of another syntax, still disjoint from dev's.
    let prod = context(&client, "etcdfleet.dev/stage in (prod)");

    for (stage, ctx, other) in [("dev", &dev, "prod"), ("prod", &prod, "dev")] {
        let results = reconcile_all(&client, ctx, &calls).await;
        for (name, outcome, made) in results {
            if name.starts_with(stage) {
                // Its own cluster: reconciled (and blocked on the missing kubeconfig).
                assert!(
                    matches!(&outcome, Outcome::Blocked(why) if why.contains(&format!("{name}-kubeconfig")) || why.contains("kubeconfig")),
                    "{stage} on {name}: {outcome:?}"
                );
                assert!(
                    made.iter().any(|c| c.verb == "patch" && c.name == name),
                    "{stage} should add its finalizer to {name}: {made:?}"
                );
                assert!(
                    made.iter()
                        .any(|c| (c.verb == "patch_status" || c.verb == "replace_status")
                            && c.name == name),
                    "{stage} should write the status of {name}: {made:?}"
                );
                assert!(
                    made.iter()
                        .any(|c| c.verb == "get" && c.name == format!("{name}-kubeconfig")),
                    "{stage} should read the kubeconfig Secret of {name}: {made:?}"
                );
                for call in &made {
                    assert!(
                        !call.name.starts_with(other),
                        "{stage} touched {other}'s object while reconciling {name}: {call:?}"
                    );
                    assert!(
                        !WRITES.contains(&call.verb.as_str())
                            || about(call, &name)
                            || call.name.is_empty(),
                        "{stage} wrote something unrelated to {name}: {call:?}"
                    );
                }
            } else {
                assert!(
                    matches!(&outcome, Outcome::Blocked(why) if why.starts_with("not owned by this controller")),
                    "{stage} on {name}: {outcome:?}"
                );
                assert!(
                    made.is_empty(),
                    "{stage} made calls for {name}, which it does not own: {made:?}"
                );
            }
        }
        // State: the other stage's clusters are exactly as they were.
        for name in ["dev-a", "dev-b", "prod-a", "prod-b"] {
            let c = get(&client, namespace_of(name), name).await;
            if name.starts_with(other) {
                let other_ran = stage == "prod";
                assert_eq!(
                    touched(&c),
                    other_ran,
                    "{name} after the {stage} controller ran"
                );
            } else {
                assert!(
                    touched(&c),
                    "{name} should carry {stage}'s finalizer and status"
                );
                assert!(c.finalizers().iter().any(|f| f == FINALIZER));
                assert!(c.status.is_some());
            }
        }
    }
}

#[test]
fn the_stage_configs_shipped_are_what_this_test_assumes() {
    // The selection rule is the one `config/stages/*` deploy: one label, one value each.
    for stage in ["dev", "staging", "prod"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../config/stages/{stage}/controller.yaml"));
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains(&format!("labelSelector: etcdfleet.dev/stage={stage}")));
    }
}
