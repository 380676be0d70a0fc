use serde_json::{Value, json};

use super::*;

const T0: &str = "2026-11-22T06:00:00Z";
const T1: &str = "2026-11-22T06:01:00Z";
const CONTROLLER: &str = "etcdfleet-controller";

fn cluster_schema() -> Box<dyn Schema> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(etcdfleet_api::EtcdCluster::crd()).expect("CRD serializes");
    schema_for_crd(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
}

fn sts_schema() -> Box<dyn Schema> {
    builtin_schema("apps", "StatefulSet")
}

fn cluster(spec: Value) -> Value {
    json!({
        "apiVersion": "etcdfleet.dev/v1alpha1",
        "kind": "EtcdCluster",
        "metadata": { "name": "shop", "namespace": "fleet" },
        "spec": spec,
    })
}

fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
}

fn fields(obj: &Value, manager: &str, operation: &str) -> Value {
    entry(obj, manager, operation)
        .map(|e| e["fieldsV1"].clone())
        .unwrap_or(Value::Null)
}

/// A user's `kubectl edit`-like write: the new object is the old one with
/// one change, recorded as an Update.
fn user_update(old: &Value, change: impl FnOnce(&mut Value), manager: &str) -> Value {
    let mut new = old.clone();
    change(&mut new);
    record_update(Some(old), &mut new, manager, None, &*cluster_schema(), T1);
    new
}

