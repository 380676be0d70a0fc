//! API `v1beta1` and storage migration on a real API server.
//!
//! The management cluster starts as v0.1.0 left it: CRDs serving and storing
//! `v1alpha1` only, objects of every kind created under `v1alpha1`. Then, as
//! a platform team upgrades: the dev stage of this tree is applied (CRDs
//! serving `v1alpha1` and `v1beta1`, storing `v1beta1`, identical schemas,
//! no conversion webhook), the controller (which speaks `v1beta1`) runs the
//! cluster, and objects created under `v1alpha1` read back under `v1beta1`
//! with the same content. `etcdfleet migrate-storage`, as its own
//! ServiceAccount under `config/storage-migration`, rewrites every object: in
//! the storage etcd every etcdfleet key then holds `v1beta1` and every CRD's
//! `status.storedVersions` is `[v1beta1]`, the cluster's PKI Secret (whose
//! ownerReference is set to `v1alpha1` first, as v0.1.0 wrote it) is owned
//! through `v1beta1`, and every request of the migrator's ServiceAccount was
//! allowed. The API server then accepts CRDs that no longer serve
//! `v1alpha1`, a controller started on that store converges with every
//! object unchanged in meaning and no workload write, and deleting the
//! cluster lets the garbage collector delete its PKI Secret.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_controllers::crd;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, stop_installed_controller, wait_available,
};
use etcdfleet_tests::control_plane::{KubeWorld, require_kubernetes};
use etcdfleet_tests::controller_process::{ControllerProcess, etcdfleet_binary};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

const WORKLOAD_USER: &str = "etcdfleet-controller";
const MIGRATOR: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-storage-migrator";
const KINDS: [&str; 5] = [
    "etcdclusters",
    "etcdtemplates",
    "clusteretcdtemplates",
    "etcdbackups",
    "etcdbackupschedules",
];

/// The CRDs as YAML, each passed through `edit`.
fn crds_yaml(edit: impl Fn(&mut CustomResourceDefinition)) -> Result<String> {
    let mut out = String::new();
    for mut c in crd::storage_version_crds() {
        edit(&mut c);
        out.push_str("---\n");
        out.push_str(&etcdfleet_api::yaml::to_string(&c)?);
    }
    Ok(out)
}

/// What v0.1.0 created under `v1alpha1`, beside the cluster `shop`.
fn v1alpha1_objects(backups: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: ClusterEtcdTemplate
metadata: {{name: platform-small, labels: {{tier: small}}}}
spec: {{version: 3.5.1, replicas: 1, storage: {{size: 1Gi}}}}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdTemplate
metadata: {{name: team-defaults, namespace: {NS}, annotations: {{owner: team-a}}}}
spec: {{baseTemplate: platform-small, etcd: {{snapshotCount: 5000}}}}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdBackupSchedule
metadata: {{name: shop-yearly, namespace: {NS}}}
spec: {{clusterName: shop, schedule: '0 3 1 1 *', retention: {{count: 3}}, destination: {{path: {backups}}}}}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdBackup
metadata: {{name: shop-once, namespace: {NS}}}
spec: {{clusterName: shop, destination: {{path: {backups}}}}}
"
    )
}

/// Every etcdfleet object as `kind/ns/name` → (uid, generation, metadata
/// labels and annotations, spec), read under `version`.
fn meaning(world: &KubeWorld, version: &str) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for kind in KINDS {
        for (key, item) in world.list_all(kind, &format!("{kind}.{version}.etcdfleet.dev"))? {
            let m = &item["metadata"];
            ensure!(item["apiVersion"] == format!("etcdfleet.dev/{version}"));
            let mut annotations = m["annotations"].clone();
            // kubectl's own bookkeeping, not the object's meaning.
            if let Some(a) = annotations.as_object_mut() {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
            out.insert(
                key,
                serde_json::json!([
                    m["uid"],
                    m["generation"],
                    m["labels"],
                    annotations,
                    item["spec"]
                ]),
            );
        }
    }
    Ok(out)
}

