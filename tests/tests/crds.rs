//! The CRDs: the committed YAML matches the types, the schemas are structural
//! (what the API server demands of `apiextensions.k8s.io/v1`), and every CEL
//! rule accepts and rejects what it should, evaluated with kube's CEL.

use std::path::PathBuf;

use etcdfleet_api::{ClusterEtcdTemplate, EtcdCluster, EtcdTemplate};
use etcdfleet_controllers::crd;
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn committed_crds_match_the_types() {
    let dir = repo_root().join("config/crd");
    let files = crd::render_files().expect("CRDs render");
    assert_eq!(files.len(), 7, "six CRDs and a kustomization");
    for file in files {
        let path = dir.join(&file.file_name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == file.content,
            "{} is out of date with the Rust types in api/: run `make crds` and commit the result",
            path.display()
        );
    }
    // No stale file lingers next to the generated ones.
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = crd::render_files()
        .unwrap()
        .into_iter()
        .map(|f| f.file_name)
        .collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "config/crd holds files crdgen does not write: run `make crds`"
    );
}

#[test]
fn crdgen_stream_holds_every_crd() {
    let stream = crd::render_stream().unwrap();
    assert!(stream.starts_with(crd::GENERATED_HEADER));
    let docs: Vec<Value> = stream
        .split("\n---\n")
        .skip(1)
        .map(|doc| etcdfleet_api::yaml::from_str(doc).unwrap())
        .collect();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "etcdclusters.etcdfleet.dev",
            "etcdtemplates.etcdfleet.dev",
            "clusteretcdtemplates.etcdfleet.dev",
            "etcdbackups.etcdfleet.dev",
            "etcdbackupschedules.etcdfleet.dev",
            "etcdfleetrollouts.etcdfleet.dev"
        ]
    );
}

/// kube-apiserver refuses a CRD that names a version twice (a kind new at
/// the version the older kinds are still also served at must not list it
/// again). Each kind names each version once, exactly one of them stored.
#[test]
fn every_crd_names_each_version_once_with_one_storage_version() {
    for file in crd::render_files().unwrap() {
        let crd: Value = etcdfleet_api::yaml::from_str(&file.content).unwrap();
        let Some(versions) = crd["spec"]["versions"].as_array() else {
            continue;
        };
        let names: Vec<&str> = versions.iter().filter_map(|v| v["name"].as_str()).collect();
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{}: {names:?}", file.file_name);
        let stored = versions.iter().filter(|v| v["storage"] == true).count();
        assert_eq!(stored, 1, "{}: {names:?}", file.file_name);
    }
}

fn crd_json(name: &str) -> Value {
    let file = crd::render_files()
        .unwrap()
        .into_iter()
        .find(|f| f.file_name == format!("{name}.yaml"))
        .unwrap();
    etcdfleet_api::yaml::from_str(&file.content).unwrap()
}

/// The fields of `node` (at `path`) that have no bound: a string with
/// neither `maxLength` nor `enum`, a list without `maxItems`, a map
/// without `maxProperties`.
fn unbounded(node: &Value, path: &str, out: &mut Vec<String>) {
    match node["type"].as_str() {
        Some("string") if node.get("maxLength").is_none() && node.get("enum").is_none() => {
            out.push(path.to_string())
        }
        Some("array") => {
            if node.get("maxItems").is_none() {
                out.push(format!("{path}[]"));
            }
            unbounded(&node["items"], &format!("{path}[*]"), out);
        }
        Some("object") => {
            if node["additionalProperties"].is_object() {
                if node.get("maxProperties").is_none() {
                    out.push(format!("{path}{{}}"));
                }
                unbounded(&node["additionalProperties"], &format!("{path}{{*}}"), out);
            }
            for (field, schema) in node["properties"].as_object().into_iter().flatten() {
                unbounded(schema, &format!("{path}.{field}"), out);
            }
        }
        _ => {}
    }
}

/// Issue 52: every field a tenant writes is input from an adversary on a
/// shared management cluster; no string, list or map of any kind, in any
/// served version, spec or status, project type or embedded Kubernetes
/// type, is unbounded (a test that walks the generated schemas).
#[test]
fn no_field_a_tenant_writes_is_unbounded_in_any_crd() {
    let mut out = Vec::new();
    let mut strings = 0;
    for crd in crd::crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            let path = format!("{kind}/{}", version["name"].as_str().unwrap());
            unbounded(schema, &path, &mut out);
            strings += schema.to_string().matches(r#""type":"string""#).count();
        }
    }
    assert!(
        strings > 500,
        "the walk saw {strings} strings: it walked nothing"
    );
    assert!(out.is_empty(), "unbounded fields:\n{}", out.join("\n"));
    let cluster = crd_json("etcdclusters.etcdfleet.dev");
    let spec = &cluster["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["clusterRef"]["properties"]["name"]["maxLength"],
        253
    );
    assert_eq!(
        spec["properties"]["podTemplate"]["properties"]["tolerations"]["maxItems"],
        64
    );
}

