//! The platform templates in `templates/` and the samples in `config/samples/`
//! parse as their kinds, pass the CRDs' CEL rules, and resolve to what they
//! promise.

use std::path::{Path, PathBuf};

use etcdfleet_api::template::{Source, materialize, resolve};
use etcdfleet_api::{ClusterEtcdTemplate, EtcdCluster, EtcdClusterSpec, EtcdTemplate};
use etcdfleet_tests::apiserver::immutable::quantity_bytes;
use etcdfleet_tests::etcd_harness::EtcdVersion;
use kube::ResourceExt;

fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

fn load<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    etcdfleet_api::yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn platform_template(name: &str) -> ClusterEtcdTemplate {
    load(&repo_path(&format!("templates/{name}.yaml")))
}

/// The smallest cluster a customer writes: where, and which template.
fn minimal_cluster(kind: &str, template: &str) -> EtcdClusterSpec {
    etcdfleet_api::yaml::from_str(&format!(
        "clusterRef: {{name: shop}}\ntemplateRef: {{kind: {kind}, name: {template}}}\n"
    ))
    .unwrap()
}

/// The newest 3.5 patch the suite runs (`hack/upstream/etcd-3.5`): the
/// platform templates' version, a current release past the 3.6 gate.
fn tested_3_5() -> String {
    EtcdVersion::V3_5Latest
        .release()
        .expect("hack/upstream pins a 3.5 release")
}

#[test]
fn platform_templates_parse_pass_cel_and_resolve() {
    // (file, replicas)
    let expected = [("dev-single", 1), ("ha-3", 3), ("ha-5", 5)];
    for (name, replicas) in expected {
        let ct = platform_template(name);
        assert_eq!(ct.name_any(), name, "metadata.name matches the file name");
        let cel = ct.validate_cel();
        assert!(cel.is_ok(), "{name}: {}", cel.unwrap_err());
        let description = ct.spec.description.clone().unwrap_or_default();
        let tested = tested_3_5();
        assert!(
            description.contains(&tested) && description.contains("tested"),
            "{name}: the description names the tested version: {description:?}"
        );

        let spec = minimal_cluster("ClusterEtcdTemplate", name);
        let r = resolve(Some(&ct), None, &spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.spec.replicas, replicas, "{name}");
        assert_eq!(r.spec.version.to_string(), tested, "{name}");
        assert!(r.spec.tls_enabled, "{name}");
        assert_eq!(
            r.spec.image,
            format!("gcr.io/etcd-development/etcd:v{tested}")
        );
        let res = &r.spec.resources;
        assert!(
            res.requests
                .as_ref()
                .is_some_and(|m| m.contains_key("cpu") && m.contains_key("memory")),
            "{name}: requests cpu and memory"
        );
        assert!(
            res.limits
                .as_ref()
                .is_some_and(|m| m.contains_key("memory")),
            "{name}: a memory limit"
        );
        // Every value came from the template or a default, none from the cluster
        // except the references, which are not configuration.
        assert!(!r.sources.values().any(|s| *s == Source::Cluster), "{name}");
        assert_eq!(
            r.sources["spec.version"],
            Source::ClusterTemplate(name.into())
        );
        // HA templates keep members on distinct nodes.
        let anti = r
            .spec
            .pod
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref());
        assert!(
            replicas == 1
                || anti.is_some_and(|a| a
                    .required_during_scheduling_ignored_during_execution
                    .is_some()),
            "{name}: required pod anti-affinity"
        );
        // What the controller would write into the minimal cluster.
        let m = materialize(&spec, &r);
        assert_eq!(m.replicas, Some(replicas));
        assert_eq!(m.version, Some(tested));
    }
    // The HA templates get bigger volumes than the dev one.
    let size = |n: &str| {
        platform_template(n)
            .spec
            .config
            .storage
            .unwrap()
            .size
            .unwrap()
            .0
    };
    assert_eq!(
        [size("dev-single"), size("ha-3"), size("ha-5")],
        ["4Gi", "20Gi", "40Gi"]
    );
}

/// A member keeps every raft entry since its last snapshot in memory: with
/// large values (1 MiB) its anonymous memory grows to about 1.8 times the
/// data its backend holds (5.7 GiB for 3.2 GiB on etcd 3.5.35,
/// `real_node_memory`). So every shipped template limits memory to at least
/// twice its backend quota, or a full backend is OOM-killed.
#[test]
fn shipped_memory_limits_are_at_least_twice_the_backend_quota() {
    for name in ["dev-single", "ha-3", "ha-5"] {
        let spec = minimal_cluster("ClusterEtcdTemplate", name);
        let r = resolve(Some(&platform_template(name)), None, &spec)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let limit = (r.spec.resources.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| quantity_bytes(&q.0))
            .unwrap_or_else(|| panic!("{name}: no memory limit"));
        let quota = r.spec.tuning.quota_backend_bytes as f64;
        assert!(
            limit >= 2.0 * quota,
            "{name}: memory limit {limit} is below twice the quota {quota}"
        );
    }
}

