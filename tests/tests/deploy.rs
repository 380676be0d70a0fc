//! The deploy manifests under config/: every file parses, kustomizations
//! point at files that exist, RBAC is least privilege (no list/watch of
//! Secrets, no wildcards), the controller runs locked down, and each stage's
//! configuration parses and owns only its own stage's clusters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use etcdfleet_api::{EtcdCluster, EtcdClusterSpec};
use etcdfleet_controllers::config::ControllerConfig;
use etcdfleet_tests::stage::kustomize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            // Plain controller config files (not manifests), read by `config_of`.
            && !path.ends_with("controller.yaml")
        {
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
        let values = etcdfleet_api::yaml::documents(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
        docs.extend(values.into_iter().map(|value| (file.clone(), value)));
    }
    docs
}

fn of_kind<'a>(docs: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a (PathBuf, Value)> {
    docs.iter()
        .filter(|(_, v)| v["kind"].as_str() == Some(kind))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
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
        // kustomize's deprecated fields (`bases`, `patchesStrategicMerge`)
        // are not used: current kubectl warns about them.
        for deprecated in ["bases", "patchesStrategicMerge", "patchesJson6902", "vars"] {
            assert!(
                doc[deprecated].is_null(),
                "{}: deprecated kustomize field {deprecated}",
                file.display()
            );
        }
        let mut paths = strings(&doc["resources"]);
        // configMapGenerator files: "key=path" or "path".
        for generator in doc["configMapGenerator"].as_array().into_iter().flatten() {
            for f in strings(&generator["files"]) {
                paths.push(f.rsplit('=').next().unwrap_or_default().to_string());
            }
        }
        if let Some(patches) = doc["patches"].as_array() {
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
    for part in ["../rbac", "../manager", "../../templates"] {
        assert!(default.contains(part), "default kustomization lacks {part}");
    }
    // The CRDs are their own first step: a stage applied in one go with them
    // fails on an empty cluster (its ClusterEtcdTemplates need them
    // established first).
    assert!(
        !default.contains("../crd"),
        "the CRDs are applied on their own"
    );
}

/// (apiGroup, resource) → sorted verbs of a Role's or ClusterRole's rules,
/// after checking no rule uses a wildcard.
fn grants_of(role: &Value) -> BTreeMap<(String, String), Vec<String>> {
    let rules = role["rules"].as_array().unwrap();
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
    for v in grants.values_mut() {
        v.sort();
        v.dedup();
    }
    grants
}

/// The controller's rights where it works (all namespaces or one): exactly these.
fn assert_controller_grants(role: &Value) {
    let grants = grants_of(role);
    let expected: BTreeMap<(String, String), Vec<String>> = [
        (
            "etcdfleet.dev",
            "etcdclusters",
            &["get", "list", "patch", "update", "watch"][..],
        ),
        ("etcdfleet.dev", "etcdclusters/status", &["patch", "update"]),
        (
            "etcdfleet.dev",
            "etcdclusters/finalizers",
            &["patch", "update"],
        ),
        ("etcdfleet.dev", "etcdtemplates", &["get", "list", "watch"]),
        // Backups: schedules create EtcdBackups and delete the ones retention
        // prunes; nothing else on the management side is ever deleted.
        (
            "etcdfleet.dev",
            "etcdbackups",
            &["create", "delete", "get", "list", "watch"],
        ),
        (
            "etcdfleet.dev",
            "etcdbackupschedules",
            &["get", "list", "watch"],
        ),
        ("etcdfleet.dev", "etcdbackups/status", &["patch", "update"]),
        (
            "etcdfleet.dev",
            "etcdbackupschedules/status",
            &["patch", "update"],
        ),
        // Secrets: get by name, create the PKI Secret, patch it to renew the
        // controller's client certificate; never list/watch (no credential
        // cache), never update/delete.
        ("", "secrets", &["create", "get", "patch"]),
        ("events.k8s.io", "events", &["create", "patch"]),
        ("", "events", &["create", "patch"]),
    ]
    .iter()
    .map(|(g, r, v)| {
        (
            (g.to_string(), r.to_string()),
            v.iter().map(|x| x.to_string()).collect(),
        )
    })
    .collect();
    assert_eq!(grants, expected, "{role:?}");
}