const CRD_NAMES: [&str; 3] = [
    "etcdclusters.etcdfleet.dev",
    "etcdtemplates.etcdfleet.dev",
    "clusteretcdtemplates.etcdfleet.dev",
];

const BACKUP_CRD_NAMES: [&str; 2] = [
    "etcdbackups.etcdfleet.dev",
    "etcdbackupschedules.etcdfleet.dev",
];

const ROLLOUT_CRD_NAME: &str = "etcdfleetrollouts.etcdfleet.dev";

/// Keys a schema inside `anyOf`/`oneOf`/`allOf`/`not` must not carry in a
/// structural schema (they may only hold value validations).
const NOT_IN_JUNCTORS: &[&str] = &[
    "type",
    "description",
    "default",
    "nullable",
    "additionalProperties",
    "title",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

/// Walks a schema node; pushes every violation (with its path) into `errors`.
fn check_structural(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        errors.push(format!("{path}: schema node is not an object"));
        return;
    };
    if obj.contains_key("$ref") {
        errors.push(format!("{path}: $ref is not allowed"));
    }
    let untyped_ok = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !obj.contains_key("type") && !untyped_ok {
        errors.push(format!("{path}: no type"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        errors.push(format!("{path}: both properties and additionalProperties"));
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (key, child) in props {
            check_structural(child, &format!("{path}.{key}"), errors);
        }
    }
    if let Some(items) = obj.get("items") {
        check_structural(items, &format!("{path}[]"), errors);
    }
    if let Some(additional) = obj.get("additionalProperties")
        && additional.is_object()
    {
        check_structural(additional, &format!("{path}{{*}}"), errors);
    }
    for junctor in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = obj.get(junctor) {
            for (i, sub) in subs.iter().enumerate() {
                check_junctor(sub, &format!("{path}.{junctor}[{i}]"), errors);
            }
        }
    }
    if let Some(sub) = obj.get("not") {
        check_junctor(sub, &format!("{path}.not"), errors);
    }
}

fn check_junctor(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        return;
    };
    for key in NOT_IN_JUNCTORS {
        if obj.contains_key(*key) {
            errors.push(format!(
                "{path}: {key} is not allowed inside anyOf/oneOf/allOf/not"
            ));
        }
    }
    for nested in ["properties", "items", "additionalProperties"] {
        match obj.get(nested) {
            Some(Value::Object(children)) if nested == "properties" => {
                for (key, child) in children {
                    check_junctor(child, &format!("{path}.{key}"), errors);
                }
            }
            Some(child) => check_junctor(child, &format!("{path}.{nested}"), errors),
            None => {}
        }
    }
}

#[test]
fn every_schema_is_structural() {
    for name in CRD_NAMES
        .into_iter()
        .chain(BACKUP_CRD_NAMES)
        .chain([ROLLOUT_CRD_NAME])
    {
        let crd = crd_json(name);
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            assert!(schema.is_object(), "{name}: no openAPIV3Schema");
            let mut errors = Vec::new();
            check_structural(schema, name, &mut errors);
            assert!(
                errors.is_empty(),
                "{name} is not structural:\n{}",
                errors.join("\n")
            );
        }
    }
}

#[test]
fn structural_check_catches_violations() {
    // The walker itself must see the shapes the API server rejects.
    let bad: Value = serde_json::json!({
        "type": "object",
        "properties": {
            "untyped": {"description": "no type"},
            "ref": {"$ref": "#/definitions/x", "type": "object"},
            "both": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
            "list": {"type": "array", "items": {"properties": {}}},
            "union": {"type": "string", "anyOf": [{"type": "string"}]},
            "ok": {"x-kubernetes-int-or-string": true}
        }
    });
    let mut errors = Vec::new();
    check_structural(&bad, "x", &mut errors);
    for expected in [
        "x.untyped: no type",
        "x.ref: $ref is not allowed",
        "x.both: both properties and additionalProperties",
        "x.list[]: no type",
        "x.union.anyOf[0]: type is not allowed",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "missing {expected:?} in {errors:#?}"
        );
    }
    assert_eq!(errors.len(), 5, "{errors:#?}");
}

