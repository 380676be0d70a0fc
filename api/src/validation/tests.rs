//! Table-driven checks of `validate_object` on the project's own CRDs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::*;
use crate::{ClusterEtcdTemplate, EtcdCluster, EtcdTemplate};

fn cluster_crd() -> CustomResourceDefinition {
    EtcdCluster::crd()
}

fn cluster(spec: Value) -> Value {
    json!({
        "apiVersion": "etcdfleet.dev/v1beta1",
        "kind": "EtcdCluster",
        "metadata": { "name": "shop", "namespace": "fleet" },
        "spec": spec,
    })
}

fn good_spec() -> Value {
    json!({
        "clusterRef": { "name": "shop" },
        "version": "3.5.1",
        "replicas": 3,
        "imageRepository": "gcr.io/etcd-development/etcd",
        "storage": { "size": "8Gi", "storageClassName": "fast" },
        "etcd": { "autoCompactionRetention": "1h", "heartbeatIntervalMillis": 100 },
    })
}

fn with(path: &str, value: Value) -> Value {
    let mut spec = good_spec();
    let mut node = &mut spec;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        node = node
            .as_object_mut()
            .unwrap()
            .entry(part.to_string())
            .or_insert_with(|| json!({}));
    }
    let last = parts[parts.len() - 1];
    if value.is_null() {
        node.as_object_mut().unwrap().remove(last);
    } else {
        node[last] = value;
    }
    cluster(spec)
}

fn errors_of(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    match validate_object(&cluster_crd(), obj, old) {
        Ok(v) => panic!("expected a rejection, got {:?}", v.object),
        Err(errors) => errors,
    }
}

#[test]
fn a_well_formed_cluster_is_accepted_unchanged() {
    let obj = cluster(good_spec());
    let validated = validate_object(&cluster_crd(), &obj, None).unwrap();
    assert_eq!(validated.object, obj);
    assert!(validated.unknown_fields.is_empty());
    // Each project kind validates its own examples.
    for (crd, obj) in [
        (
            EtcdTemplate::crd(),
            json!({ "apiVersion": "etcdfleet.dev/v1beta1", "kind": "EtcdTemplate",
                "metadata": { "name": "small", "namespace": "fleet" }, "spec": { "replicas": 3 } }),
        ),
        (
            ClusterEtcdTemplate::crd(),
            json!({ "apiVersion": "etcdfleet.dev/v1beta1", "kind": "ClusterEtcdTemplate",
                "metadata": { "name": "base" }, "spec": { "version": "3.5.1" } }),
        ),
    ] {
        validate_object(&crd, &obj, None).unwrap();
    }
}

/// (what is wrong, object, field, reason, message)
type Case = (
    &'static str,
    Value,
    &'static str,
    &'static str,
    &'static str,
);

