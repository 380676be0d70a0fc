//! The deploy manifests under config/: every file parses, kustomizations
//! point at files that exist, RBAC is least privilege (no list/watch of
//! Secrets, no wildcards), the controller runs locked down, and each stage's
//! configuration parses and owns only its own stage's clusters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use etcdfleet_api::{EtcdCluster, EtcdClusterSpec};
use etcdfleet_controllers::config::ControllerConfig;
use serde::Deserialize;
use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every document of every YAML file under config/, with its file.
fn documents() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    yaml_files(&repo().join("config"), &mut files);
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), value));
            }
        }
    }
    docs
}

fn of_kind<'a>(docs: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a (PathBuf, Value)> {
    docs.iter()
        .filter(|(_, v)| v["kind"].as_str() == Some(kind))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_yaml_under_config_parses_and_has_a_kind() {
    let docs = documents();
    assert!(docs.len() > 20, "found only {} documents", docs.len());
    for (file, doc) in &docs {
        assert!(
            doc["kind"].as_str().is_some(),
            "{}: a document without kind",
            file.display()
        );
    }
}

#[test]
fn kustomizations_reference_existing_paths() {
    for (file, doc) in of_kind(&documents(), "Kustomization") {
        let dir = file.parent().unwrap();
        let mut paths = strings(&doc["resources"]);
        if let Some(patches) = doc["patches"].as_sequence() {
            paths.extend(
                patches
                    .iter()
                    .filter_map(|p| p["path"].as_str().map(str::to_string)),
            );
        }
        for p in paths {
            assert!(
                dir.join(&p).exists(),
                "{}: {p} does not exist",
                file.display()
            );
        }
    }
    let default =
        std::fs::read_to_string(repo().join("config/default/kustomization.yaml")).unwrap();
    for part in ["../crd", "../rbac", "../manager", "../../templates"] {
        assert!(default.contains(part), "default kustomization lacks {part}");
    }
}

#[test]
fn cluster_role_is_least_privilege() {
    let docs = documents();
    // The management cluster's ClusterRole (config/workload-rbac holds the
    // one for workload clusters, checked by the enforced-RBAC e2e tests).
    let roles: Vec<_> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .filter(|(path, _)| !path.components().any(|c| c.as_os_str() == "workload-rbac"))
        .collect();
    assert_eq!(roles.len(), 1, "one management ClusterRole expected");
    let rules = roles[0].1["rules"].as_sequence().unwrap();
    let mut grants: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for rule in rules {
        let verbs = strings(&rule["verbs"]);
        let resources = strings(&rule["resources"]);
        let groups = strings(&rule["apiGroups"]);
        assert!(!verbs.iter().any(|v| v == "*"), "wildcard verb in {rule:?}");
        assert!(
            !resources.iter().any(|r| r == "*" || r.ends_with("/*")),
            "wildcard resource in {rule:?}"
        );
        assert!(
            !groups.iter().any(|g| g == "*"),
            "wildcard group in {rule:?}"
        );
        assert!(
            rule["resourceNames"].is_null() || !strings(&rule["resourceNames"]).is_empty(),
            "empty resourceNames in {rule:?}"
        );
        for g in &groups {
            for r in &resources {
                grants
                    .entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(verbs.iter().cloned());
            }
        }
    }
    let verbs = |g: &str, r: &str| -> Vec<String> {
        let mut v = grants
            .get(&(g.to_string(), r.to_string()))
            .cloned()
            .unwrap_or_default();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(
        verbs("", "secrets"),
        ["create", "get", "patch"],
        "Secrets: get, create and patch (PKI renewal) only; never list or watch"
    );
    for (g, r) in grants.keys() {
        if r == "secrets" {
            assert_eq!(g, "", "secrets granted in group {g:?}");
        }
    }
    assert_eq!(
        verbs("etcdfleet.dev", "etcdclusters"),
        ["get", "list", "patch", "update", "watch"]
    );
    for sub in ["etcdclusters/status", "etcdclusters/finalizers"] {
        assert_eq!(verbs("etcdfleet.dev", sub), ["patch", "update"], "{sub}");
    }
    for t in ["etcdtemplates", "clusteretcdtemplates"] {
        assert_eq!(verbs("etcdfleet.dev", t), ["get", "list", "watch"], "{t}");
    }
    assert_eq!(verbs("events.k8s.io", "events"), ["create", "patch"]);
    assert_eq!(verbs("", "events"), ["create", "patch"]);
    assert!(
        verbs("coordination.k8s.io", "leases").is_empty(),
        "leases belong in the namespaced Role, not the ClusterRole"
    );
    for ((g, r), v) in &grants {
        assert!(
            !v.iter().any(|v| v == "delete" || v == "deletecollection"),
            "{g}/{r}: the management side never deletes"
        );
    }

    // The Lease: a Role in the controller's own namespace.
    let roles = of_kind(&docs, "Role");
    assert_eq!(roles.len(), 1);
    let role = &roles[0].1;
    assert_eq!(
        role["metadata"]["namespace"].as_str(),
        Some("etcdfleet-system")
    );
    let rules = role["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(strings(&rules[0]["apiGroups"]), ["coordination.k8s.io"]);
    assert_eq!(strings(&rules[0]["resources"]), ["leases"]);
    assert_eq!(strings(&rules[0]["verbs"]), ["get", "create", "update"]);

    // Management bindings point at the controller's ServiceAccount (the
    // workload binding names the kubeconfig's user instead).
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for (_, b) in of_kind(&docs, kind)
            .into_iter()
            .filter(|(path, _)| !path.components().any(|c| c.as_os_str() == "workload-rbac"))
        {
            let subject = &b["subjects"][0];
            assert_eq!(subject["kind"].as_str(), Some("ServiceAccount"));
            assert_eq!(subject["name"].as_str(), Some("etcdfleet-controller"));
            assert_eq!(subject["namespace"].as_str(), Some("etcdfleet-system"));
        }
    }
}

#[test]
fn deployment_is_locked_down() {
    let docs = documents();
    let deployments = of_kind(&docs, "Deployment");
    let base: Vec<_> = deployments
        .iter()
        .filter(|(f, _)| f.ends_with("config/manager/deployment.yaml"))
        .collect();
    assert_eq!(base.len(), 1);
    let pod = &base[0].1["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"].as_str(),
        Some("etcdfleet-controller")
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());
    assert!(sc["privileged"].as_bool() != Some(true));
    assert_eq!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    for what in ["requests", "limits"] {
        assert!(
            c["resources"][what]["memory"].as_str().is_some(),
            "resources.{what}.memory"
        );
    }
    assert!(c["resources"]["requests"]["cpu"].as_str().is_some());
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        strings(&c["args"]),
        ["run", "--config", "/etc/etcdfleet/config.yaml"]
    );
    // The config is mounted from the ConfigMap the overlays patch.
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/etc/etcdfleet"))
        .expect("config mount");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("config volume");
    assert_eq!(
        volume["configMap"]["name"].as_str(),
        Some("etcdfleet-config")
    );
    let base_config = config_of(&repo().join("config/manager/config.yaml"));
    assert!(!base_config.leader_election.enabled);

    let ns = of_kind(&docs, "Namespace");
    assert!(
        ns.iter()
            .any(|(_, n)| n["metadata"]["name"].as_str() == Some("etcdfleet-system"))
    );
}