#[test]
fn crds_are_v1_with_subresources_and_columns() {
    for name in CRD_NAMES {
        let crd = crd_json(name);
        assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1", "{name}");
        assert_eq!(crd["spec"]["group"], "etcdfleet.dev");
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 2);
        assert_eq!(versions[0]["name"], "v1beta1");
        assert_eq!(versions[0]["served"], true);
        assert_eq!(versions[0]["storage"], true);
        // v1alpha1 (v0.1.0's) is served beside it, deprecated, with the
        // identical schema, subresources and columns: the API server
        // converts by rewriting apiVersion, no webhook.
        assert_eq!(versions[1]["name"], "v1alpha1");
        assert_eq!(versions[1]["served"], true);
        assert_eq!(versions[1]["storage"], false);
        assert_eq!(versions[1]["deprecated"], true);
        for field in ["schema", "subresources", "additionalPrinterColumns"] {
            assert_eq!(versions[0][field], versions[1][field], "{name}: {field}");
        }
        assert!(
            crd["spec"]["conversion"].is_null() || crd["spec"]["conversion"]["strategy"] == "None"
        );
        let columns = versions[0]["additionalPrinterColumns"].as_array().unwrap();
        assert!(
            columns.iter().any(|c| c["name"] == "Version")
                && columns.iter().any(|c| c["name"] == "Replicas")
                && columns.iter().any(|c| c["name"] == "Age"),
            "{name}: {columns:?}"
        );
        assert_eq!(crd["spec"]["names"]["categories"][0], "etcdfleet");
    }

    let cluster = crd_json("etcdclusters.etcdfleet.dev");
    assert_eq!(cluster["spec"]["scope"], "Namespaced");
    let v = &cluster["spec"]["versions"][0];
    assert!(
        v["subresources"]["status"].is_object(),
        "status subresource"
    );
    assert_eq!(
        v["subresources"]["scale"],
        serde_json::json!({
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector"
        })
    );
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Replicas", "Ready", "Version", "Available", "Age"]
    );

    assert_eq!(
        crd_json("etcdtemplates.etcdfleet.dev")["spec"]["scope"],
        "Namespaced"
    );
    assert_eq!(
        crd_json("clusteretcdtemplates.etcdfleet.dev")["spec"]["scope"],
        "Cluster"
    );
}

// ---- CEL rules, evaluated client-side with kube's CEL ----

const CLUSTER_HEAD: &str = "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata: {name: shop, namespace: team-shop}
spec:
";

fn cluster(spec: &str) -> EtcdCluster {
    etcdfleet_api::yaml::from_str(&format!("{CLUSTER_HEAD}{spec}")).unwrap()
}

fn with_ref(spec: &str) -> EtcdCluster {
    cluster(&format!("  clusterRef: {{name: shop}}\n{spec}"))
}

/// The error messages of a failed validation (empty when it passed).
fn messages<E: std::fmt::Display>(result: Result<(), E>) -> String {
    match result {
        Ok(()) => String::new(),
        Err(err) => err.to_string(),
    }
}

const REPLICAS_MSG: &str = "spec.replicas: replicas must be odd and between 1 and 7 (1, 3, 5 or 7)";
const VERSION_MSG: &str =
    "spec.version: version must be a full semantic version MAJOR.MINOR.PATCH, e.g. 3.5.1";

#[test]
fn cel_replicas_odd_between_1_and_7() {
    for ok in [1, 3, 5, 7] {
        let result = with_ref(&format!("  replicas: {ok}\n")).validate_cel();
        assert!(result.is_ok(), "replicas {ok}: {}", messages(result));
    }
    for bad in [-1, 0, 2, 4, 6, 8, 9] {
        let msg = messages(with_ref(&format!("  replicas: {bad}\n")).validate_cel());
        assert!(msg.contains(REPLICAS_MSG), "replicas {bad}: {msg:?}");
    }
}

#[test]
fn cel_version_must_be_etcd_3() {
    for bad in ["4.0.0", "10.20.30", "2.3.8"] {
        let msg = messages(with_ref(&format!("  version: '{bad}'\n")).validate_cel());
        assert!(
            msg.contains("version must be an etcd 3 version"),
            "{bad:?}: {msg:?}"
        );
    }
}