#[test]
fn each_kind_of_rule_rejects_with_the_api_servers_field_error() {
    let cases: Vec<Case> = vec![
        (
            "wrong apiVersion",
            {
                let mut o = cluster(good_spec());
                o["apiVersion"] = json!("etcdfleet.dev/v9");
                o
            },
            "apiVersion",
            "FieldValueNotSupported",
            "Unsupported value: \"etcdfleet.dev/v9\": supported values: \"etcdfleet.dev/v1beta1\"",
        ),
        (
            "wrong kind",
            {
                let mut o = cluster(good_spec());
                o["kind"] = json!("EtcdTemplate");
                o
            },
            "kind",
            "FieldValueNotSupported",
            "Unsupported value: \"EtcdTemplate\": supported values: \"EtcdCluster\"",
        ),
        (
            "string for an integer",
            with("replicas", json!("three")),
            "spec.replicas",
            "FieldValueTypeInvalid",
            "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"",
        ),
        (
            "integer beyond int64",
            serde_json::from_str(
                &cluster(good_spec())
                    .to_string()
                    .replace("\"replicas\":3", "\"replicas\":99999999999999999999999"),
            )
            .unwrap(),
            "spec.replicas",
            "FieldValueTypeInvalid",
            "Invalid value: \"number\": spec.replicas in body must be of type integer: \"number\"",
        ),
        (
            "integer beyond the int32 format",
            with("replicas", json!(5_000_000_000i64)),
            "spec.replicas",
            "FieldValueInvalid",
            "Invalid value: 5000000000: spec.replicas in body must be of type int32: \"5000000000\"",
        ),
        (
            "null for a field that is not nullable",
            {
                let mut o = cluster(good_spec());
                o["spec"]["clusterRef"]["name"] = Value::Null;
                o
            },
            "spec.clusterRef.name",
            "FieldValueTypeInvalid",
            "Invalid value: \"null\": spec.clusterRef.name in body must be of type string: \"null\"",
        ),
        (
            "required field missing",
            with("clusterRef", json!({})),
            "spec.clusterRef.name",
            "FieldValueRequired",
            "Required value",
        ),
        (
            "enum",
            with("templateRef", json!({ "kind": "Template", "name": "x" })),
            "spec.templateRef.kind",
            "FieldValueNotSupported",
            "Unsupported value: \"Template\": supported values: \"EtcdTemplate\", \"ClusterEtcdTemplate\"",
        ),
        (
            "int-or-string given a boolean",
            with("storage.size", json!(true)),
            "spec.storage.size",
            "FieldValueTypeInvalid",
            "Invalid value: \"boolean\": spec.storage.size in body must be of type integer,string: \"boolean\"",
        ),
        (
            "CEL rule on an integer",
            with("replicas", json!(4)),
            "spec.replicas",
            "FieldValueInvalid",
            "Invalid value: \"integer\": replicas must be odd and between 1 and 7 (1, 3, 5 or 7)",
        ),
        (
            "CEL rule on the spec: both cluster references",
            with("kubeconfigSecretRef", json!({ "name": "kc" })),
            "spec",
            "FieldValueInvalid",
            "Invalid value: \"object\": exactly one of clusterRef or kubeconfigSecretRef must be set",
        ),
        (
            "CEL rule on the spec: no cluster reference",
            with("clusterRef", Value::Null),
            "spec",
            "FieldValueInvalid",
            "Invalid value: \"object\": exactly one of clusterRef or kubeconfigSecretRef must be set",
        ),
        (
            "quantity rule",
            with("storage.size", json!("lots")),
            "spec.storage.size",
            "FieldValueInvalid",
            "Invalid value: \"string\": size must be a positive quantity such as 8Gi",
        ),
        (
            "image repository rule",
            with("imageRepository", json!("not a repo!!")),
            "spec.imageRepository",
            "FieldValueInvalid",
            "Invalid value: \"string\": imageRepository must be an image repository without tag, e.g. gcr.io/etcd-development/etcd",
        ),
        (
            "duration rule",
            with("etcd.autoCompactionRetention", json!("forever")),
            "spec.etcd.autoCompactionRetention",
            "FieldValueInvalid",
            "Invalid value: \"string\": autoCompactionRetention must be a number of hours or a duration such as 1h or 30m",
        ),
        (
            "major version other than 3",
            with("version", json!("4.0.0")),
            "spec.version",
            "FieldValueInvalid",
            "Invalid value: \"string\": version must be an etcd 3 version (3.MINOR.PATCH)",
        ),
        (
            "metadata.name not a DNS subdomain",
            {
                let mut o = cluster(good_spec());
                o["metadata"]["name"] = json!("Shop_1");
                o
            },
            "metadata.name",
            "FieldValueInvalid",
            "Invalid value: \"Shop_1\": a lowercase RFC 1123 subdomain must consist of",
        ),
        (
            "metadata.name missing",
            {
                let mut o = cluster(good_spec());
                o["metadata"] = json!({ "namespace": "fleet" });
                o
            },
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ),
    ];
    for (what, obj, field, reason, message) in cases {
        let errors = errors_of(&obj, None);
        let found = errors.iter().find(|e| e.field == field);
        let Some(found) = found else {
            panic!("{what}: no error on {field}: {errors:?}");
        };
        assert_eq!(found.reason, reason, "{what}: {found:?}");
        assert!(
            found.message.starts_with(message),
            "{what}: message {:?} does not start with {message:?}",
            found.message
        );
    }
}

#[test]
fn accepted_forms_of_the_new_rules() {
    for (path, value) in [
        ("storage.size", json!(8589934592i64)),
        ("storage.size", json!("500Mi")),
        ("storage.size", json!("1.5G")),
        ("imageRepository", json!("localhost:5000/etcd")),
        ("imageRepository", json!("quay.io/coreos/etcd")),
        ("imageRepository", json!("registry.k8s.io/etcd")),
        ("etcd.autoCompactionRetention", json!("0")),
        ("etcd.autoCompactionRetention", json!("12")),
        ("etcd.autoCompactionRetention", json!("1h30m")),
        ("version", json!("3.6.0")),
    ] {
        if let Err(e) = validate_object(&cluster_crd(), &with(path, value.clone()), None) {
            panic!("{path}={value} rejected: {e:?}");
        }
    }
    for (path, value) in [
        ("imageRepository", json!("etcd:v3.5.1")),
        ("imageRepository", json!("Gcr.io/Etcd")),
        ("version", json!("30.1.0")),
    ] {
        assert!(
            validate_object(&cluster_crd(), &with(path, value.clone()), None).is_err(),
            "{path}={value} accepted"
        );
    }
}