/// The optional workload RBAC for recovery's node evidence
/// (`config/workload-rbac-nodes`) grants reading Nodes and getting
/// PersistentVolumes and nothing else, to the same subjects as the
/// namespaced bundle.
#[test]
fn workload_node_rbac_reads_nodes_persistent_volumes_and_storage_classes_only() {
    let docs: Vec<Value> = documents()
        .into_iter()
        .filter(|(path, _)| {
            path.components()
                .any(|c| c.as_os_str() == "workload-rbac-nodes")
        })
        .filter(|(_, d)| d["kind"] != "Kustomization")
        .map(|(_, d)| d)
        .collect();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("a ClusterRole");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"] },
            { "apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"] },
            { "apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get"] }
        ])
    );
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .expect("a ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let names: Vec<&str> = binding["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["etcdfleet-controller", "etcdfleet"]);
}

/// The workload RBAC (`config/workload-rbac`) is a Role in the etcd
/// namespace, nothing cluster-wide, bound to the User the real tier uses and
/// to the bundle's ServiceAccount; the README's permissions section names
/// exactly its grants and the kubectl command that makes the
/// ServiceAccount's token.
#[test]
fn workload_rbac_is_a_role_in_the_etcd_namespace_and_the_readme_says_so() {
    let docs: Vec<Value> = documents()
        .into_iter()
        .filter(|(path, _)| path.components().any(|c| c.as_os_str() == "workload-rbac"))
        .filter(|(_, d)| d["kind"] != "Kustomization")
        .map(|(_, d)| d)
        .collect();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert!(
        !kinds.iter().any(|k| k.starts_with("Cluster")),
        "nothing cluster-wide: {kinds:?}"
    );
    let role = docs.iter().find(|d| d["kind"] == "Role").expect("a Role");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("etcd-system"));
    let binding = docs.iter().find(|d| d["kind"] == "RoleBinding").unwrap();
    assert_eq!(
        binding["metadata"]["namespace"].as_str(),
        Some("etcd-system")
    );
    assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
    let ns = docs.iter().find(|d| d["kind"] == "Namespace").unwrap();
    assert_eq!(ns["metadata"]["name"].as_str(), Some("etcd-system"));
    // Bound: the User of the real tier's kubeconfigs, and the bundle's
    // ServiceAccount, whose token a user makes with kubectl alone.
    let sa = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .expect("a ServiceAccount");
    assert_eq!(sa["metadata"]["name"].as_str(), Some("etcdfleet"));
    assert_eq!(sa["metadata"]["namespace"].as_str(), Some("etcd-system"));
    let subjects: Vec<(&str, &str, Option<&str>)> = binding["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap(),
                s["name"].as_str().unwrap(),
                s["namespace"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        subjects,
        [
            ("User", "etcdfleet-controller", None),
            ("ServiceAccount", "etcdfleet", Some("etcd-system")),
        ]
    );

    // The README lists every grant as `resource: verbs`.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("**In each workload cluster**")
        .nth(1)
        .expect("README section 'In each workload cluster'");
    let command = "kubectl -n etcd-system create token etcdfleet --duration=8760h";
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!("`{command}`")),
        "README's workload permissions lack `{command}`"
    );
    let section = &section[..section.find("\n\n").unwrap_or(section.len())];
    let section = section.split_whitespace().collect::<Vec<_>>().join(" ");
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for resource in rule["resources"].as_array().unwrap() {
            let line = format!("`{}`: {}", resource.as_str().unwrap(), verbs.join(", "));
            assert!(
                section.contains(&line),
                "README's workload permissions lack `{line}`:\n{section}"
            );
        }
    }
}