#[test]
fn cel_version_must_be_full_semver() {
    for ok in ["3.5.1", "3.4.23", "3.6.0", "3.10.20"] {
        let result = with_ref(&format!("  version: '{ok}'\n")).validate_cel();
        assert!(result.is_ok(), "{ok}: {}", messages(result));
    }
    for bad in [
        "3.5",
        "latest",
        "v3.5.1",
        "3.5.1.2",
        "3.5.1-rc.0",
        "03.5.1",
        "",
        "3.5.1 ",
    ] {
        let msg = messages(with_ref(&format!("  version: '{bad}'\n")).validate_cel());
        assert!(msg.contains(VERSION_MSG), "{bad:?}: {msg:?}");
    }
}

#[test]
fn cel_exactly_one_way_to_reach_the_workload_cluster() {
    const MSG: &str = "spec: exactly one of clusterRef or kubeconfigSecretRef must be set";
    assert!(
        cluster("  clusterRef: {name: shop}\n")
            .validate_cel()
            .is_ok()
    );
    assert!(
        cluster("  kubeconfigSecretRef: {name: shop-admin, key: kubeconfig}\n")
            .validate_cel()
            .is_ok()
    );
    let both = cluster("  clusterRef: {name: shop}\n  kubeconfigSecretRef: {name: shop-admin}\n");
    assert!(messages(both.validate_cel()).contains(MSG));
    let neither = cluster("  replicas: 3\n");
    assert!(messages(neither.validate_cel()).contains(MSG));
}

/// Issue 52: a reference name goes into a request path, so it must be an
/// object name: not empty, no `/`, no `..`, nothing uppercase.
#[test]
fn cel_a_tenants_reference_names_must_be_object_names() {
    for bad in ["''", "'../../kube-system/secrets/x'", "Shop", "'a/b'"] {
        let cases = [
            (
                format!("  clusterRef: {{name: {bad}}}\n"),
                "spec.clusterRef.name: clusterRef.name must be an object name",
            ),
            (
                format!("  kubeconfigSecretRef: {{name: {bad}}}\n"),
                "spec.kubeconfigSecretRef.name: kubeconfigSecretRef.name must be an object name",
            ),
            (
                format!(
                    "  clusterRef: {{name: shop}}\n  templateRef: {{kind: ClusterEtcdTemplate, name: {bad}}}\n"
                ),
                "spec.templateRef.name: templateRef.name must be an object name",
            ),
        ];
        for (spec, expected) in cases {
            let msg = messages(cluster(&spec).validate_cel());
            assert!(msg.contains(expected), "{spec}: {msg:?}");
        }
    }
    let key = "  kubeconfigSecretRef: {name: shop-admin, key: '../x'}\n";
    let msg = messages(cluster(key).validate_cel());
    assert!(
        msg.contains("kubeconfigSecretRef.key must be a Secret key"),
        "{msg}"
    );
    let fine = "  kubeconfigSecretRef: {name: shop.admin-1, key: admin.conf}\n";
    assert!(cluster(fine).validate_cel().is_ok());
}

#[test]
fn cel_storage_class_and_size_may_change_but_not_be_removed_once_set() {
    const CLASS_MSG: &str =
        "spec.storage.storageClassName: storage.storageClassName cannot be removed once set";
    const SIZE_MSG: &str = "spec.storage.size: storage.size cannot be removed once set";
    let unset = with_ref("");
    let set = with_ref("  storage: {storageClassName: fast, size: 20Gi}\n");

    // Set the first time (by the user or by materialization): allowed.
    assert!(set.validate_cel_update(&unset).is_ok());
    let half = with_ref("  storage: {size: 20Gi}\n");
    assert!(set.validate_cel_update(&half).is_ok(), "class added later");
    // Unchanged: allowed. A new size too: the controller grows the volumes
    // and refuses a shrink itself (it compares the quantities).
    assert!(set.validate_cel_update(&set).is_ok());
    let grown = with_ref("  storage: {storageClassName: fast, size: 40Gi}\n");
    assert!(grown.validate_cel_update(&set).is_ok());
    // Another class: the controller moves the members to it.
    let moved = with_ref("  storage: {storageClassName: slow, size: 20Gi}\n");
    assert!(moved.validate_cel_update(&set).is_ok());

    let cases = [
        ("  storage: {size: 20Gi}\n", vec![CLASS_MSG]),
        ("  storage: {storageClassName: fast}\n", vec![SIZE_MSG]),
        ("", vec![CLASS_MSG, SIZE_MSG]),
    ];
    for (spec, expected) in cases {
        let msg = messages(with_ref(spec).validate_cel_update(&set));
        for e in &expected {
            assert!(msg.contains(e), "{spec:?}: {msg:?}");
        }
        assert!(
            msg.starts_with(&format!("{} validation error(s)", expected.len())),
            "{msg}"
        );
    }
}