#[test]
fn unknown_fields_are_pruned_and_reported() {
    let mut obj = cluster(good_spec());
    obj["spec"]["replicsa"] = json!(3);
    obj["spec"]["storage"]["sise"] = json!("1Gi");
    obj["extra"] = json!(true);
    let validated = validate_object(&cluster_crd(), &obj, None).unwrap();
    assert_eq!(validated.object, cluster(good_spec()));
    let mut unknown = validated.unknown_fields.clone();
    unknown.sort();
    assert_eq!(unknown, ["extra", "spec.replicsa", "spec.storage.sise"]);
}

#[test]
fn maps_and_preserved_fields_keep_their_keys() {
    let mut obj = cluster(good_spec());
    obj["spec"]["podTemplate"] =
        json!({ "labels": { "team": "shop" }, "annotations": { "a": "b" } });
    obj["spec"]["resources"] = json!({ "requests": { "cpu": "100m" } });
    let validated = validate_object(&cluster_crd(), &obj, None).unwrap();
    assert!(
        validated.unknown_fields.is_empty(),
        "{:?}",
        validated.unknown_fields
    );
    assert_eq!(
        validated.object["spec"]["podTemplate"]["labels"]["team"],
        "shop"
    );
    assert_eq!(
        validated.object["spec"]["resources"]["requests"]["cpu"],
        "100m"
    );
}

#[test]
fn storage_size_may_change_but_not_be_removed_by_a_transition_rule() {
    let old = cluster(good_spec());
    // A new size passes the schema (the controller grows the volumes, and
    // refuses a shrink itself: it compares the quantities).
    let changed = with("storage.size", json!("16Gi"));
    validate_object(&cluster_crd(), &changed, Some(&old)).unwrap();
    let mut no_size = cluster(good_spec());
    no_size["spec"]["storage"]
        .as_object_mut()
        .unwrap()
        .remove("size");
    let errors = errors_of(&no_size, Some(&old));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field, "spec.storage.size");
    assert_eq!(
        errors[0].message,
        "Invalid value: \"object\": storage.size cannot be removed once set"
    );
    // Removing it is a change too; the class has its own rule.
    let mut removed = cluster(good_spec());
    removed["spec"].as_object_mut().unwrap().remove("storage");
    let fields: Vec<String> = errors_of(&removed, Some(&old))
        .into_iter()
        .map(|e| e.field)
        .collect();
    assert!(
        fields.contains(&"spec.storage.size".to_string()),
        "{fields:?}"
    );
    assert!(
        fields.contains(&"spec.storage.storageClassName".to_string()),
        "{fields:?}"
    );
    // Setting it the first time, and keeping it, are allowed; on create the rule does not run.
    let mut unset = cluster(good_spec());
    unset["spec"].as_object_mut().unwrap().remove("storage");
    validate_object(&cluster_crd(), &old, Some(&unset)).unwrap();
    validate_object(&cluster_crd(), &old, Some(&old)).unwrap();
    validate_object(&cluster_crd(), &changed, None).unwrap();
}

