//! The end-to-end test world itself: the workload runtime runs a hand-written
//! StatefulSet (shaped like the one the controller renders) as real etcd
//! 3.5.1 processes, and the fleet wires clients, names, recording and faults.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use etcdfleet_controllers::connector::{ConnectError, KubeconfigLocation, check_kubeconfig};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, KubeconfigFault};
use etcdfleet_tests::runtime::WorkloadRuntime;
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "kube-system";
const STS: &str = "c-etcd";
const PEER_SERVICE: &str = "c-etcd-peer";
const IMAGE: &str = "gcr.io/etcd-development/etcd:v3.5.1";

fn peer_url(pod: &str) -> String {
    format!("http://{pod}.{PEER_SERVICE}.{NS}.svc:2380")
}

fn client_url(pod: &str) -> String {
    format!("http://{pod}.{PEER_SERVICE}.{NS}.svc:2379")
}

fn initial_cluster(members: usize) -> String {
    (0..members)
        .map(|i| format!("{STS}-{i}={}", peer_url(&format!("{STS}-{i}"))))
        .collect::<Vec<_>>()
        .join(",")
}

/// The StatefulSet the controller will render, by hand.
fn etcd_statefulset(replicas: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": STS, "namespace": NS },
        "spec": {
            "replicas": replicas,
            "serviceName": PEER_SERVICE,
            "podManagementPolicy": "Parallel",
            "updateStrategy": { "type": "OnDelete" },
            "selector": { "matchLabels": { "app.kubernetes.io/instance": STS } },
            "template": {
                "metadata": {
                    "labels": { "app.kubernetes.io/instance": STS },
                    "annotations": { "etcdfleet.dev/inputs-hash": "abc123" },
                },
                "spec": {
                    "containers": [{
                        "name": "etcd",
                        "image": IMAGE,
                        "command": ["etcd"],
                        "args": [
                            "--name=$(POD_NAME)",
                            "--data-dir=/var/lib/etcd/data",
                            "--listen-client-urls=http://0.0.0.0:2379",
                            "--listen-peer-urls=http://0.0.0.0:2380",
                            "--listen-metrics-urls=http://0.0.0.0:2381",
                            format!("--advertise-client-urls=http://$(POD_NAME).{PEER_SERVICE}.$(POD_NAMESPACE).svc:2379"),
                            format!("--initial-advertise-peer-urls=http://$(POD_NAME).{PEER_SERVICE}.$(POD_NAMESPACE).svc:2380"),
                            "--initial-cluster-token=c-etcd",
                            "--heartbeat-interval=50",
                            "--election-timeout=500",
                        ],
                        "env": [
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                            { "name": "ETCD_INITIAL_CLUSTER", "valueFrom": { "configMapKeyRef": { "name": "c-etcd-config", "key": "initial-cluster" } } },
                            { "name": "ETCD_INITIAL_CLUSTER_STATE", "valueFrom": { "configMapKeyRef": { "name": "c-etcd-config", "key": "initial-cluster-state" } } },
                        ],
                        "ports": [{ "name": "client", "containerPort": 2379 }, { "name": "peer", "containerPort": 2380 }],
                        "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/etcd" }],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    }))
    .expect("valid StatefulSet")
}

async fn put_config(client: &Client, members: usize, state: &str) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), NS);
    let data =
        json!({ "initial-cluster": initial_cluster(members), "initial-cluster-state": state });
    if api.get_opt("c-etcd-config").await?.is_some() {
        api.patch(
            "c-etcd-config",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": data })),
        )
        .await?;
    } else {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "c-etcd-config", "namespace": NS },
            "data": data,
        }))?;
        api.create(&PostParams::default(), &cm).await?;
    }
    Ok(())
}

async fn deploy(client: &Client, replicas: i32) -> Result<()> {
    put_config(client, replicas as usize, "new").await?;
    Api::<StatefulSet>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &etcd_statefulset(replicas))
        .await?;
    Ok(())
}

async fn scale(client: &Client, replicas: i32) -> Result<()> {
    Api::<StatefulSet>::namespaced(client.clone(), NS)
        .patch(
            STS,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
        )
        .await?;
    Ok(())
}

async fn etcd_client(fleet: &Fleet, cluster: &str, pod: &str) -> Result<etcd_client::Client> {
    let url = fleet
        .dialer()
        .dial_url(&fleet.server_url(cluster), &client_url(pod))
        .map_err(anyhow::Error::msg)?;
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Ok(etcd_client::Client::connect([url], Some(options)).await?)
}