#[test]
fn cel_tuning_and_backup_bounds() {
    let cases = [
        (
            "  etcd: {heartbeatIntervalMillis: 5}\n",
            "heartbeatIntervalMillis must be between 10 and 5000",
        ),
        (
            "  etcd: {electionTimeoutMillis: 60000}\n",
            "electionTimeoutMillis must be between 50 and 50000",
        ),
        ("  backup: {retention: 0}\n", "retention must be at least 1"),
        (
            "  recovery: {quorumLoss: FromSurvivors, lostAfterSeconds: 10}\n",
            "lostAfterSeconds must be between 30 and 604800",
        ),
    ];
    for (spec, expected) in cases {
        let msg = messages(with_ref(spec).validate_cel());
        assert!(msg.contains(expected), "{spec}: {msg:?}");
    }
    assert!(
        with_ref("  etcd: {heartbeatIntervalMillis: 100, electionTimeoutMillis: 1000}\n  backup: {retention: 1}\n")
            .validate_cel()
            .is_ok()
    );
    assert!(
        with_ref("  recovery: {quorumLoss: FromSurvivors, lostAfterSeconds: 30}\n")
            .validate_cel()
            .is_ok()
    );
}

#[test]
fn cel_rules_apply_to_templates_too() {
    let t: EtcdTemplate = etcdfleet_api::yaml::from_str(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdTemplate\nmetadata: {name: t, namespace: n}\nspec: {baseTemplate: ha-3, version: '3.5', replicas: 4}\n",
    )
    .unwrap();
    let msg = messages(t.validate_cel());
    assert!(
        msg.contains(REPLICAS_MSG) && msg.contains(VERSION_MSG),
        "{msg}"
    );

    let ct: ClusterEtcdTemplate = etcdfleet_api::yaml::from_str(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: ClusterEtcdTemplate\nmetadata: {name: ct}\nspec: {version: latest, replicas: 2}\n",
    )
    .unwrap();
    let msg = messages(ct.validate_cel());
    assert!(
        msg.contains(REPLICAS_MSG) && msg.contains(VERSION_MSG),
        "{msg}"
    );

    // Templates need no workload cluster, and their storage may be edited:
    // editing a template never changes an existing cluster.
    let old: ClusterEtcdTemplate = etcdfleet_api::yaml::from_str(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: ClusterEtcdTemplate\nmetadata: {name: ct}\nspec: {version: 3.5.1, replicas: 3, storage: {storageClassName: a, size: 8Gi}}\n",
    )
    .unwrap();
    let new: ClusterEtcdTemplate = etcdfleet_api::yaml::from_str(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: ClusterEtcdTemplate\nmetadata: {name: ct}\nspec: {version: 3.5.1, replicas: 3, storage: {storageClassName: b, size: 16Gi}}\n",
    )
    .unwrap();
    assert!(old.validate_cel().is_ok());
    let result = new.validate_cel_update(&old);
    assert!(result.is_ok(), "{}", messages(result));
}

// ---- backups ----

#[test]
fn backup_crds_are_namespaced_with_status_and_columns() {
    let backup = crd_json("etcdbackups.etcdfleet.dev");
    assert_eq!(backup["spec"]["scope"], "Namespaced");
    let v = &backup["spec"]["versions"][0];
    assert!(v["subresources"]["status"].is_object());
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Cluster", "Phase", "Size", "Revision", "Drill", "Age"]
    );

    let schedule = crd_json("etcdbackupschedules.etcdfleet.dev");
    assert_eq!(schedule["spec"]["scope"], "Namespaced");
    let v = &schedule["spec"]["versions"][0];
    assert!(v["subresources"]["status"].is_object());
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Cluster",
            "Schedule",
            "Suspend",
            "LastSuccess",
            "NextRun",
            "Drill",
            "Age"
        ]
    );
}

fn backup(spec: &str) -> etcdfleet_api::EtcdBackup {
    etcdfleet_api::yaml::from_str(&format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdBackup\nmetadata: {{name: b, namespace: n}}\nspec:\n{spec}"
    ))
    .unwrap()
}

fn backup_schedule(spec: &str) -> etcdfleet_api::EtcdBackupSchedule {
    etcdfleet_api::yaml::from_str(&format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdBackupSchedule\nmetadata: {{name: s, namespace: n}}\nspec:\n{spec}"
    ))
    .unwrap()
}