#[test]
fn apply_creates_the_object_and_the_manager_owns_exactly_the_applied_fields() {
    let applied = json!({
        "apiVersion": "etcdfleet.dev/v1alpha1",
        "kind": "EtcdCluster",
        "metadata": { "name": "shop", "labels": { "team": "shop" } },
        "spec": { "replicas": 3, "storage": { "size": "1Gi" } },
    });
    let out = apply(None, &applied, CONTROLLER, false, &*cluster_schema(), T0).unwrap();
    assert_eq!(
        out["spec"],
        json!({ "replicas": 3, "storage": { "size": "1Gi" } })
    );
    assert_eq!(out["metadata"]["labels"]["team"], "shop");
    let e = entry(&out, CONTROLLER, "Apply").expect("an Apply entry");
    assert_eq!(e["apiVersion"], "etcdfleet.dev/v1alpha1");
    assert_eq!(e["time"], T0);
    assert_eq!(e["fieldsType"], "FieldsV1");
    assert_eq!(
        e["fieldsV1"],
        json!({
            "f:metadata": { "f:labels": { "f:team": {} } },
            "f:spec": { "f:replicas": {}, "f:storage": { "f:size": {} } },
        })
    );
    assert_eq!(
        out["metadata"]["managedFields"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn applying_empty_spec_removes_every_field_the_manager_applied_before() {
    let schema = cluster_schema();
    let first = apply(
        None,
        &cluster(json!({ "replicas": 3, "version": "3.5.1", "storage": { "size": "1Gi" } })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let second = apply(
        Some(&first),
        &cluster(json!({})),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(second["spec"], json!({}));
    // The manager now owns the empty spec only.
    assert_eq!(
        fields(&second, CONTROLLER, "Apply"),
        json!({ "f:spec": {} })
    );
}

#[test]
fn fields_dropped_by_one_manager_stay_when_another_manager_still_owns_them() {
    let schema = cluster_schema();
    let first = apply(
        None,
        &cluster(json!({ "replicas": 3, "version": "3.5.1" })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    // A second applier sets the same version: both own it.
    let shared = apply(
        Some(&first),
        &cluster(json!({ "version": "3.5.1" })),
        "gitops",
        false,
        &*schema,
        T0,
    )
    .unwrap();
    assert_eq!(
        fields(&shared, "gitops", "Apply"),
        json!({ "f:spec": { "f:version": {} } })
    );
    assert_eq!(
        fields(&shared, CONTROLLER, "Apply"),
        json!({ "f:spec": { "f:replicas": {}, "f:version": {} } })
    );
    let dropped = apply(
        Some(&shared),
        &cluster(json!({})),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(
        dropped["spec"],
        json!({ "version": "3.5.1" }),
        "replicas goes, version stays"
    );
}

#[test]
fn applying_a_different_value_than_another_manager_owns_is_a_conflict() {
    let schema = cluster_schema();
    let first = apply(
        None,
        &cluster(json!({ "replicas": 3, "version": "3.5.1" })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let conflicts = apply(
        Some(&first),
        &cluster(json!({ "replicas": 5, "version": "3.5.1" })),
        "gitops",
        false,
        &*schema,
        T1,
    )
    .unwrap_err();
    assert_eq!(
        conflicts,
        vec![Conflict {
            manager: CONTROLLER.into(),
            field: ".spec.replicas".into()
        }]
    );
}

#[test]
fn forced_apply_takes_ownership_of_the_conflicting_field() {
    let schema = cluster_schema();
    let first = apply(
        None,
        &cluster(json!({ "replicas": 3, "version": "3.5.1" })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let forced = apply(
        Some(&first),
        &cluster(json!({ "replicas": 5 })),
        "gitops",
        true,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(forced["spec"]["replicas"], 5);
    assert_eq!(
        fields(&forced, "gitops", "Apply"),
        json!({ "f:spec": { "f:replicas": {} } })
    );
    assert_eq!(
        fields(&forced, CONTROLLER, "Apply"),
        json!({ "f:spec": { "f:version": {} } })
    );
    // The controller no longer owns replicas: dropping everything keeps it.
    let after = apply(
        Some(&forced),
        &cluster(json!({})),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(after["spec"], json!({ "replicas": 5 }));
}

#[test]
fn update_takes_ownership_of_changed_fields_from_other_managers() {
    let schema = cluster_schema();
    let first = apply(
        None,
        &cluster(json!({ "replicas": 3, "version": "3.5.1" })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let edited = user_update(&first, |o| o["spec"]["replicas"] = json!(5), "kubectl-edit");
    assert_eq!(
        fields(&edited, "kubectl-edit", "Update"),
        json!({ "f:spec": { "f:replicas": {} } })
    );
    assert_eq!(
        entry(&edited, "kubectl-edit", "Update").unwrap()["time"],
        T1
    );
    assert_eq!(
        fields(&edited, CONTROLLER, "Apply"),
        json!({ "f:spec": { "f:version": {} } })
    );
    // A write that changes nothing takes nothing.
    let mut same = edited.clone();
    record_update(Some(&edited), &mut same, "noop", None, &*schema, T1);
    assert!(entry(&same, "noop", "Update").is_none());
    // Removing a field by update leaves it owned by nobody.
    let removed = user_update(
        &edited,
        |o| {
            o["spec"].as_object_mut().unwrap().remove("version");
        },
        "kubectl-edit",
    );
    assert!(
        entry(&removed, CONTROLLER, "Apply").is_none(),
        "the emptied entry is dropped"
    );
}

#[test]
fn create_by_update_records_every_field_for_the_creator() {
    let mut obj = cluster(json!({ "replicas": 1 }));
    record_update(
        None,
        &mut obj,
        "kubectl-create",
        None,
        &*cluster_schema(),
        T0,
    );
    assert_eq!(
        fields(&obj, "kubectl-create", "Update"),
        json!({ "f:spec": { "f:replicas": {} } })
    );
}

fn sts(containers: Value, tolerations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": "etcd", "namespace": "etcd-system" },
        "spec": { "template": { "spec": { "containers": containers, "tolerations": tolerations } } },
    })
}

#[test]
fn associative_lists_merge_by_key_and_each_manager_owns_its_items() {
    let schema = sts_schema();
    let etcd = json!({ "name": "etcd", "image": "etcd:v3.5.1",
        "env": [ { "name": "A", "value": "1" }, { "name": "B", "value": "2" } ] });
    let first = apply(
        None,
        &sts(json!([etcd]), json!([])),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let sidecar = json!({ "name": "sidecar", "image": "busybox" });
    let with_sidecar = apply(
        Some(&first),
        &json!({ "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "etcd" },
            "spec": { "template": { "spec": { "containers": [sidecar] } } } }),
        "mesh-injector",
        false,
        &*schema,
        T0,
    )
    .unwrap();
    let containers = &with_sidecar["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers.as_array().unwrap().len(), 2, "{containers}");
    assert_eq!(
        fields(&with_sidecar, "mesh-injector", "Apply")["f:spec"]["f:template"]["f:spec"]["f:containers"],
        json!({ "k:{\"name\":\"sidecar\"}": { ".": {}, "f:image": {}, "f:name": {} } })
    );
    // The controller stops setting env B: only that item goes.
    let etcd2 =
        json!({ "name": "etcd", "image": "etcd:v3.5.1", "env": [ { "name": "A", "value": "1" } ] });
    let second = apply(
        Some(&with_sidecar),
        &sts(json!([etcd2]), json!([])),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(
        second["spec"]["template"]["spec"]["containers"],
        json!([
            { "name": "etcd", "image": "etcd:v3.5.1", "env": [ { "name": "A", "value": "1" } ] },
            { "name": "sidecar", "image": "busybox" },
        ])
    );
    // A conflict inside an item names it by key.
    let conflicts = apply(
        Some(&second),
        &json!({ "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "etcd" },
            "spec": { "template": { "spec": { "containers": [ { "name": "etcd", "image": "etcd:v3.6.0" } ] } } } }),
        "mesh-injector",
        false,
        &*schema,
        T1,
    )
    .unwrap_err();
    assert_eq!(
        conflicts[0].field,
        ".spec.template.spec.containers[name=\"etcd\"].image"
    );
}

#[test]
fn atomic_lists_are_replaced_whole_and_owned_as_one_field() {
    let schema = sts_schema();
    let c = json!([{ "name": "etcd", "image": "etcd:v3.5.1" }]);
    let first = apply(
        None,
        &sts(
            c.clone(),
            json!([{ "key": "a", "operator": "Exists" }, { "key": "b", "operator": "Exists" }]),
        ),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    assert_eq!(
        fields(&first, CONTROLLER, "Apply")["f:spec"]["f:template"]["f:spec"]["f:tolerations"],
        json!({})
    );
    let second = apply(
        Some(&first),
        &sts(c.clone(), json!([{ "key": "c", "operator": "Exists" }])),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(
        second["spec"]["template"]["spec"]["tolerations"],
        json!([{ "key": "c", "operator": "Exists" }])
    );
    // Another manager applying a different atomic list conflicts on the whole list.
    let conflicts = apply(
        Some(&second),
        &sts(json!([]), json!([{ "key": "d", "operator": "Exists" }])),
        "other",
        false,
        &*schema,
        T1,
    )
    .unwrap_err();
    assert!(
        conflicts
            .iter()
            .any(|c| c.field == ".spec.template.spec.tolerations"),
        "{conflicts:?}"
    );
}

#[test]
fn set_lists_merge_by_value_and_remove_only_the_values_a_manager_dropped() {
    let schema = cluster_schema();
    let with = |finalizers: Value| {
        json!({ "apiVersion": "etcdfleet.dev/v1alpha1", "kind": "EtcdCluster",
            "metadata": { "name": "shop", "finalizers": finalizers } })
    };
    let a = apply(None, &with(json!(["a.dev/x"])), "one", false, &*schema, T0).unwrap();
    let b = apply(
        Some(&a),
        &with(json!(["b.dev/y"])),
        "two",
        false,
        &*schema,
        T0,
    )
    .unwrap();
    assert_eq!(b["metadata"]["finalizers"], json!(["a.dev/x", "b.dev/y"]));
    assert_eq!(
        fields(&b, "two", "Apply"),
        json!({ "f:metadata": { "f:finalizers": { "v:\"b.dev/y\"": {} } } })
    );
    let c = apply(Some(&b), &with(json!([])), "one", false, &*schema, T1).unwrap();
    assert_eq!(c["metadata"]["finalizers"], json!(["b.dev/y"]));
}

#[test]
fn status_writes_are_owned_by_separate_subresource_entries() {
    let schema = cluster_schema();
    let obj = apply(
        None,
        &cluster(json!({ "replicas": 3 })),
        CONTROLLER,
        false,
        &*schema,
        T0,
    )
    .unwrap();
    // Status in a main-resource apply is not applied nor owned.
    let with_status = {
        let mut a = cluster(json!({ "replicas": 3 }));
        a["status"] = json!({ "phase": "Ready" });
        apply(Some(&obj), &a, CONTROLLER, false, &*schema, T0).unwrap()
    };
    assert!(with_status.get("status").is_none());
    let mut new = obj.clone();
    new["status"] = json!({ "observedGeneration": 1 });
    record_update(
        Some(&obj),
        &mut new,
        CONTROLLER,
        Some("status"),
        &*schema,
        T1,
    );
    let status_entry = new["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["subresource"] == "status")
        .expect("a status entry");
    assert_eq!(status_entry["operation"], "Update");
    assert_eq!(
        status_entry["fieldsV1"],
        json!({ "f:status": { "f:observedGeneration": {} } })
    );
    assert_eq!(
        fields(&new, CONTROLLER, "Apply"),
        json!({ "f:spec": { "f:replicas": {} } })
    );
    // Status apply owns status only (forced: the Update entry above is, to the
    // API server, another manager even with the same name).
    let mut applied = cluster(json!({ "replicas": 7 }));
    applied["status"] = json!({ "observedGeneration": 2 });
    let status_applied = apply_to(
        Some(&new),
        &applied,
        CONTROLLER,
        Some("status"),
        true,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(status_applied["spec"]["replicas"], 3);
    assert_eq!(status_applied["status"]["observedGeneration"], 2);
}

#[test]
fn managed_fields_round_trip_through_fields_v1_with_dot_members() {
    let v1 = json!({
        "f:metadata": { "f:labels": { ".": {}, "f:app": {} } },
        "f:spec": { "f:containers": { "k:{\"name\":\"etcd\"}": { ".": {}, "f:name": {} } } },
    });
    let set = FieldSet::from_fields_v1(&v1);
    assert_eq!(set.to_fields_v1(), v1);
    assert!(set.contains(&["f:metadata".into(), "f:labels".into()]));
    assert!(!set.contains(&["f:metadata".into()]));
}

#[test]
fn conflict_status_is_the_api_servers_409() {
    let status = conflict_status(
        "EtcdCluster",
        "shop",
        &[
            Conflict {
                manager: "a".into(),
                field: ".spec.replicas".into(),
            },
            Conflict {
                manager: "a".into(),
                field: ".spec.version".into(),
            },
        ],
    );
    assert_eq!(status["code"], 409);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["kind"], "Status");
    assert_eq!(
        status["message"],
        "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.replicas\n- .spec.version"
    );
    assert_eq!(
        status["details"]["causes"][1]["reason"],
        "FieldManagerConflict"
    );
    assert_eq!(status["details"]["causes"][1]["field"], ".spec.version");
    let one = conflict_status(
        "EtcdCluster",
        "shop",
        &[Conflict {
            manager: "a".into(),
            field: ".spec.x".into(),
        }],
    );
    assert_eq!(
        one["message"],
        "Apply failed with 1 conflict: conflict with \"a\": .spec.x"
    );
}

#[test]
fn crd_schema_list_types_come_from_x_kubernetes_list_type() {
    let schema = schema_for_crd(&json!({
        "type": "object",
        "properties": { "spec": { "type": "object", "properties": {
            "members": { "type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": { "type": "object", "properties": {
                    "tags": { "type": "array", "x-kubernetes-list-type": "set", "items": { "type": "string" } } } } },
            "args": { "type": "array", "items": { "type": "string" } },
        } } }
    }));
    let p = |s: &str| s.split('.').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        schema.list_type(&p("spec.members")),
        ListType::Map(vec!["name".into()])
    );
    assert_eq!(schema.list_type(&p("spec.members.tags")), ListType::Set);
    assert_eq!(schema.list_type(&p("spec.args")), ListType::Atomic);
    assert_eq!(schema.list_type(&p("metadata.finalizers")), ListType::Set);
    // The project's CRD declares no list type: its lists are atomic.
    assert_eq!(
        cluster_schema().list_type(&p("spec.podTemplate.tolerations")),
        ListType::Atomic
    );
    let sts = sts_schema();
    assert_eq!(
        sts.list_type(&p("spec.template.spec.containers.ports")),
        ListType::Map(vec!["containerPort".into(), "protocol".into()])
    );
    assert_eq!(
        sts.list_type(&p("spec.volumeClaimTemplates")),
        ListType::Atomic
    );
}

/// The controller materializes template values into a cluster's spec by
/// apply; a user then edits one of them; the controller applies again.
#[test]
fn materialization_keeps_a_users_edit_and_a_later_empty_apply_removes_only_controller_fields() {
    let schema = cluster_schema();
    let template_values =
        json!({ "version": "3.5.1", "replicas": 3, "storage": { "size": "2Gi" } });
    // The user created the cluster with a template reference only.
    let mut created = cluster(json!({ "templateRef": { "name": "small" } }));
    record_update(
        None,
        &mut created,
        "kubectl-client-side-apply",
        None,
        &*schema,
        T0,
    );
    let materialized = apply(
        Some(&created),
        &cluster(template_values.clone()),
        CONTROLLER,
        true,
        &*schema,
        T0,
    )
    .unwrap();
    assert_eq!(materialized["spec"]["templateRef"]["name"], "small");
    assert_eq!(materialized["spec"]["replicas"], 3);

    let edited = user_update(
        &materialized,
        |o| o["spec"]["replicas"] = json!(5),
        "kubectl-edit",
    );

    // Without force the controller's second pass conflicts on the user's field...
    let conflicts = apply(
        Some(&edited),
        &cluster(template_values.clone()),
        CONTROLLER,
        false,
        &*schema,
        T1,
    )
    .unwrap_err();
    assert_eq!(
        conflicts,
        vec![Conflict {
            manager: "kubectl-edit".into(),
            field: ".spec.replicas".into()
        }]
    );
    // ...with force it overwrites the user's edit (what a forced re-apply does).
    let forced = apply(
        Some(&edited),
        &cluster(template_values.clone()),
        CONTROLLER,
        true,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(forced["spec"]["replicas"], 3);

    // A second pass applying `spec: {}` removes every field only the
    // controller owns, keeps the user's edit and the user's templateRef.
    let emptied = apply(
        Some(&edited),
        &cluster(json!({})),
        CONTROLLER,
        true,
        &*schema,
        T1,
    )
    .unwrap();
    assert_eq!(
        emptied["spec"],
        json!({ "templateRef": { "name": "small" }, "replicas": 5 })
    );
}