#[test]
fn schema_keywords_the_project_crds_do_not_use_yet_are_enforced() {
    // A CRD built from the project's with a richer schema on one version.
    let mut crd = cluster_crd();
    let schema = json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 8,
                "properties": {
                    "name": { "type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$" },
                    "count": { "type": "integer", "minimum": 1, "maximum": 10, "exclusiveMaximum": true },
                    "ratio": { "type": "number", "minimum": 0, "exclusiveMinimum": true },
                    "tags": { "type": "array", "maxItems": 2, "minItems": 1, "uniqueItems": true, "items": { "type": "string" } },
                    "ports": { "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port"],
                        "items": { "type": "object", "properties": { "port": { "type": "integer" } } } },
                    "when": { "type": "string", "format": "date-time" },
                    "free": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                    "flag": { "type": "boolean" },
                }
            }
        }
    });
    crd.spec.versions[0]
        .schema
        .as_mut()
        .unwrap()
        .open_api_v3_schema = Some(serde_json::from_value(schema).unwrap());
    let check = |spec: Value| validate_object(&crd, &cluster(spec), None);
    let ok = check(
        json!({ "name": "ab", "count": 9, "ratio": 0.5, "tags": ["a"],
        "ports": [{ "port": 1 }, { "port": 2 }], "when": "2026-11-22T06:00:00Z",
        "free": { "anything": { "goes": 1 } }, "flag": true }),
    );
    assert!(ok.is_ok(), "{ok:?}");
    let cases: Vec<(Value, &str, &str, &str)> = vec![
        (
            json!({ "name": "toolong" }),
            "spec.name",
            "FieldValueTooLong",
            "Too long: may not be longer than 5",
        ),
        (
            json!({ "name": "a" }),
            "spec.name",
            "FieldValueInvalid",
            "Invalid value: \"a\": spec.name in body should be at least 2 chars long",
        ),
        (
            json!({ "name": "AB" }),
            "spec.name",
            "FieldValueInvalid",
            "Invalid value: \"AB\": spec.name in body should match '^[a-z]+$'",
        ),
        (
            json!({ "count": 10 }),
            "spec.count",
            "FieldValueInvalid",
            "Invalid value: 10: spec.count in body should be less than 10",
        ),
        (
            json!({ "count": 0 }),
            "spec.count",
            "FieldValueInvalid",
            "Invalid value: 0: spec.count in body should be greater than or equal to 1",
        ),
        (
            json!({ "count": 1.5 }),
            "spec.count",
            "FieldValueTypeInvalid",
            "Invalid value: \"number\": spec.count in body must be of type integer: \"number\"",
        ),
        (
            json!({ "ratio": 0 }),
            "spec.ratio",
            "FieldValueInvalid",
            "Invalid value: 0: spec.ratio in body should be greater than 0",
        ),
        (
            json!({ "tags": ["a", "b", "c"] }),
            "spec.tags",
            "FieldValueTooMany",
            "Too many: 3: must have at most 2 items",
        ),
        (
            json!({ "tags": [] }),
            "spec.tags",
            "FieldValueInvalid",
            "Invalid value: 0: spec.tags in body should have at least 1 items",
        ),
        (
            json!({ "tags": ["a", "a"] }),
            "spec.tags[1]",
            "FieldValueDuplicate",
            "Duplicate value: \"a\"",
        ),
        (
            json!({ "ports": [{ "port": 1 }, { "port": 1 }] }),
            "spec.ports[1]",
            "FieldValueDuplicate",
            "Duplicate value: {\"port\":1}",
        ),
        (
            json!({ "when": "yesterday" }),
            "spec.when",
            "FieldValueInvalid",
            "Invalid value: \"yesterday\": spec.when in body must be of type date-time",
        ),
        (
            json!({ "flag": "yes" }),
            "spec.flag",
            "FieldValueTypeInvalid",
            "Invalid value: \"string\": spec.flag in body must be of type boolean",
        ),
        (
            json!({}),
            "spec",
            "FieldValueInvalid",
            "Invalid value: 0: spec in body should have at least 1 properties",
        ),
        (
            json!({ "name": "ab", "count": 1, "ratio": 1, "flag": true, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5 }),
            "spec",
            "FieldValueTooMany",
            "Too many: 9: must have at most 8 items",
        ),
    ];
    for (spec, field, reason, message) in cases {
        let errors = check(spec.clone()).expect_err(&spec.to_string());
        let found = errors.iter().find(|e| e.field == field);
        let Some(found) = found else {
            panic!("{spec}: no error on {field}: {errors:?}");
        };
        assert_eq!(found.reason, reason, "{spec}");
        assert!(
            found.message.starts_with(message),
            "{spec}: {:?}",
            found.message
        );
    }
    // Preserved fields are kept, not reported.
    let kept = check(json!({ "free": { "x": 1 } })).unwrap();
    assert_eq!(kept.object["spec"]["free"]["x"], 1);
    assert!(kept.unknown_fields.is_empty());
}

#[test]
fn invalid_status_is_the_api_servers_422() {
    let errors = errors_of(&with("replicas", json!(4)), None);
    let status = invalid_status("EtcdCluster", "etcdfleet.dev", "shop", &errors);
    assert_eq!(status["code"], 422);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Failure");
    assert_eq!(
        status["message"],
        "EtcdCluster.etcdfleet.dev \"shop\" is invalid: spec.replicas: Invalid value: \"integer\": replicas must be odd and between 1 and 7 (1, 3, 5 or 7)"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "spec.replicas");
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "FieldValueInvalid"
    );
    let two = [
        FieldError {
            field: "a".into(),
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
        },
        FieldError {
            field: "b".into(),
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
        },
    ];
    assert_eq!(
        invalid_status("EtcdCluster", "etcdfleet.dev", "shop", &two)["message"],
        "EtcdCluster.etcdfleet.dev \"shop\" is invalid: [a: Required value, b: Required value]"
    );
}

#[test]
fn the_shipped_crd_yaml_validates_like_the_generated_crd() {
    // The files the API server is given, not only the Rust types.
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/crd/etcdclusters.etcdfleet.dev.yaml"
    ))
    .expect("config/crd is in the repository");
    let crd: CustomResourceDefinition = crate::yaml::from_str(&yaml).expect("a CRD");
    let errors = validate_object(&crd, &with("replicas", json!(4)), None).unwrap_err();
    assert_eq!(errors[0].field, "spec.replicas");
    let errors = validate_object(&crd, &with("storage.size", json!("lots")), None).unwrap_err();
    assert_eq!(
        errors[0].field, "spec.storage.size",
        "the committed YAML has the quantity rule"
    );
    validate_object(&crd, &cluster(good_spec()), None).unwrap();
}