async fn get_value(client: &mut etcd_client::Client, key: &str) -> Result<Option<String>> {
    let resp = client.get(key, None).await?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| kv.value_str().unwrap_or_default().to_string()))
}

async fn pod(client: &Client, name: &str) -> Result<Pod> {
    Ok(Api::<Pod>::namespaced(client.clone(), NS).get(name).await?)
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(-1)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|c| c.ready)
}

/// Syncs until `check` holds for pod `name`, or fails with the pod's log.
async fn sync_until(
    runtime: &WorkloadRuntime,
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        runtime.sync().await?;
        if let Some(p) = Api::<Pod>::namespaced(client.clone(), NS)
            .get_opt(name)
            .await?
            && check(&p)
        {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            bail!(
                "pod {name}: {what} not reached\n{}",
                runtime.pod_log_tail(NS, name, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `member add` with retries (etcd refuses while a member is fresh).
async fn member_add(client: &mut etcd_client::Client, pod: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.member_add([peer_url(pod)], None).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "member add refused, retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e).context("member add"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_runs_real_etcd_pods_that_survive_restarts_and_scale() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["alpha"]).await?;
    let runtime = fleet.runtime("alpha");
    let kube = fleet.workload_client("alpha");
    deploy(&kube, 1).await?;
    runtime
        .wait_statefulsets_ready(Duration::from_secs(30))
        .await?;

    // The pod is Running and ready in the API, with its IP, and its name
    // resolves to that IP in this cluster.
    let p0 = pod(&kube, "c-etcd-0").await?;
    let status = p0.status.clone().unwrap_or_default();
    let ip = runtime.pod_ip(NS, "c-etcd-0").expect("pod has an IP");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(is_ready(&p0), "pod not ready: {status:?}");
    assert_eq!(status.pod_ip.as_deref(), Some(ip.to_string().as_str()));
    assert_eq!(
        runtime.resolve(&format!("c-etcd-0.{PEER_SERVICE}.{NS}.svc")),
        Some(ip)
    );
    assert_eq!(
        runtime.resolve(&format!("c-etcd-0.{PEER_SERVICE}.{NS}.svc.cluster.local")),
        Some(ip)
    );
    let spec = p0.spec.clone().unwrap_or_default();
    assert_eq!(spec.hostname.as_deref(), Some("c-etcd-0"));
    assert_eq!(spec.subdomain.as_deref(), Some(PEER_SERVICE));
    assert_eq!(
        p0.metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.as_str()),
        Some("StatefulSet")
    );
    assert_eq!(
        p0.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("etcdfleet.dev/inputs-hash"))
            .map(String::as_str),
        Some("abc123")
    );

    // etcd itself: it advertises its in-cluster name (which only its private
    // /etc/hosts resolves) and answers through the dialer.
    let mut etcd = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    etcd.put("greeting", "hello", None).await?;
    assert_eq!(
        get_value(&mut etcd, "greeting").await?.as_deref(),
        Some("hello")
    );
    let members = etcd.member_list().await?;
    assert_eq!(members.members()[0].client_urls(), [client_url("c-etcd-0")]);
    // Its data dir is the PVC's host directory, mounted at /var/lib/etcd.
    assert!(
        runtime
            .pvc_dir(NS, "data-c-etcd-0")
            .join("data/member")
            .is_dir()
    );

    // A killed process is restarted by the kubelet.
    runtime.kill_pod_process(NS, "c-etcd-0").await?;
    let p = sync_until(runtime, &kube, "c-etcd-0", "restarted and ready", |p| {
        restart_count(p) == 1 && is_ready(p)
    })
    .await?;
    assert_eq!(
        p.metadata.uid, p0.metadata.uid,
        "same pod, restarted container"
    );
    let mut etcd = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    assert_eq!(
        get_value(&mut etcd, "greeting").await?.as_deref(),
        Some("hello")
    );

    // A deleted Pod object is recreated (OnDelete) on the same PVC: data survives.
    Api::<Pod>::namespaced(kube.clone(), NS)
        .delete("c-etcd-0", &DeleteParams::default())
        .await?;
    let old_uid = p0.metadata.uid.clone();
    let p = sync_until(runtime, &kube, "c-etcd-0", "recreated and ready", |p| {
        p.metadata.uid != old_uid && is_ready(p)
    })
    .await?;
    assert_eq!(restart_count(&p), 0);
    assert_eq!(
        runtime.pod_ip(NS, "c-etcd-0"),
        Some(ip),
        "IP is stable per pod name"
    );
    let mut etcd = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    assert_eq!(
        get_value(&mut etcd, "greeting").await?.as_deref(),
        Some("hello")
    );

    // Scale 1 → 3 the etcd way: member add, then start the pod with state existing.
    for members in 2..=3usize {
        let pod_name = format!("{STS}-{}", members - 1);
        member_add(&mut etcd, &pod_name).await?;
        put_config(&kube, members, "existing").await?;
        scale(&kube, members as i32).await?;
        runtime
            .wait_statefulsets_ready(Duration::from_secs(30))
            .await?;
        let mut new_member = etcd_client(&fleet, "alpha", &pod_name).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match get_value(&mut new_member, "greeting").await {
                Ok(v) => {
                    assert_eq!(v.as_deref(), Some("hello"));
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "new member not serving yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.context(format!("{pod_name} never served the key"))),
            }
        }
    }
    assert_eq!(etcd.member_list().await?.members().len(), 3);
    assert_eq!(runtime.process_count().await, 3);
    let sts = Api::<StatefulSet>::namespaced(kube.clone(), NS)
        .get(STS)
        .await?;
    let sts_status = sts.status.clone().unwrap_or_default();
    assert_eq!(
        (sts_status.replicas, sts_status.ready_replicas),
        (3, Some(3))
    );
    assert_eq!(sts_status.observed_generation, sts.metadata.generation);

    // Scale down: the highest pod goes, its PVC stays.
    scale(&kube, 2).await?;
    runtime.sync().await?;
    let pods = Api::<Pod>::namespaced(kube.clone(), NS)
        .list(&ListParams::default())
        .await?;
    let mut names: Vec<String> = pods
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["c-etcd-0", "c-etcd-1"]);
    assert_eq!(runtime.process_count().await, 2);
    let pvc_api = Api::<PersistentVolumeClaim>::namespaced(kube.clone(), NS);
    assert!(
        pvc_api.get_opt("data-c-etcd-2").await?.is_some(),
        "PVC is retained"
    );
    assert!(
        runtime
            .pvc_dir(NS, "data-c-etcd-2")
            .join("data/member")
            .is_dir()
    );

    runtime.shutdown().await;
    assert_eq!(runtime.process_count().await, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_pvc_restarts_the_member_on_an_empty_data_dir() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["alpha"]).await?;
    let runtime = fleet.runtime("alpha");
    let kube = fleet.workload_client("alpha");
    deploy(&kube, 1).await?;
    runtime
        .wait_statefulsets_ready(Duration::from_secs(30))
        .await?;
    let mut etcd = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    etcd.put("k", "v", None).await?;

    runtime.wipe_pvc(NS, "data-c-etcd-0").await?;
    sync_until(
        runtime,
        &kube,
        "c-etcd-0",
        "restarted on a wiped disk",
        |p| restart_count(p) == 1 && is_ready(p),
    )
    .await?;
    // A single-member "new" cluster bootstraps afresh: the key is gone.
    let mut etcd = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let value = loop {
        match get_value(&mut etcd, "k").await {
            Ok(v) => break v,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => return Err(e),
        }
    };
    assert_eq!(value, None, "data was lost with the disk");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workload_clusters_with_identical_pod_names_do_not_collide() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["alpha", "beta"]).await?;
    for name in ["alpha", "beta"] {
        deploy(&fleet.workload_client(name), 1).await?;
    }
    let (a, b) = tokio::join!(
        fleet
            .runtime("alpha")
            .wait_statefulsets_ready(Duration::from_secs(30)),
        fleet
            .runtime("beta")
            .wait_statefulsets_ready(Duration::from_secs(30)),
    );
    a?;
    b?;
    fleet.sync_all().await?;

    let ip_a = fleet.runtime("alpha").pod_ip(NS, "c-etcd-0").unwrap();
    let ip_b = fleet.runtime("beta").pod_ip(NS, "c-etcd-0").unwrap();
    assert_ne!(ip_a, ip_b);
    let dialer = fleet.dialer();
    let url_a = dialer
        .dial_url(&fleet.server_url("alpha"), &client_url("c-etcd-0"))
        .unwrap();
    let url_b = dialer
        .dial_url(&fleet.server_url("beta"), &client_url("c-etcd-0"))
        .unwrap();
    assert_eq!(url_a, format!("http://{ip_a}:2379"));
    assert_eq!(url_b, format!("http://{ip_b}:2379"));
    assert!(
        dialer
            .dial_url(
                "https://nowhere.workload.test:6443",
                &client_url("c-etcd-0")
            )
            .is_err()
    );
    assert!(
        dialer
            .dial_url(&fleet.server_url("alpha"), "http://unknown-pod.x.svc:2379")
            .is_err()
    );

    let mut etcd_a = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    let mut etcd_b = etcd_client(&fleet, "beta", "c-etcd-0").await?;
    etcd_a.put("who", "alpha", None).await?;
    etcd_b.put("who", "beta", None).await?;
    assert_eq!(
        get_value(&mut etcd_a, "who").await?.as_deref(),
        Some("alpha")
    );
    assert_eq!(
        get_value(&mut etcd_b, "who").await?.as_deref(),
        Some("beta")
    );
    // (The two clusters have the same etcd cluster ID: it derives from the
    // identical member names, peer URLs and token, as it would on real pods.)
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_sees_the_controller_calls_and_outages_fail_them() -> Result<()> {
    let fleet = Fleet::new(&["alpha", "beta"]).await?;
    let ns = fleet.namespace().to_string();

    // The factory builds a client from the kubeconfig, over HTTPS to the
    // workload's API server.
    let secret = Api::<Secret>::namespaced(fleet.management(), &ns)
        .get("alpha-kubeconfig")
        .await?;
    let text = String::from_utf8(secret.data.unwrap()["value"].0.clone())?;
    let location = KubeconfigLocation {
        namespace: ns.clone(),
        secret_name: "alpha-kubeconfig".into(),
        key: "value".into(),
    };
    let (kubeconfig, server) = check_kubeconfig(&location, &text)?;
    assert_eq!(server, fleet.server_url("alpha"));
    let factory = fleet.client_factory();
    use etcdfleet_controllers::connector::WorkloadClientFactory;
    let alpha = factory
        .build(&kubeconfig, &server)
        .await
        .map_err(anyhow::Error::msg)?;
    let Err(err) = factory
        .build(&kubeconfig, "https://gamma.workload.test:6443")
        .await
    else {
        panic!("an unknown server must not get a client");
    };
    assert!(err.contains("gamma.workload.test"), "{err}");

    // In the etcd namespace, the only one the workload identity's Role
    // (config/workload-rbac) grants anything in.
    let cm: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "x", "namespace": WORKLOAD_NS } }))?;
    Api::<ConfigMap>::namespaced(alpha.clone(), WORKLOAD_NS)
        .create(&PostParams::default(), &cm)
        .await?;
    Api::<Pod>::namespaced(alpha.clone(), WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    // The runtime and the test's own client are not recorded.
    fleet.sync_all().await?;
    Api::<Pod>::namespaced(fleet.workload_client("alpha"), WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;

    let ops = fleet.ops();
    let summary: Vec<(String, String, String, Option<String>)> = ops
        .iter()
        .map(|o| {
            (
                o.cluster.clone(),
                o.verb.clone(),
                o.resource.clone(),
                o.name.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "management".into(),
                "get".into(),
                "secrets".into(),
                Some("alpha-kubeconfig".into())
            ),
            ("alpha".into(), "create".into(), "configmaps".into(), None),
            ("alpha".into(), "list".into(), "pods".into(), None),
        ],
        "{}",
        fleet.ops_report()
    );
    assert_eq!(fleet.writes().len(), 1);
    assert!(fleet.secret_lists_or_watches().is_empty());
    // The shipped ClusterRole does not grant it (403), and the attempt is
    // recorded all the same.
    let denied = Api::<Secret>::namespaced(fleet.management(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "{denied:?}"
    );
    assert_eq!(fleet.secret_lists_or_watches().len(), 1);
    fleet.clear_ops();
    assert!(fleet.ops().is_empty());

    // An outage of alpha fails the controller's calls with a server error;
    // beta and the test's own view are unaffected.
    fleet.set_unreachable("alpha", true);
    let err = Api::<Pod>::namespaced(alpha.clone(), WORKLOAD_NS)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 503),
        "{err:?}"
    );
    assert!(matches!(
        ConnectError::from_workload(&server, &err),
        ConnectError::Unreachable { .. }
    ));
    Api::<Pod>::namespaced(fleet.controller_workload_client("beta"), WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    Api::<Pod>::namespaced(fleet.workload_client("alpha"), WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    assert!(fleet.ops()[0].rejected);
    fleet.set_unreachable("alpha", false);
    Api::<Pod>::namespaced(alpha, WORKLOAD_NS)
        .list(&ListParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn broken_kubeconfigs_are_rejected_by_the_connector_checks() -> Result<()> {
    let fleet = Fleet::new(&["alpha"]).await?;
    let ns = fleet.namespace().to_string();
    let secrets = Api::<Secret>::namespaced(fleet.management_direct(), &ns);
    let location = KubeconfigLocation {
        namespace: ns.clone(),
        secret_name: "alpha-kubeconfig".into(),
        key: "value".into(),
    };
    let read = || async {
        let s = secrets.get("alpha-kubeconfig").await?;
        anyhow::Ok(String::from_utf8(s.data.unwrap()["value"].0.clone())?)
    };
    assert!(check_kubeconfig(&location, &read().await?).is_ok());

    fleet
        .break_kubeconfig("alpha", KubeconfigFault::ExecPlugin)
        .await?;
    let err = check_kubeconfig(&location, &read().await?).unwrap_err();
    assert_eq!(err.reason(), "KubeconfigNotAllowed", "{err}");

    fleet
        .break_kubeconfig("alpha", KubeconfigFault::Garbage)
        .await?;
    let err = check_kubeconfig(&location, &read().await?).unwrap_err();
    assert_eq!(err.reason(), "KubeconfigInvalid", "{err}");

    fleet
        .break_kubeconfig("alpha", KubeconfigFault::Missing)
        .await?;
    assert!(secrets.get_opt("alpha-kubeconfig").await?.is_none());

    fleet.restore_kubeconfig("alpha").await?;
    assert!(check_kubeconfig(&location, &read().await?).is_ok());
    Ok(())
}

#[tokio::test]
async fn an_unknown_image_leaves_the_pod_pending_with_err_image_pull() -> Result<()> {
    let fleet = Fleet::new(&["alpha"]).await?;
    let kube = fleet.workload_client("alpha");
    put_config(&kube, 1, "new").await?;
    let mut sts = etcd_statefulset(1);
    let template = sts.spec.template.spec.as_mut().unwrap();
    template.containers[0].image = Some("gcr.io/etcd-development/etcd:v9.9.9".into());
    Api::<StatefulSet>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &sts)
        .await?;
    fleet.sync_all().await?;
    fleet.sync_all().await?;
    let p = pod(&kube, "c-etcd-0").await?;
    let status = p.status.unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let waiting = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .and_then(|s| s.waiting)
        .expect("waiting");
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert_eq!(fleet.runtime("alpha").process_count().await, 0);
    Ok(())
}

/// `etcd_statefulset(1)` with `inits` as init containers and `volumes` added.
fn with_init_containers(
    inits: serde_json::Value,
    volumes: serde_json::Value,
) -> Result<StatefulSet> {
    let mut v = serde_json::to_value(etcd_statefulset(1))?;
    v["spec"]["template"]["spec"]["initContainers"] = inits;
    v["spec"]["template"]["spec"]["volumes"] = volumes;
    Ok(serde_json::from_value(v)?)
}

fn initialized(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Initialized")
        .map(|c| c.status.clone())
}

fn waiting_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_with_env_and_mounts_before_etcd_starts_on_their_data()
-> Result<()> {
    let Some(binary) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    // A snapshot with a key, taken from a scratch etcd.
    let source = etcdfleet_tests::etcd_harness::LocalEtcdCluster::start(
        etcdfleet_tests::etcd_harness::ClusterOptions::new(1, binary.clone()),
    )
    .await?;
    let url = source.member(0).client_url();
    let put = std::process::Command::new(&binary.etcdctl)
        .env("ETCDCTL_API", "3")
        .args([
            format!("--endpoints={url}"),
            "put".into(),
            "seeded".into(),
            "yes".into(),
        ])
        .output()?;
    anyhow::ensure!(put.status.success(), "{put:?}");
    let dir = tempfile::tempdir()?;
    let snap = dir.path().join("s.db");
    let save = std::process::Command::new(&binary.etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={url}"))
        .args(["snapshot", "save"])
        .arg(&snap)
        .output()?;
    anyhow::ensure!(save.status.success(), "{save:?}");
    drop(source);

    let fleet = Fleet::new(&["alpha"]).await?;
    let kube = fleet.workload_client("alpha");
    let runtime = fleet.runtime("alpha");
    put_config(&kube, 1, "new").await?;
    // The snapshot arrives through a Secret volume, the token through a
    // secretKeyRef, the initial cluster through a configMapKeyRef.
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("seed".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(
            [
                (
                    "snapshot.db".to_string(),
                    k8s_openapi::ByteString(std::fs::read(&snap)?),
                ),
                (
                    "token".to_string(),
                    k8s_openapi::ByteString(b"c-etcd".to_vec()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    let sts = with_init_containers(
        json!([
            {
                "name": "check",
                "image": IMAGE,
                "command": ["etcdutl", "snapshot", "status", "/var/lib/etcdfleet-seed/snapshot.db"],
                "volumeMounts": [{ "name": "seed", "mountPath": "/var/lib/etcdfleet-seed" }],
            },
            {
                "name": "restore",
                "image": IMAGE,
                "command": ["/usr/local/bin/etcdutl"],
                "args": [
                    "snapshot", "restore", "/var/lib/etcdfleet-seed/snapshot.db",
                    "--data-dir=/var/lib/etcd/data",
                    "--name=$(POD_NAME)",
                    "--initial-cluster=$(ETCD_INITIAL_CLUSTER)",
                    format!("--initial-advertise-peer-urls=http://$(POD_NAME).{PEER_SERVICE}.{NS}.svc:2380"),
                    "--initial-cluster-token=$(TOKEN)",
                ],
                "env": [
                    { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                    { "name": "ETCD_INITIAL_CLUSTER", "valueFrom": { "configMapKeyRef": { "name": "c-etcd-config", "key": "initial-cluster" } } },
                    { "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "seed", "key": "token" } } },
                ],
                "volumeMounts": [
                    { "name": "data", "mountPath": "/var/lib/etcd" },
                    { "name": "seed", "mountPath": "/var/lib/etcdfleet-seed" },
                ],
            },
        ]),
        json!([{ "name": "seed", "secret": { "secretName": "seed" } }]),
    )?;
    Api::<StatefulSet>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &sts)
        .await?;
    let p = sync_until(runtime, &kube, "c-etcd-0", "ready", is_ready).await?;
    assert_eq!(initialized(&p).as_deref(), Some("True"));
    let log = runtime.pod_log_tail(NS, "c-etcd-0", 200);
    let check = log.find("init container check").context("check ran")?;
    let restore = log.find("init container restore").context("restore ran")?;
    let etcd = log.find("starting").context("etcd started")?;
    assert!(check < restore && restore < etcd, "{log}");
    // etcd started on the data the init container restored.
    let mut client = etcd_client(&fleet, "alpha", "c-etcd-0").await?;
    assert_eq!(
        get_value(&mut client, "seeded").await?.as_deref(),
        Some("yes")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_init_container_keeps_the_pod_not_ready_and_etcd_not_started() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let fleet = Fleet::new(&["alpha"]).await?;
    let kube = fleet.workload_client("alpha");
    let runtime = fleet.runtime("alpha");
    put_config(&kube, 1, "new").await?;
    let sts = with_init_containers(
        json!([{
            "name": "fails",
            "image": IMAGE,
            "command": ["etcdutl", "snapshot", "status", "/nonexistent/snapshot.db"],
        }]),
        json!([]),
    )?;
    Api::<StatefulSet>::namespaced(kube.clone(), NS)
        .create(&PostParams::default(), &sts)
        .await?;
    let p = sync_until(runtime, &kube, "c-etcd-0", "init backoff", |p| {
        waiting_reason(p).as_deref() == Some("Init:CrashLoopBackOff")
    })
    .await?;
    assert_eq!(initialized(&p).as_deref(), Some("False"));
    assert!(!is_ready(&p));
    // Retried with backoff (a second run after the first delay), never etcd.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        runtime.sync().await?;
        let runs = runtime
            .pod_log_tail(NS, "c-etcd-0", 200)
            .matches("init container fails")
            .count();
        if runs >= 2 {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the failed init container was not retried");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !runtime
            .pod_log_tail(NS, "c-etcd-0", 200)
            .contains("starting")
    );
    assert!(!is_ready(&pod(&kube, "c-etcd-0").await?));
    Ok(())
}