/// The ControllerConfig in a ConfigMap manifest's `config.yaml`.
fn config_of(file: &Path) -> ControllerConfig {
    let text = std::fs::read_to_string(file).unwrap();
    let cm: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"), "{}", file.display());
    assert_eq!(cm["metadata"]["name"].as_str(), Some("etcdfleet-config"));
    let data = cm["data"]["config.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no data.config.yaml", file.display()));
    ControllerConfig::from_yaml(data, &file.display().to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn cluster(labels: &[(&str, &str)]) -> EtcdCluster {
    let mut c = EtcdCluster::new("c", EtcdClusterSpec::default());
    c.metadata.namespace = Some("team".into());
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c
}

#[test]
fn stages_own_disjoint_clusters() {
    let stages = ["dev", "staging", "prod"];
    let configs: Vec<(&str, ControllerConfig)> = stages
        .iter()
        .map(|s| {
            (
                *s,
                config_of(&repo().join(format!("config/stages/{s}/config.yaml"))),
            )
        })
        .collect();
    for (stage, config) in &configs {
        assert_eq!(
            config.label_selector.as_deref(),
            Some(format!("etcdfleet.dev/stage={stage}").as_str())
        );
        assert!(config.owns(&cluster(&[("etcdfleet.dev/stage", stage)])));
        assert_eq!(config.leader_election.enabled, *stage == "prod", "{stage}");
    }
    let examples = [
        vec![],
        vec![("etcdfleet.dev/stage", "dev")],
        vec![("etcdfleet.dev/stage", "staging")],
        vec![("etcdfleet.dev/stage", "prod")],
        vec![("etcdfleet.dev/stage", "qa")],
        vec![("etcdfleet.dev/stage", "")],
        vec![("stage", "prod")],
        vec![("etcdfleet.dev/stage", "prod"), ("team", "payments")],
        vec![("etcdfleet.dev/stage", "dev"), ("stage", "prod")],
    ];
    for labels in &examples {
        let owners: Vec<&str> = configs
            .iter()
            .filter(|(_, c)| c.owns(&cluster(labels)))
            .map(|(s, _)| *s)
            .collect();
        assert!(
            owners.len() <= 1,
            "labels {labels:?} are owned by several stages: {owners:?}"
        );
    }

    // Each overlay: its own image tag, its own config patch; prod runs 2 replicas.
    let mut tags = Vec::new();
    for stage in stages {
        let dir = repo().join(format!("config/stages/{stage}"));
        let k: Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
                .unwrap();
        assert_eq!(strings(&k["resources"]), ["../../default"]);
        let tag = k["images"][0]["newTag"].as_str().unwrap().to_string();
        assert_eq!(
            k["images"][0]["name"].as_str(),
            Some("etcdfleet/controller")
        );
        tags.push(tag);
        let patches: Vec<&str> = k["patches"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|p| p["path"].as_str())
            .collect();
        assert!(patches.contains(&"config.yaml"), "{stage}");
        if stage == "prod" {
            let replicas: Value =
                serde_yaml::from_str(&std::fs::read_to_string(dir.join("replicas.yaml")).unwrap())
                    .unwrap();
            assert_eq!(replicas["spec"]["replicas"].as_i64(), Some(2));
            assert!(patches.contains(&"replicas.yaml"));
        }
    }
    tags.dedup();
    assert_eq!(tags.len(), 3, "each stage pins its own image tag: {tags:?}");
}