#[test]
fn cel_backup_destination_is_a_bucket_or_a_path_and_spec_is_immutable() {
    const DEST_MSG: &str =
        "exactly one of bucket (S3-compatible store) or path (local directory) must be set";
    assert!(
        backup("  clusterName: shop\n  destination: {bucket: b}\n")
            .validate_cel()
            .is_ok()
    );
    assert!(
        backup("  clusterName: shop\n  destination: {path: /var/backups}\n")
            .validate_cel()
            .is_ok()
    );
    assert!(backup("  clusterName: shop\n").validate_cel().is_ok());
    for bad in ["{}", "{bucket: b, path: /x}"] {
        let msg = messages(
            backup(&format!("  clusterName: shop\n  destination: {bad}\n")).validate_cel(),
        );
        assert!(msg.contains(DEST_MSG), "{bad}: {msg}");
    }
    let msg =
        messages(backup("  clusterName: shop\n  destination: {path: relative}\n").validate_cel());
    assert!(msg.contains("path must be absolute"), "{msg}");
    let msg = messages(backup("  clusterName: ''\n").validate_cel());
    assert!(msg.contains("clusterName must be an object name"), "{msg}");
    let msg = messages(backup("  clusterName: '../other'\n").validate_cel());
    assert!(msg.contains("clusterName must be an object name"), "{msg}");
    let to = "  clusterName: shop\n  destination: {bucket: b, credentialsSecretName: '../x'}\n";
    let msg = messages(backup(to).validate_cel());
    assert!(
        msg.contains("credentialsSecretName must be an object name"),
        "{msg}"
    );

    let old = backup("  clusterName: shop\n");
    let retargeted = backup("  clusterName: other\n");
    let msg = messages(retargeted.validate_cel_update(&old));
    assert!(msg.contains("spec of an EtcdBackup is immutable"), "{msg}");
    assert!(old.validate_cel_update(&old).is_ok());
}

#[test]
fn cel_backup_schedule_fields() {
    assert!(
        backup_schedule(
            "  clusterName: shop\n  schedule: '0 */6 * * *'\n  retention: {count: 3, maxAge: 72h}\n"
        )
        .validate_cel()
        .is_ok()
    );
    let cases = [
        (
            "  clusterName: shop\n  schedule: '@daily'\n",
            "schedule must have five space-separated cron fields",
        ),
        (
            "  clusterName: shop\n  schedule: '0 0 * * * *'\n",
            "schedule must have five space-separated cron fields",
        ),
        (
            "  clusterName: shop\n  retention: {count: 0}\n",
            "retention.count must be at least 1",
        ),
        (
            "  clusterName: shop\n  retention: {maxAge: 3w}\n",
            "retention.maxAge must be a positive whole number",
        ),
        (
            "  clusterName: shop\n  destination: {}\n",
            "exactly one of bucket",
        ),
    ];
    for (spec, expected) in cases {
        let msg = messages(backup_schedule(spec).validate_cel());
        assert!(msg.contains(expected), "{spec}: {msg}");
    }
    // The cluster's backup defaults carry the same rules.
    let msg = messages(with_ref("  backup: {retentionMaxAge: 0h}\n").validate_cel());
    assert!(msg.contains("must be a positive whole number"), "{msg}");
}

#[test]
fn cel_identity_fields_are_immutable_once_set() {
    const NS_MSG: &str = "spec.workloadNamespace: workloadNamespace is immutable once set";
    const REF_MSG: &str = "spec.clusterRef: clusterRef is immutable once set";
    const SECRET_MSG: &str = "spec.kubeconfigSecretRef: kubeconfigSecretRef is immutable once set";
    const TLS_MSG: &str = "spec.tls.enabled: tls.enabled is immutable once set";
    let running = with_ref("  workloadNamespace: etcd-system\n  tls: {enabled: true}\n");
    assert!(running.validate_cel_update(&running).is_ok());
    // Set for the first time: allowed here (the controller's recorded
    // status.identity refuses a value that differs from what it manages).
    assert!(running.validate_cel_update(&with_ref("")).is_ok());

    let cases = [
        (
            with_ref("  workloadNamespace: elsewhere\n  tls: {enabled: true}\n"),
            NS_MSG,
        ),
        (with_ref("  tls: {enabled: true}\n"), NS_MSG),
        (
            with_ref("  workloadNamespace: etcd-system\n  tls: {enabled: false}\n"),
            TLS_MSG,
        ),
        (with_ref("  workloadNamespace: etcd-system\n"), TLS_MSG),
        (
            cluster(
                "  clusterRef: {name: other}\n  workloadNamespace: etcd-system\n  tls: {enabled: true}\n",
            ),
            REF_MSG,
        ),
    ];
    for (new, expected) in cases {
        let msg = messages(new.validate_cel_update(&running));
        assert!(msg.contains(expected), "{:?}: {msg:?}", new.spec);
    }
    let by_secret = cluster("  kubeconfigSecretRef: {name: shop-admin, key: kubeconfig}\n");
    let moved = cluster("  kubeconfigSecretRef: {name: other-admin, key: kubeconfig}\n");
    assert!(messages(moved.validate_cel_update(&by_secret)).contains(SECRET_MSG));
    // Switching from clusterRef to an explicit Secret moves the cluster too.
    assert!(messages(by_secret.validate_cel_update(&with_ref(""))).contains(REF_MSG));
}