#[test]
fn templates_kustomization_lists_every_template() {
    let k: serde_json::Value = load(&repo_path("templates/kustomization.yaml"));
    let listed: Vec<&str> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(repo_path("templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed_sorted: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
    listed_sorted.sort();
    assert_eq!(listed_sorted, on_disk);
}

#[test]
fn every_sample_parses_and_passes_cel() {
    let dir = repo_path("config/samples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let doc: serde_json::Value = load(&path);
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let result = match kind.as_str() {
            "EtcdCluster" => load::<EtcdCluster>(&path).validate_cel(),
            "EtcdTemplate" => load::<EtcdTemplate>(&path).validate_cel(),
            "ClusterEtcdTemplate" => load::<ClusterEtcdTemplate>(&path).validate_cel(),
            "EtcdBackupSchedule" => load::<etcdfleet_api::EtcdBackupSchedule>(&path).validate_cel(),
            "EtcdBackup" => load::<etcdfleet_api::EtcdBackup>(&path).validate_cel(),
            other => panic!("{}: unexpected kind {other:?}", path.display()),
        };
        assert!(
            result.is_ok(),
            "{}: {}",
            path.display(),
            result.unwrap_err()
        );
        seen += 1;
    }
    assert!(seen >= 3, "expected the three samples, saw {seen}");
}

#[test]
fn minimal_sample_resolves_against_ha_3() {
    let cluster: EtcdCluster = load(&repo_path("config/samples/etcdcluster-minimal.yaml"));
    let r = resolve(Some(&platform_template("ha-3")), None, &cluster.spec).unwrap();
    assert_eq!(r.spec.replicas, 3);
    assert_eq!(r.spec.version.to_string(), tested_3_5());
    assert!(r.spec.tls_enabled);
    assert_eq!(r.spec.storage.size.0, "20Gi");
}

#[test]
fn customer_template_sample_overrides_ha_3() {
    let t: EtcdTemplate = load(&repo_path("config/samples/etcdtemplate-customer.yaml"));
    assert_eq!(t.spec.base_template.as_deref(), Some("ha-3"));
    let ha3 = platform_template("ha-3");
    let spec = minimal_cluster("EtcdTemplate", &t.name_any());
    let r = resolve(Some(&ha3), Some(&t), &spec).unwrap();
    // From ha-3.
    assert_eq!(r.spec.replicas, 3);
    assert_eq!(r.spec.version.to_string(), tested_3_5());
    assert!(r.spec.tls_enabled);
    // Overridden by the customer.
    assert_eq!(r.spec.storage.class.as_deref(), Some("premium-ssd"));
    assert_eq!(r.spec.storage.size.0, "50Gi");
    let requests = r.spec.resources.requests.clone().unwrap();
    assert_eq!(requests["memory"].0, "4Gi");
    // Merged key by key: the cpu request still comes from ha-3.
    assert_eq!(requests["cpu"].0, "500m");
    assert_eq!(
        r.sources["spec.resources.requests['cpu']"],
        Source::ClusterTemplate("ha-3".into())
    );
    assert_eq!(
        r.sources["spec.resources.requests['memory']"],
        Source::Template("payments".into())
    );
    assert_eq!(r.spec.backup.as_ref().unwrap().retention, Some(28));
}

#[test]
fn full_sample_needs_nothing_from_templates() {
    let cluster: EtcdCluster = load(&repo_path("config/samples/etcdcluster-full.yaml"));
    let t: EtcdTemplate = load(&repo_path("config/samples/etcdtemplate-customer.yaml"));
    let r = resolve(Some(&platform_template("ha-3")), Some(&t), &cluster.spec).unwrap();
    assert_eq!(r.spec.replicas, 5);
    assert_eq!(r.spec.image, "registry.example.com/mirror/etcd:v3.6.16");
    assert_eq!(r.spec.workload_namespace, "etcd");
    assert_eq!(r.spec.tuning.auto_compaction_retention, "30m");
    // Every field the cluster could set, it set: no template value wins.
    let from_templates = r.template_supplied_paths();
    assert!(from_templates.is_empty(), "{from_templates:#?}");
    assert!(!r.sources.values().any(|s| *s == Source::Default));
    assert_eq!(materialize(&cluster.spec, &r), Default::default());
}