/// `apiVersion` of every etcdfleet object as the storage etcd holds it.
async fn stored_versions(world: &KubeWorld) -> Result<BTreeMap<String, String>> {
    let prefix = format!("{}/etcdfleet.dev/", world.management.etcd_prefix());
    let mut client = etcd_client::Client::connect([world.storage_url()], None).await?;
    let resp = client
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    let mut out = BTreeMap::new();
    for kv in resp.kvs() {
        let object: Value = serde_json::from_slice(kv.value())?;
        out.insert(
            kv.key_str()?.trim_start_matches(&prefix).to_string(),
            object["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    Ok(out)
}

fn start_controller(world: &KubeWorld, token: &str, config: &str, name: &str) -> ControllerProcess {
    let kubeconfig = world.management.kubeconfig_with_token(token);
    let p = ControllerProcess::start(
        name,
        &kubeconfig,
        &[
            "--config",
            config,
            "--log-format",
            "text",
            "--requeue-converged-seconds",
            "2",
        ],
    );
    p.wait_for_status("/readyz", 200, Duration::from_secs(60));
    p
}

/// Runs `etcdfleet migrate-storage` as the migrator's ServiceAccount.
async fn migrate(world: &KubeWorld, dir: &std::path::Path) -> Result<String> {
    world.kubectl(&["apply", "--server-side", "-k", "config/storage-migration"])?;
    let token = world.kubectl(&[
        "create",
        "token",
        "etcdfleet-storage-migrator",
        "-n",
        "etcdfleet-system",
    ])?;
    let kubeconfig = dir.join("migrator.kubeconfig");
    std::fs::write(
        &kubeconfig,
        world.management.kubeconfig_with_token(token.trim()),
    )?;
    let out = Command::new(etcdfleet_binary())
        .arg("migrate-storage")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "migrate-storage failed:\n{text}");
    Ok(text)
}

/// The apiVersion the PKI Secret of `cluster` names its owner with.
fn pki_owner_version(world: &KubeWorld, cluster: &str) -> Result<String> {
    world.kubectl(&[
        "get",
        "secret",
        &format!("{cluster}-etcd-pki"),
        "-n",
        NS,
        "-o",
        "jsonpath={.metadata.ownerReferences[0].apiVersion}",
    ])
}

/// Sets the PKI Secret's ownerReference to `etcdfleet.dev/v1alpha1`, as
/// releases before v0.2.0 created it.
fn own_pki_as_v1alpha1(world: &KubeWorld, cluster: &str) -> Result<()> {
    world.kubectl(&[
        "patch",
        "secret",
        &format!("{cluster}-etcd-pki"),
        "-n",
        NS,
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/metadata/ownerReferences/0/apiVersion","value":"etcdfleet.dev/v1alpha1"}]"#,
    ])?;
    ensure!(pki_owner_version(world, cluster)? == "etcdfleet.dev/v1alpha1");
    Ok(())
}

/// Requests of the migrator's ServiceAccount the management API server
/// refused.
fn migrator_refused(world: &KubeWorld) -> Result<Vec<String>> {
    Ok(world
        .management
        .audit()?
        .by(MIGRATOR)
        .into_iter()
        .filter(|e| e.code() == 401 || e.code() == 403)
        .map(ToString::to_string)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_storage_migration_keeps_every_object_and_a_v1beta1_only_build_starts_on_it()
-> Result<()> {
    let Some(binaries) = require_kubernetes() else {
        return Ok(());
    };
    let world = KubeWorld::start(binaries, &["w1"]).await?;
    let dir = tempfile::tempdir()?;
    let backups = dir.path().join("backups");
    std::fs::create_dir_all(&backups)?;

    // v0.1.0's CRDs: the same schema, served and stored as v1alpha1 only.
    world.apply(&crds_yaml(|c| c.spec.versions[0].name = "v1alpha1".into())?)?;
    world.wait_crds_established()?;
    world.put_kubeconfig_secret(NS, "w1").await?;
    world.apply(&cluster_yaml("shop", "w1", 1, "3.5.1"))?;
    world.apply(&v1alpha1_objects(&backups.display().to_string()))?;
    let created = meaning(&world, "v1alpha1")?;

    // This tree's CRDs: v1beta1 stored, v1alpha1 still served.
    world.install_crds("config/crd")?;
    let read = meaning(&world, "v1beta1")?;
    ensure!(
        read == created,
        "v1alpha1 objects read as v1beta1 differ:\ncreated {created:#?}\nread {read:#?}"
    );
    // Then its dev stage, the installed controller stopped: this test
    // drives its own controller processes (before and after).
    world.install("config/stages/dev")?;
    stop_installed_controller(&world)?;
    world.install_workload_rbac()?;
    let config = dir.path().join("config.yaml");
    // The stage's configuration, with this test's snapshots in a directory
    // of its own, which the platform allows for its namespace.
    let installed = world.installed_controller_config()?;
    std::fs::write(
        &config,
        format!("{installed}\ntenancy: {{localDestinationNamespaces: [{NS}]}}\n"),
    )?;
    let config = config.display().to_string();
    let token = world.controller_token().await?;
    let p = start_controller(&world, &token, &config, "before-migration");
    wait_available(&world, "shop").with_context(|| p.log())?;
    world
        .kubectl(&[
            "wait",
            "-n",
            NS,
            "--timeout=120s",
            "--for=jsonpath={.status.phase}=Succeeded",
            "etcdbackup/shop-once",
        ])
        .with_context(|| p.log())?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = meaning(&world, "v1alpha1")?;
    let stored = stored_versions(&world).await?;
    eprintln!("stored before migration: {stored:#?}");
    ensure!(
        stored.values().any(|v| v == "etcdfleet.dev/v1alpha1"),
        "nothing was left stored as v1alpha1: the test would prove nothing"
    );

    own_pki_as_v1alpha1(&world, "shop")?;
    let report = migrate(&world, dir.path()).await?;
    eprintln!("{report}");
    ensure!(
        pki_owner_version(&world, "shop")? == "etcdfleet.dev/v1beta1",
        "the PKI Secret is still owned through v1alpha1"
    );
    let refused = migrator_refused(&world)?;
    ensure!(refused.is_empty(), "the migrator was refused: {refused:#?}");
    let stored = stored_versions(&world).await?;
    ensure!(
        stored.values().all(|v| v == "etcdfleet.dev/v1beta1"),
        "stored after migration: {stored:#?}"
    );
    for kind in KINDS {
        let versions = world.kubectl(&[
            "get",
            "crd",
            &format!("{kind}.etcdfleet.dev"),
            "-o",
            "jsonpath={.status.storedVersions}",
        ])?;
        ensure!(
            versions == r#"["v1beta1"]"#,
            "{kind}: storedVersions {versions}"
        );
    }

    // A later release: CRDs that no longer serve v1alpha1, and the
    // controller restarted on the migrated store.
    drop(p);
    let w0 = world.workload("w1").plane.audit()?.len();
    world.apply(&crds_yaml(|_| {})?)?;
    ensure!(
        world
            .kubectl(&["get", "etcdclusters.v1alpha1.etcdfleet.dev", "-A"])
            .is_err(),
        "v1alpha1 is still served"
    );
    let p = start_controller(&world, &token, &config, "after-migration");
    wait_available(&world, "shop").with_context(|| p.log())?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = meaning(&world, "v1beta1")?;
    ensure!(
        after == before,
        "objects changed across the migration:\nbefore {before:#?}\nafter {after:#?}"
    );
    let writes: Vec<String> = world
        .workload("w1")
        .plane
        .audit()?
        .by_since(WORKLOAD_USER, w0)
        .into_iter()
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(|e| e.to_string())
        .collect();
    ensure!(
        writes.is_empty(),
        "workload writes after the migration: {writes:#?}"
    );
    let metrics = p.wait_for_status("/metrics", 200, Duration::from_secs(10));
    ensure!(
        metrics.contains("etcdfleet_reconciles_total"),
        "/metrics answered without the controller's metrics:\n{metrics}"
    );
    ensure!(
        !metrics
            .lines()
            .any(|l| l.starts_with("etcdfleet_reconcile_failures_total{") && !l.ends_with(" 0")),
        "reconcile failures on the migrated store:\n{}",
        p.log()
    );

    // The garbage collector resolves the PKI Secret's owner through
    // v1beta1 and deletes the Secret with its cluster.
    world.kubectl(&["delete", "etcdcluster", "shop", "-n", NS, "--timeout=120s"])?;
    world
        .kubectl(&[
            "wait",
            "--for=delete",
            "secret/shop-etcd-pki",
            "-n",
            NS,
            "--timeout=60s",
        ])
        .with_context(|| p.log())?;
    Ok(())
}