#[test]
fn cel_restore_names_a_backup_or_a_checked_object() {
    let sha = "a".repeat(64);
    let by_backup = with_ref("  bootstrap: {restore: {backupName: nightly}}\n");
    assert!(
        by_backup.validate_cel().is_ok(),
        "{}",
        messages(by_backup.validate_cel())
    );
    let direct = with_ref(&format!(
        "  bootstrap:\n    restore:\n      destination: {{path: /backups}}\n      objectKey: shop/1.db\n      sha256: {sha}\n      sizeBytes: 42\n"
    ));
    assert!(
        direct.validate_cel().is_ok(),
        "{}",
        messages(direct.validate_cel())
    );

    let cases = [
        (
            "  bootstrap: {restore: {}}\n".to_string(),
            "exactly one of backupName (an EtcdBackup) or objectKey",
        ),
        (
            format!(
                "  bootstrap: {{restore: {{backupName: b, objectKey: k, destination: {{path: /b}}, sha256: {sha}}}}}\n"
            ),
            "exactly one of backupName",
        ),
        (
            "  bootstrap: {restore: {objectKey: shop/1.db, destination: {path: /b}}}\n".to_string(),
            "objectKey needs destination and sha256",
        ),
        (
            format!("  bootstrap: {{restore: {{backupName: b, sha256: {sha}}}}}\n"),
            "with backupName, destination, sha256 and sizeBytes come from the EtcdBackup",
        ),
        (
            "  bootstrap: {restore: {objectKey: k, destination: {path: /b}, sha256: ABC}}\n"
                .to_string(),
            "sha256 must be 64 lowercase hex digits",
        ),
        (
            "  bootstrap: {restore: {backupName: ''}}\n".to_string(),
            "backupName must be an object name",
        ),
    ];
    for (spec, expected) in cases {
        let msg = messages(with_ref(&spec).validate_cel());
        assert!(msg.contains(expected), "{spec:?}: {msg:?}");
    }
}

#[test]
fn cel_bootstrap_is_set_only_at_creation() {
    const MSG: &str = "spec.bootstrap: bootstrap is immutable: it can be set only when the EtcdCluster is created";
    let plain = with_ref("");
    let restored = with_ref("  bootstrap: {restore: {backupName: nightly}}\n");
    assert!(restored.validate_cel_update(&restored).is_ok());
    assert!(plain.validate_cel_update(&plain).is_ok());
    let other = with_ref("  bootstrap: {restore: {backupName: weekly}}\n");
    for (new, old, what) in [
        (&restored, &plain, "added to a running cluster"),
        (&plain, &restored, "removed"),
        (&other, &restored, "retargeted"),
    ] {
        let msg = messages(new.validate_cel_update(old));
        assert!(msg.contains(MSG), "{what}: {msg:?}");
    }
}

