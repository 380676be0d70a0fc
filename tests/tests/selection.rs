//! Staged selection: dev, staging and prod management clusters (or shards of
//! one fleet) never reconcile each other's EtcdClusters. Two reconciler
//! Contexts with disjoint label selectors each reconcile every cluster in one
//! management API; each writes (finalizer, status) only its own clusters and
//! makes no API call at all about the other's.

use etcdfleet_tests::fleet::EtcdClusterKind;
use std::sync::{Arc, Mutex};

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
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use kube_fake_client::{ClientBuilder, interceptor};

/// One API call the fake management API saw: verb, namespace, object name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    verb: &'static str,
    namespace: String,
    name: String,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn name_of(object: &serde_json::Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .or_else(|| object["metadata"]["generateName"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Interceptors that record every call and let it through.
fn recorder(calls: &Calls) -> interceptor::Funcs {
    let rec = |calls: &Calls| {
        let calls = calls.clone();
        move |verb: &'static str, namespace: &str, name: String| {
            calls.lock().unwrap().push(Call {
                verb,
                namespace: namespace.to_string(),
                name,
            });
        }
    };
    let (c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11) = (
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
        rec(calls),
    );
    interceptor::Funcs::new()
        .get(move |ctx| {
            c1("get", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .list(move |ctx| {
            c2("list", ctx.namespace.unwrap_or(""), String::new());
            Ok(None)
        })
        .create(move |ctx| {
            c3("create", ctx.namespace, name_of(ctx.object));
            Ok(None)
        })
        .update(move |ctx| {
            c4("update", ctx.namespace, name_of(ctx.object));
            Ok(None)
        })
        .replace(move |ctx| {
            c5("replace", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .patch(move |ctx| {
            c6("patch", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .delete(move |ctx| {
            c7("delete", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .get_status(move |ctx| {
            c8("get_status", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .patch_status(move |ctx| {
            c9("patch_status", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .replace_status(move |ctx| {
            c10("replace_status", ctx.namespace, ctx.name.to_string());
            Ok(None)
        })
        .delete_collection(move |ctx| {
            c11(
                "delete_collection",
                ctx.namespace.unwrap_or(""),
                String::new(),
            );
            Ok(None)
        })
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
    calls: &Calls,
) -> Vec<(String, Outcome, Vec<Call>)> {
    let all: Vec<EtcdCluster> = Api::<EtcdCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 4);
    let mut out = Vec::new();
    for c in all {
        calls.lock().unwrap().clear();
        let outcome = reconcile_cluster(&c, ctx)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name_any()));
        let made = std::mem::take(&mut *calls.lock().unwrap());
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
    let calls: Calls = Arc::default();
    let client = ClientBuilder::new()
        .with_resource::<EtcdCluster>()
        .with_status_subresource::<EtcdClusterKind>()
        .with_resource::<Secret>()
        .with_resource::<k8s_openapi::api::events::v1::Event>()
        .with_resource::<k8s_openapi::api::core::v1::Event>()
        .with_object(cluster("dev-a", "team-a", "dev"))
        .with_object(cluster("prod-a", "team-a", "prod"))
        .with_object(cluster("dev-b", "team-b", "dev"))
        .with_object(cluster("prod-b", "team-b", "prod"))
        .with_interceptor_funcs(recorder(&calls))
        .build()
        .await
        .unwrap();
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
                    if WRITES.contains(&call.verb) {
                        assert!(
                            about(call, &name) || call.name.is_empty(),
                            "{stage} wrote something unrelated to {name}: {call:?}"
                        );
                    }
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
