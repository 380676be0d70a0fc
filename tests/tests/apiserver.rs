//! The test API server enforces what a real API server enforces where the
//! controller depends on it. RBAC comes from the shipped `config/rbac`, the
//! CRDs from the shipped `config/crd`.

use std::collections::BTreeMap;
use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use etcdfleet_tests::apiserver::{ADMIN, ApiServer, CONTROLLER_USER};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use serde_json::{Value, json};

async fn server_with_namespace(ns: &str) -> ApiServer {
    let server = ApiServer::management().await.expect("server starts");
    let namespaces: Api<Namespace> = Api::all(server.admin_client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("namespace created");
    server
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": "etcdfleet.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": 3, "version": "3.5.1",
            "clusterRef": {"name": "w1"},
            "storage": {"size": "1Gi"},
        },
    })
}

fn statefulset(name: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "etcd", "image": "etcd:3.5.1"}]},
            },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn rbac_denies_a_secret_delete_the_shipped_cluster_role_lacks_with_the_real_403() {
    let server = server_with_namespace("team-a").await;
    let admin: Api<Secret> = Api::namespaced(server.admin_client(), "team-a");
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    admin.create(&PostParams::default(), &secret).await.unwrap();

    let controller: Api<Secret> = Api::namespaced(server.client_as(CONTROLLER_USER), "team-a");
    // get and patch (PKI renewal) are granted by config/rbac/cluster_role.yaml ...
    controller.get("x").await.expect("get is allowed");
    let patch = json!({"data": {"k": ByteString(b"v".to_vec())}});
    controller
        .patch("x", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch is allowed");
    // ... list is not (the controller never lists Secrets), nor is delete.
    let err = api_error(controller.list(&Default::default()).await.unwrap_err());
    assert_eq!(err.code, 403);
    let err = api_error(
        controller
            .delete("x", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    assert_eq!(err.reason, "Forbidden");
    assert_eq!(
        err.message,
        "secrets \"x\" is forbidden: User \"system:serviceaccount:etcdfleet-system:etcdfleet-controller\" \
         cannot delete resource \"secrets\" in API group \"\" in the namespace \"team-a\""
    );
    // Both refusals are remembered (end-to-end runs assert there were none).
    let denied = server.denied();
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert_eq!(denied[1], err.message);
}

#[tokio::test]
async fn rbac_role_grants_only_in_its_namespace_and_unknown_users_get_nothing() {
    let server = server_with_namespace("etcdfleet-system").await;
    let leases = |ns: &str| {
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            server.client_as(CONTROLLER_USER),
            ns,
        )
    };
    let lease = serde_json::from_value(json!({"metadata": {"name": "leader"}})).unwrap();
    leases("etcdfleet-system")
        .create(&PostParams::default(), &lease)
        .await
        .expect("the leader-election Role grants create in etcdfleet-system");
    let err = api_error(
        leases("kube-system")
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403, "a Role grants nothing outside its namespace");
    let stranger: Api<EtcdCluster> = Api::all(server.client_as("someone"));
    assert_eq!(
        api_error(stranger.list(&Default::default()).await.unwrap_err()).code,
        403
    );
}

#[tokio::test]
async fn update_with_a_stale_resource_version_is_a_409_conflict() {
    let server = server_with_namespace("team-a").await;
    let api: Api<ConfigMap> = Api::namespaced(server.admin_client(), "team-a");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let mut first = created.clone();
    first.data = Some(BTreeMap::from([("a".into(), "2".into())]));
    api.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = created;
    stale.data = Some(BTreeMap::from([("a".into(), "3".into())]));
    let err = api_error(
        api.replace("c", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    // A merge patch carrying metadata.resourceVersion is a precondition too.
    let patch = json!({"metadata": {"resourceVersion": "1"}, "data": {"a": "4"}});
    let err = api_error(
        api.patch("c", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
}

#[tokio::test]
async fn delete_preconditions_on_uid_and_resource_version_answer_409() {
    let server = server_with_namespace("team-a").await;
    let api: Api<ConfigMap> = Api::namespaced(server.admin_client(), "team-a");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let with = |uid: Option<String>, rv: Option<String>| DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: rv,
        }),
        ..Default::default()
    };
    let err = api_error(
        api.delete("c", &with(Some("not-the-uid".into()), None))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(
        err.message
            .contains("Precondition failed: UID in precondition"),
        "{}",
        err.message
    );
    let err = api_error(
        api.delete("c", &with(None, Some("1".into())))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    api.delete(
        "c",
        &with(
            created.metadata.uid.clone(),
            created.metadata.resource_version.clone(),
        ),
    )
    .await
    .expect("matching preconditions delete");
    assert!(api.get_opt("c").await.unwrap().is_none());
}

#[tokio::test]
async fn an_object_with_finalizers_stays_until_the_last_one_is_removed_and_dependents_are_collected()
 {
    let server = server_with_namespace("team-a").await;
    let clusters: Api<EtcdCluster> = Api::namespaced(server.admin_client(), "team-a");
    let mut c = cluster("c1");
    c["metadata"]["finalizers"] = json!(["etcdfleet.dev/cleanup"]);
    let created = clusters
        .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(server.admin_client(), "team-a");
    let owned: Secret = serde_json::from_value(json!({"metadata": {"name": "c1-etcd-pki",
        "ownerReferences": [{"apiVersion": "etcdfleet.dev/v1alpha1", "kind": "EtcdCluster",
            "name": "c1", "uid": created.metadata.uid}]}}))
    .unwrap();
    secrets
        .create(&PostParams::default(), &owned)
        .await
        .unwrap();

    clusters
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    let marked = clusters
        .get("c1")
        .await
        .expect("still there while a finalizer is set");
    assert!(marked.metadata.deletion_timestamp.is_some());
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(clusters.get_opt("c1").await.unwrap().is_none());
    assert!(
        secrets.get_opt("c1-etcd-pki").await.unwrap().is_none(),
        "the garbage collector deletes what the cluster owned"
    );
}

#[tokio::test]
async fn statefulset_selector_service_name_and_claim_templates_are_immutable_with_the_real_422() {
    let server = server_with_namespace("team-a").await;
    let api: Api<StatefulSet> = Api::namespaced(server.admin_client(), "team-a");
    api.create(&PostParams::default(), &statefulset("s"))
        .await
        .unwrap();
    // replicas and template may change ...
    api.patch(
        "s",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("replicas is mutable");
    // ... serviceName and volumeClaimTemplates may not.
    for patch in [
        json!({"spec": {"serviceName": "other"}}),
        json!({"spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"}}]}}),
        json!({"spec": {"selector": {"matchLabels": {"app": "other"}}}}),
    ] {
        let err = api_error(
            api.patch("s", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code, 422, "{patch}");
        assert_eq!(err.reason, "Invalid");
        assert_eq!(
            err.message,
            "StatefulSet.apps \"s\" is invalid: spec: Forbidden: updates to statefulset spec for fields \
             other than 'replicas', 'ordinals', 'template', 'updateStrategy', \
             'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
        );
    }
}

#[tokio::test]
async fn pvc_size_may_grow_but_not_shrink_and_service_cluster_ip_is_immutable() {
    let server = server_with_namespace("team-a").await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(server.admin_client(), "team-a");
    let pvc = serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}}))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let size = |s: &str| json!({"spec": {"resources": {"requests": {"storage": s}}}});
    pvcs.patch("d", &PatchParams::default(), &Patch::Merge(size("3Gi")))
        .await
        .expect("growing is allowed");
    let err = api_error(
        pvcs.patch("d", &PatchParams::default(), &Patch::Merge(size("1Gi")))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    let err = api_error(
        pvcs.patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"accessModes": ["ReadWriteMany"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);

    let services: Api<Service> = Api::namespaced(server.admin_client(), "team-a");
    let svc = services
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 2379}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a clusterIP is allocated");
    assert!(ip.starts_with("10.96."), "{ip}");
    let err = api_error(
        services
            .patch(
                "s",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"clusterIP": "10.0.0.1"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(err.message.contains("spec.clusterIP"), "{}", err.message);
}

#[tokio::test]
async fn server_side_apply_removes_fields_a_manager_stops_applying_and_conflicts_unless_forced() {
    let server = server_with_namespace("team-a").await;
    let api: Api<ConfigMap> = Api::namespaced(server.admin_client(), "team-a");
    let apply = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
    let mine = PatchParams::apply("mine");
    api.patch(
        "c",
        &mine,
        &Patch::Apply(apply(json!({"a": "1", "b": "2"}))),
    )
    .await
    .unwrap();
    let second = api
        .patch("c", &mine, &Patch::Apply(apply(json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        second.data,
        Some(BTreeMap::from([("a".into(), "1".into())])),
        "b was applied by `mine` before and not now: it is removed"
    );
    let err = api_error(
        api.patch(
            "c",
            &PatchParams::apply("theirs"),
            &Patch::Apply(apply(json!({"a": "9"}))),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(
        err.message.contains("conflict with \"mine\"") && err.message.contains(".data.a"),
        "{}",
        err.message
    );
    let forced = api
        .patch(
            "c",
            &PatchParams::apply("theirs").force(),
            &Patch::Apply(apply(json!({"a": "9"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["a"], "9");
}

#[tokio::test]
async fn status_writes_change_only_status_and_main_writes_ignore_status() {
    let server = server_with_namespace("team-a").await;
    let api: Api<EtcdCluster> = Api::namespaced(server.admin_client(), "team-a");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(cluster("c")).unwrap(),
    )
    .await
    .unwrap();
    let after = api
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}, "status": {"observedGeneration": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(
        after.spec.config.replicas,
        Some(3),
        "a status write leaves spec alone"
    );
    assert_eq!(
        after.status.as_ref().and_then(|s| s.observed_generation),
        Some(1)
    );
    let after = api
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}, "status": {"observedGeneration": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(after.spec.config.replicas, Some(5));
    assert_eq!(
        after.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );
    assert_eq!(after.status.and_then(|s| s.observed_generation), Some(1));
}

#[tokio::test]
async fn the_scale_subresource_reads_and_writes_replicas() {
    let server = server_with_namespace("team-a").await;
    let api: Api<StatefulSet> = Api::namespaced(server.admin_client(), "team-a");
    api.create(&PostParams::default(), &statefulset("s"))
        .await
        .unwrap();
    let scale = api
        .patch_scale(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(4));
    assert_eq!(api.get("s").await.unwrap().spec.replicas, Some(4));
}

#[tokio::test]
async fn https_with_a_kubeconfig_token_is_authorized_as_its_user() {
    let server = server_with_namespace("team-a").await;
    let token = server.issue_token(CONTROLLER_USER);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig(&token)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let clusters: Api<EtcdCluster> = Api::namespaced(client.clone(), "team-a");
    assert!(
        clusters
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let secrets: Api<Secret> = Api::namespaced(client, "team-a");
    assert_eq!(
        api_error(secrets.list(&Default::default()).await.unwrap_err()).code,
        403
    );
    let _ = ADMIN;
}

#[tokio::test]
async fn a_change_reaches_a_kube_runtime_watcher_over_https() {
    let server = server_with_namespace("team-a").await;
    let token = server.issue_token(CONTROLLER_USER);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig(&token)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let watched: Api<EtcdCluster> = Api::namespaced(client, "team-a");
    let mut events = watcher::watcher(watched, watcher::Config::default())
        .applied_objects()
        .boxed();
    let admin: Api<EtcdCluster> = Api::namespaced(server.admin_client(), "team-a");
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(cluster("w")).unwrap(),
        )
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("w"));
}

#[tokio::test]
async fn list_then_watch_resumes_from_the_list_resource_version_and_compacted_versions_are_gone() {
    let server = server_with_namespace("team-a").await;
    let api: Api<ConfigMap> = Api::namespaced(server.admin_client(), "team-a");
    let cm =
        |n: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}})).unwrap();
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let list = api.list(&Default::default()).await.unwrap();
    let rv = list.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    let mut stream = api
        .watch(&kube::api::WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(kube::api::WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some("b")),
        other => panic!("expected ADDED b, got {other:?}"),
    }
    server.set_watch_history_limit(1);
    api.create(&PostParams::default(), &cm("c")).await.unwrap();
    api.create(&PostParams::default(), &cm("d")).await.unwrap();
    let mut stream = api
        .watch(&kube::api::WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(kube::api::WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test]
async fn cluster_scoped_custom_resources_are_served_at_cluster_paths() {
    let server = ApiServer::management().await.unwrap();
    let api: Api<etcdfleet_api::ClusterEtcdTemplate> = Api::all(server.admin_client());
    let t = serde_json::from_value(json!({
        "apiVersion": "etcdfleet.dev/v1alpha1", "kind": "ClusterEtcdTemplate",
        "metadata": {"name": "platform"}, "spec": {}}))
    .unwrap();
    api.create(&PostParams::default(), &t).await.unwrap();
    let got = api.get("platform").await.unwrap();
    assert_eq!(got.metadata.namespace, None);
}

#[tokio::test]
async fn a_cel_transition_rule_refuses_a_storage_change_with_the_real_422() {
    let server = server_with_namespace("team-a").await;
    let api: Api<EtcdCluster> = Api::namespaced(server.client_as(CONTROLLER_USER), "team-a");
    let admin: Api<EtcdCluster> = Api::namespaced(server.admin_client(), "team-a");
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(cluster("c")).unwrap(),
        )
        .await
        .unwrap();
    // An update is validated against the old object: `oldSelf` in the rule.
    let err = api_error(
        api.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"storage": {"size": null}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(err.reason, "Invalid");
    assert!(
        err.message
            .starts_with("EtcdCluster.etcdfleet.dev \"c\" is invalid: ")
            && err
                .message
                .contains("storage.size cannot be removed once set"),
        "{}",
        err.message
    );
    // A schema violation on create is a 422 too (replicas must be odd).
    let mut even = cluster("even");
    even["spec"]["replicas"] = json!(4);
    let err = api_error(
        admin
            .create(
                &PostParams::default(),
                &serde_json::from_value(even).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422, "{}", err.message);
}

#[tokio::test]
async fn a_reflector_store_turns_ready_after_the_initial_list_over_https() {
    let server = server_with_namespace("team-a").await;
    let admin: Api<EtcdCluster> = Api::namespaced(server.admin_client(), "team-a");
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(cluster("existing")).unwrap(),
        )
        .await
        .unwrap();
    let token = server.issue_token(CONTROLLER_USER);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig(&token)).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let watched: Api<EtcdCluster> = Api::namespaced(client, "team-a");
    let (reader, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(
        writer,
        watcher::watcher(watched, watcher::Config::default()),
    );
    let polled = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
        .await
        .expect("the store is ready within 10 s")
        .unwrap();
    assert_eq!(reader.state().len(), 1, "the initial list filled it");
    polled.abort();
}