#[test]
fn controller_rbac_is_least_privilege_in_both_modes() {
    let docs = documents();
    // The controller's roles in the management cluster (config/workload-rbac
    // holds the one the kubeconfig identity needs in workload clusters,
    // enforced by the test API; config/storage-migration the one-off
    // migration's own, bound to its own ServiceAccount).
    let cluster_roles: Vec<_> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .filter(|(path, _)| {
            !path.components().any(|c| {
                ["workload-rbac", "workload-rbac-nodes", "storage-migration"]
                    .contains(&c.as_os_str().to_string_lossy().as_ref())
            })
        })
        .collect();
    let named = |name: &str| {
        cluster_roles
            .iter()
            .find(|(_, r)| r["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("ClusterRole {name}"))
    };
    // All-namespaces mode and one-namespace mode grant the same rights.
    let all = named("etcdfleet-controller");
    assert!(
        all.0
            .ends_with("config/rbac/all-namespaces/cluster_role.yaml")
    );
    assert_controller_grants(&all.1);
    let roles = of_kind(&docs, "Role");
    let per_namespace = roles
        .iter()
        .find(|(f, _)| f.ends_with("config/rbac/namespace/role.yaml"))
        .expect("config/rbac/namespace/role.yaml");
    assert!(
        per_namespace.1["metadata"]["namespace"].is_null(),
        "the including stage sets the namespace"
    );
    assert_controller_grants(&per_namespace.1);

    // Needed in every mode: read the cluster-scoped templates, nothing else.
    let templates = named("etcdfleet-cluster-templates-reader");
    let grants = grants_of(&templates.1);
    assert_eq!(
        grants.into_iter().collect::<Vec<_>>(),
        [(
            (
                "etcdfleet.dev".to_string(),
                "clusteretcdtemplates".to_string()
            ),
            vec!["get".to_string(), "list".to_string(), "watch".to_string()]
        )]
    );
    // Rollouts are cluster-scoped: read, watch, status, and the metadata
    // patch that removes the resume annotation; nothing else.
    let rollouts = named("etcdfleet-rollouts");
    assert_eq!(
        grants_of(&rollouts.1).into_iter().collect::<Vec<_>>(),
        [
            (
                ("etcdfleet.dev".to_string(), "etcdfleetrollouts".to_string()),
                vec!["get".into(), "list".into(), "patch".into(), "watch".into()]
            ),
            (
                (
                    "etcdfleet.dev".to_string(),
                    "etcdfleetrollouts/status".to_string()
                ),
                vec!["patch".into(), "update".into()]
            ),
        ]
    );
    assert_eq!(cluster_roles.len(), 3, "no other ClusterRole");

    // The Lease: a Role in the controller's own namespace.
    let lease = roles
        .iter()
        .find(|(_, r)| r["metadata"]["name"].as_str() == Some("etcdfleet-leader-election"))
        .expect("leader election Role");
    assert_eq!(
        lease.1["metadata"]["namespace"].as_str(),
        Some("etcdfleet-system")
    );
    assert_eq!(
        grants_of(&lease.1)
            .get(&("coordination.k8s.io".to_string(), "leases".to_string()))
            .cloned(),
        Some(vec![
            "create".into(),
            "get".into(),
            "list".into(),
            "update".into()
        ])
    );
    assert_eq!(grants_of(&lease.1).len(), 1);

    // A rollout's events (a cluster-scoped object's) go to `default`: a
    // Role there for events only.
    let events = roles
        .iter()
        .find(|(_, r)| r["metadata"]["name"].as_str() == Some("etcdfleet-rollout-events"))
        .expect("rollout events Role");
    assert_eq!(events.1["metadata"]["namespace"].as_str(), Some("default"));
    assert_eq!(
        grants_of(&events.1).into_iter().collect::<Vec<_>>(),
        [
            (
                ("".to_string(), "events".to_string()),
                vec!["create".into(), "patch".into()]
            ),
            (
                ("events.k8s.io".to_string(), "events".to_string()),
                vec!["create".into(), "patch".into()]
            ),
        ]
    );

    // Management bindings point at the controller's ServiceAccount (the
    // workload binding names the kubeconfig's user instead; the storage
    // migration binds its own ServiceAccount, never the controller's).
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for (_, b) in of_kind(&docs, kind).into_iter().filter(|(path, _)| {
            !path.components().any(|c| {
                ["workload-rbac", "workload-rbac-nodes", "storage-migration"]
                    .contains(&c.as_os_str().to_string_lossy().as_ref())
            })
        }) {
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
    let containers = pod["containers"].as_array().unwrap();
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
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/etc/etcdfleet"))
        .expect("config mount");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("config volume");
    assert_eq!(
        volume["configMap"]["name"].as_str(),
        Some("etcdfleet-config")
    );
    let base_config = config_of(&repo().join("config/manager/controller.yaml"));
    assert!(!base_config.leader_election.enabled);
    // Never two replicas at once without leader election: no surge.
    let strategy = &base[0].1["spec"]["strategy"];
    assert_eq!(strategy["type"].as_str(), Some("RollingUpdate"));
    assert_eq!(strategy["rollingUpdate"]["maxSurge"].as_i64(), Some(0));
    assert_eq!(
        strategy["rollingUpdate"]["maxUnavailable"].as_i64(),
        Some(1)
    );

    let ns = of_kind(&docs, "Namespace");
    assert!(
        ns.iter()
            .any(|(_, n)| n["metadata"]["name"].as_str() == Some("etcdfleet-system"))
    );
}

/// The ControllerConfig of a plain config file (what `run --config` reads).
fn config_of(file: &Path) -> ControllerConfig {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    ControllerConfig::from_yaml(&text, &file.display().to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn cluster(labels: &[(&str, &str)]) -> EtcdCluster {
    let mut c = EtcdCluster::new("c", EtcdClusterSpec::default());
    // Watched by every stage; the label decides.
    c.metadata.namespace = Some("team-a".into());
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
                config_of(&repo().join(format!("config/stages/{s}/controller.yaml"))),
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

    // Each overlay: its own image tag, its ConfigMap generated from its own
    // controller.yaml, RBAC for exactly its namespaces; prod runs 2 replicas.
    let mut tags = Vec::new();
    for (stage, config) in &configs {
        let dir = repo().join(format!("config/stages/{stage}"));
        let k: Value = etcdfleet_api::yaml::from_str(
            &std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap(),
        )
        .unwrap();
        let resources = strings(&k["resources"]);
        assert_eq!(resources[0], "../../default", "{stage}");
        let scope: Vec<String> = if config.namespaces.is_empty() {
            vec!["../../rbac/all-namespaces".into()]
        } else {
            config
                .namespaces
                .iter()
                .map(|ns| format!("namespaces/{ns}"))
                .collect()
        };
        assert_eq!(resources[1..], scope[..], "{stage}: RBAC scope");
        for ns in &config.namespaces {
            let inc: Value = etcdfleet_api::yaml::from_str(
                &std::fs::read_to_string(dir.join(format!("namespaces/{ns}/kustomization.yaml")))
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(inc["namespace"].as_str(), Some(ns.as_str()));
            // The namespace itself, so a first install applies cleanly.
            assert_eq!(
                strings(&inc["resources"]),
                ["namespace.yaml", "../../../../rbac/namespace"]
            );
        }
        let tag = k["images"][0]["newTag"].as_str().unwrap().to_string();
        assert_eq!(
            k["images"][0]["name"].as_str(),
            Some("etcdfleet/controller")
        );
        tags.push(tag);
        let generator = &k["configMapGenerator"][0];
        assert_eq!(generator["name"].as_str(), Some("etcdfleet-config"));
        assert_eq!(generator["behavior"].as_str(), Some("replace"));
        assert_eq!(
            strings(&generator["files"]),
            ["config.yaml=controller.yaml"]
        );
    }
    // prod runs 2 replicas.
    let prod = repo().join("config/stages/prod");
    let k: Value = etcdfleet_api::yaml::from_str(
        &std::fs::read_to_string(prod.join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let replicas: Value = etcdfleet_api::yaml::from_str(
        &std::fs::read_to_string(prod.join("replicas.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(replicas["spec"]["replicas"].as_i64(), Some(2));
    let patches: Vec<&str> = k["patches"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert!(patches.contains(&"replicas.yaml"), "{patches:?}");
    // Which tags they pin (a recorded release, promoted in order) is
    // tests/tests/releases.rs.
    assert_eq!(tags.len(), 3, "each stage pins an image tag: {tags:?}");
}

#[test]
fn each_stage_renders_with_controller_rbac_for_exactly_its_namespaces() {
    for stage in ["dev", "staging", "prod"] {
        let dir = repo().join(format!("config/stages/{stage}"));
        let Some(docs) = kustomize(&dir) else {
            return;
        };
        let config = config_of(&dir.join("controller.yaml"));
        let kind = |k: &str| -> Vec<&Value> {
            docs.iter()
                .filter(|d| d["kind"].as_str() == Some(k))
                .collect()
        };
        let name = |d: &Value| {
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };

        // The ConfigMap is the stage's controller.yaml, and the Deployment mounts it.
        let maps = kind("ConfigMap");
        assert_eq!(maps.len(), 1, "{stage}");
        let generated = name(maps[0]);
        assert!(generated.starts_with("etcdfleet-config-"), "{generated}");
        let rendered = ControllerConfig::from_yaml(
            maps[0]["data"]["config.yaml"].as_str().unwrap(),
            &generated,
        )
        .unwrap();
        assert_eq!(rendered, config, "{stage}");
        let deployments = kind("Deployment");
        assert_eq!(deployments.len(), 1);
        let deployment = deployments[0];
        let pod = &deployment["spec"]["template"]["spec"];
        assert!(
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["configMap"]["name"].as_str() == Some(generated.as_str())),
            "{stage}: Deployment mounts {generated}"
        );
        let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
        assert_eq!(replicas, if stage == "prod" { 2 } else { 1 }, "{stage}");
        // More than one replica only with a Lease deciding who reconciles.
        assert!(replicas == 1 || config.leader_election.enabled, "{stage}");
        assert_eq!(
            deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"].as_i64(),
            Some(0)
        );

        // PodDisruptionBudget and metrics Service select the controller pods.
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let pdbs = kind("PodDisruptionBudget");
        assert_eq!(pdbs.len(), 1, "{stage}");
        assert_eq!(&pdbs[0]["spec"]["selector"]["matchLabels"], pod_labels);
        assert_eq!(pdbs[0]["spec"]["maxUnavailable"].as_i64(), Some(1));
        let services = kind("Service");
        assert_eq!(services.len(), 1, "{stage}");
        assert_eq!(&services[0]["spec"]["selector"], pod_labels);
        assert_eq!(
            services[0]["spec"]["ports"][0]["targetPort"].as_str(),
            Some("http-metrics")
        );

        // RBAC: the controller's rights exist exactly where it works.
        let controller_roles: Vec<&Value> = kind("Role")
            .into_iter()
            .filter(|r| name(r) == "etcdfleet-controller")
            .collect();
        let role_namespaces: BTreeSet<String> = controller_roles
            .iter()
            .map(|r| r["metadata"]["namespace"].as_str().unwrap().to_string())
            .collect();
        let watched: BTreeSet<String> = config.namespaces.iter().cloned().collect();
        let all_namespaces = kind("ClusterRole")
            .into_iter()
            .find(|r| name(r) == "etcdfleet-controller");
        let cluster_binding = kind("ClusterRoleBinding")
            .into_iter()
            .any(|b| b["roleRef"]["name"].as_str() == Some("etcdfleet-controller"));
        if watched.is_empty() {
            assert!(role_namespaces.is_empty(), "{stage}: {role_namespaces:?}");
            assert_controller_grants(all_namespaces.expect("all-namespaces ClusterRole"));
            assert!(cluster_binding, "{stage}: ClusterRoleBinding");
        } else {
            assert_eq!(
                role_namespaces, watched,
                "{stage}: one Role per watched namespace"
            );
            assert!(
                all_namespaces.is_none() && !cluster_binding,
                "{stage}: no ClusterRole"
            );
            for role in &controller_roles {
                assert_controller_grants(role);
            }
            let bound: BTreeSet<String> = kind("RoleBinding")
                .into_iter()
                .filter(|b| b["roleRef"]["name"].as_str() == Some("etcdfleet-controller"))
                .inspect(|b| {
                    assert_eq!(b["roleRef"]["kind"].as_str(), Some("Role"));
                    assert_eq!(
                        b["subjects"][0]["namespace"].as_str(),
                        Some("etcdfleet-system")
                    );
                })
                .map(|b| b["metadata"]["namespace"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(
                bound, watched,
                "{stage}: one RoleBinding per watched namespace"
            );
            // No cluster-wide Secret access in this mode.
            for role in kind("ClusterRole") {
                assert!(
                    !grants_of(role).keys().any(|(_, r)| r == "secrets"),
                    "{stage}: {} grants Secrets cluster-wide",
                    name(role)
                );
            }
        }
    }
}

/// Each stage sets its restore seeder image to the controller image it runs
/// (a stage that pins an older release seeds with that release's binary).
#[test]
fn each_stage_seeds_restores_with_the_release_it_runs() {
    for stage in ["dev", "staging", "prod"] {
        let dir = repo().join("config/stages").join(stage);
        let k: Value = etcdfleet_api::yaml::from_str(
            &std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap(),
        )
        .unwrap();
        let tag = k["images"][0]["newTag"].as_str().expect("a pinned tag");
        let config: Value = etcdfleet_api::yaml::from_str(
            &std::fs::read_to_string(dir.join("controller.yaml")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            config["seederImage"].as_str(),
            Some(format!("etcdfleet/controller:{tag}").as_str()),
            "{stage}"
        );
    }
}
