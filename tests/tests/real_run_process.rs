//! `etcdfleet run` as a process on real Kubernetes, under exactly the RBAC
//! the dev stage ships (its ServiceAccount's token, its ConfigMap): it
//! converges a cluster through port-forward, and the API servers' audit
//! logs show every request it made allowed, and no write once converged.
//! Its workload credential is the README's: a token of the workload bundle's
//! ServiceAccount made with `kubectl -n etcd-system create token etcdfleet
//! --duration=8760h`, in the kubeconfig Secret. The bundle's Role
//! (`config/workload-rbac`) is all that identity had, and it allows nothing
//! outside the etcd namespace, for the ServiceAccount as for the User the
//! rest of the real tier uses.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_tests::control_plane::AuditLog;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, installed_world, put, read_everywhere, wait_ready_members,
};
use etcdfleet_tests::control_plane::{KubeWorld, client_from_kubeconfig};
use etcdfleet_tests::controller_process::ControllerProcess;

const CONTROLLER: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-controller";
/// The workload bundle's ServiceAccount, as the workload API server names it.
const WORKLOAD_SA: &str = "system:serviceaccount:etcd-system:etcdfleet";
/// The User the rest of the real tier's kubeconfig Secrets carry.
const WORKLOAD_USER: &str = "etcdfleet-controller";

fn refused(log: &AuditLog, user: &str) -> Vec<String> {
    log.by(user)
        .into_iter()
        .filter(|e| e.code() == 401 || e.code() == 403)
        .map(ToString::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_run_process_under_the_shipped_rbac_converges_with_every_request_allowed() -> Result<()>
{
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let sa_token = use_the_service_account_token(&world).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, world.installed_controller_config()?)?;
    let kubeconfig = world
        .management
        .kubeconfig_with_token(&world.controller_token().await?);
    let config_arg = config.display().to_string();
    let p = ControllerProcess::start(
        "real-run",
        &kubeconfig,
        &[
            "--config",
            &config_arg,
            "--log-format",
            "text",
            "--requeue-converged-seconds",
            "2",
        ],
    );
    p.wait_for_status("/readyz", 200, Duration::from_secs(60));
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    wait_ready_members(&world, "shop", 3).with_context(|| p.log())?;
    put(&world, "w1", "shop", 3, "k").await?;
    read_everywhere(&world, "w1", "shop", 3, "k").await?;

    // Converged: a few polls (2 s each) write nothing anywhere.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let workload = &world.workload("w1").plane;
    let (m0, w0) = (world.management.audit()?.len(), workload.audit()?.len());
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (management, workload_log) = (world.management.audit()?, workload.audit()?);
    let writes: Vec<String> = management
        .by_since(CONTROLLER, m0)
        .into_iter()
        .chain(workload_log.by_since(WORKLOAD_SA, w0))
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(ToString::to_string)
        .collect();
    let reads = workload_log
        .by_since(WORKLOAD_SA, w0)
        .iter()
        .filter(|e| e.is_read())
        .count();
    eprintln!(
        "converged for {:?}: {} writes, {reads} workload reads",
        quiet.elapsed(),
        writes.len()
    );
    ensure!(
        writes.is_empty(),
        "writes of a converged cluster: {writes:#?}"
    );

    // Every request of the run, on both API servers, was allowed.
    assert!(
        !management.by(CONTROLLER).is_empty(),
        "the controller used its own identity"
    );
    assert!(
        workload_log
            .by(WORKLOAD_SA)
            .iter()
            .any(|e| e.resource() == "pods/portforward"),
        "etcd was reached through pods/portforward"
    );
    assert_eq!(refused(&management, CONTROLLER), Vec::<String>::new());
    assert_eq!(refused(&workload_log, WORKLOAD_SA), Vec::<String>::new());
    let plane = &world.workload("w1").plane;
    confined_to_the_etcd_namespace(plane.client_as(WORKLOAD_USER).await?, WORKLOAD_USER).await?;
    let sa = client_from_kubeconfig(&plane.kubeconfig_with_token(&sa_token)).await?;
    confined_to_the_etcd_namespace(sa, WORKLOAD_SA).await
}

/// The README's credential, made with kubectl alone: a token of the workload
/// bundle's ServiceAccount, put into the kubeconfig Secret of `w1` in place
/// of the test world's User. Returns the token.
async fn use_the_service_account_token(world: &KubeWorld) -> Result<String> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    let token = world.kubectl_workload(
        "w1",
        &[
            "-n",
            "etcd-system",
            "create",
            "token",
            "etcdfleet",
            "--duration=8760h",
        ],
    )?;
    let token = token.trim().to_string();
    let kubeconfig = world.workload("w1").plane.kubeconfig_with_token(&token);
    let patch = serde_json::json!({ "stringData": { "value": kubeconfig } });
    Api::<Secret>::namespaced(world.management.admin_client().await?, NS)
        .patch(
            "w1-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(token)
}

/// Whether `result` is the API server's 403.
fn forbidden<T>(result: kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(e)) if e.code == 403)
}

/// A workload identity of config/workload-rbac (`who`, using `client`) can
/// do nothing outside the etcd namespace: no Secret, Pod or namespace
/// elsewhere, no namespace list or create, nothing cluster-wide.
async fn confined_to_the_etcd_namespace(client: kube::Client, who: &str) -> Result<()> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
    use kube::api::{Api, ListParams, PostParams};
    let namespaces: Api<Namespace> = Api::all(client.clone());
    ensure!(
        namespaces.get("etcd-system").await.is_ok(),
        "{who}: its own namespace"
    );
    ensure!(
        Api::<StatefulSet>::namespaced(client.clone(), "etcd-system")
            .get("shop-etcd")
            .await
            .is_ok(),
        "{who}: the etcd StatefulSet"
    );
    let lp = ListParams::default();
    let outside = [
        (
            "get namespace default",
            forbidden(namespaces.get("default").await),
        ),
        ("list namespaces", forbidden(namespaces.list(&lp).await)),
        (
            "create a namespace",
            forbidden(
                namespaces
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(serde_json::json!({
                            "metadata": { "name": "not-etcd" }
                        }))?,
                    )
                    .await,
            ),
        ),
        (
            "get a Secret in kube-system",
            forbidden(
                Api::<Secret>::namespaced(client.clone(), "kube-system")
                    .get("x")
                    .await,
            ),
        ),
        (
            "list Secrets in etcd-system",
            forbidden(
                Api::<Secret>::namespaced(client.clone(), "etcd-system")
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list Nodes",
            forbidden(Api::<Node>::all(client.clone()).list(&lp).await),
        ),
        (
            "list Pods in default",
            forbidden(
                Api::<Pod>::namespaced(client.clone(), "default")
                    .list(&lp)
                    .await,
            ),
        ),
    ];
    let allowed: Vec<&str> = outside
        .iter()
        .filter(|(_, f)| !f)
        .map(|(w, _)| *w)
        .collect();
    ensure!(allowed.is_empty(), "{who} may {allowed:?}");
    Ok(())
}