#[test]
fn cel_join_names_client_urls_and_is_set_only_at_creation() {
    let join = with_ref(
        "  bootstrap:\n    join:\n      endpoints: [\"https://etcd-0.etcd.etcd-system.svc:2379\"]\n      credentialsSecretName: etcd-ca\n",
    );
    assert!(
        join.validate_cel().is_ok(),
        "{}",
        messages(join.validate_cel())
    );
    let cases = [
        (
            "  bootstrap: {join: {endpoints: [\"etcd-0:2379\"]}}\n",
            "endpoints must be client URLs",
        ),
        (
            "  bootstrap: {join: {endpoints: [\"https://etcd-0:2379/path\"]}}\n",
            "endpoints must be client URLs",
        ),
        (
            "  bootstrap: {join: {endpoints: [\"https://e:2379\"], credentialsSecretName: ''}}\n",
            "credentialsSecretName must be an object name",
        ),
        (
            "  bootstrap: {restore: {backupName: b}, join: {endpoints: [\"https://e:2379\"]}}\n",
            "bootstrap takes restore or join, not both",
        ),
    ];
    for (spec, expected) in cases {
        let msg = messages(with_ref(spec).validate_cel());
        assert!(msg.contains(expected), "{spec:?}: {msg:?}");
    }
    // A join is identity: never added, removed or retargeted later.
    const MSG: &str = "bootstrap is immutable: it can be set only when the EtcdCluster is created";
    let plain = with_ref("");
    let other = with_ref("  bootstrap: {join: {endpoints: [\"https://other:2379\"]}}\n");
    for (new, old) in [(&join, &plain), (&plain, &join), (&other, &join)] {
        assert!(messages(new.validate_cel_update(old)).contains(MSG));
    }
}

#[test]
fn the_rollout_crd_is_cluster_scoped_with_status_and_columns() {
    let rollout = crd_json(ROLLOUT_CRD_NAME);
    assert_eq!(rollout["spec"]["scope"], "Cluster");
    assert_eq!(rollout["spec"]["names"]["shortNames"][0], "etcdfr");
    let v = &rollout["spec"]["versions"][0];
    assert!(v["subresources"]["status"].is_object());
    let columns: Vec<(&str, &str)> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Done", ".status.progress"),
            ("Wave", ".status.currentWave"),
            ("State", ".status.phase"),
            (
                "Message",
                ".status.conditions[?(@.type==\"Progressing\")].message"
            ),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

fn rollout(spec: &str) -> etcdfleet_api::EtcdFleetRollout {
    etcdfleet_api::yaml::from_str(&format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdFleetRollout\nmetadata: {{name: r}}\nspec:\n{spec}"
    ))
    .unwrap()
}

#[test]
fn cel_a_rollout_changes_something_fixed_and_cannot_be_unaborted() {
    let ok = rollout("  version: 3.5.35\n  strategy: {canary: 1, wavePercent: 25, soak: 10m}\n");
    assert!(
        ok.validate_cel().is_ok(),
        "{:?}",
        messages(ok.validate_cel())
    );
    let cases = [
        ("  selector: {}\n", "a rollout changes something"),
        (
            "  version: v3.5\n",
            "version must be a full semantic version",
        ),
        (
            "  version: 3.5.35\n  strategy: {waveSize: 2, wavePercent: 25}\n",
            "set at most one of waveSize and wavePercent",
        ),
        (
            "  version: 3.5.35\n  strategy: {canary: 0}\n",
            "canary must be at least 1",
        ),
        (
            "  version: 3.5.35\n  strategy: {wavePercent: 101}\n",
            "wavePercent must be between 1 and 100",
        ),
        (
            "  version: 3.5.35\n  strategy: {soak: soon}\n",
            "soak must be a positive whole number",
        ),
        (
            "  version: 3.5.35\n  strategy: {maintenanceWindow: {schedule: '@daily', duration: 4h}}\n",
            "schedule must have five space-separated cron fields",
        ),
    ];
    for (spec, expected) in cases {
        let msg = messages(rollout(spec).validate_cel());
        assert!(msg.contains(expected), "{spec}: {msg}");
    }
    let old = rollout("  version: 3.5.35\n");
    let msg = messages(rollout("  version: 3.5.36\n").validate_cel_update(&old));
    assert!(msg.contains("version is immutable"), "{msg}");
    let msg = messages(
        rollout("  version: 3.5.35\n  templateRef: {kind: ClusterEtcdTemplate, name: ha-3}\n")
            .validate_cel_update(&old),
    );
    assert!(msg.contains("templateRef is immutable"), "{msg}");
    let aborted = rollout("  version: 3.5.35\n  abort: true\n");
    assert!(aborted.validate_cel_update(&old).is_ok());
    let msg =
        messages(rollout("  version: 3.5.35\n  abort: false\n").validate_cel_update(&aborted));
    assert!(msg.contains("abort cannot be undone"), "{msg}");
    // Pausing and excluding stay possible.
    let paused =
        rollout("  version: 3.5.35\n  paused: true\n  selector: {exclude: [team-a/shop]}\n");
    assert!(paused.validate_cel_update(&old).is_ok());
}
