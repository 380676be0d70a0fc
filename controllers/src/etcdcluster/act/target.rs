//! What every step acts on, and the two ways the act stage writes: a
//! server-side apply with this controller's field manager, and a delete of
//! exactly the object that was observed.

use etcdfleet_api::{EtcdCluster, FIELD_MANAGER};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::super::context::{Context, Error};
use super::super::observe::Observed;
use crate::connector::WorkloadCluster;
use crate::render::{Names, RenderInputs};

/// Certificates are valid this long; rotation is a later feature.
pub const CERT_VALIDITY_DAYS: u32 = 365;

/// What every step acts on: the cluster, its inputs, what was observed, and
/// the workload cluster.
pub struct Target<'a> {
    pub cluster: &'a EtcdCluster,
    pub inputs: &'a RenderInputs,
    pub observed: &'a Observed,
    pub workload: &'a WorkloadCluster,
    pub ctx: &'a Context,
}

impl Target<'_> {
    pub fn names(&self) -> &Names {
        self.observed.names()
    }

    /// The namespaced API of `K` in the workload namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(
            self.workload.client.clone(),
            self.inputs.workload_namespace.as_str(),
        )
    }

    /// A workload API failure, naming the server.
    pub fn err(&self, source: kube::Error) -> Error {
        Error::WorkloadApi {
            server: self.workload.server.clone(),
            source,
        }
    }
}

/// Server-side apply of an object the observation found absent, not
/// forced: an object someone else made since, with other values, is a
/// conflict (409) instead of being taken over, and the next reconcile
/// observes it (refused when another owner holds it).
pub async fn apply_new<K>(api: &Api<K>, obj: &K) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    server_side_apply(api, obj, PatchParams::apply(FIELD_MANAGER)).await
}

/// Server-side apply with this controller's field manager.
pub async fn apply<K>(api: &Api<K>, obj: &K) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    server_side_apply(api, obj, PatchParams::apply(FIELD_MANAGER).force()).await
}

async fn server_side_apply<K>(api: &Api<K>, obj: &K, params: PatchParams) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut value = serde_json::to_value(obj).expect("objects serialize");
    value["apiVersion"] = K::api_version(&Default::default()).into();
    value["kind"] = K::kind(&Default::default()).into();
    api.patch(&obj.name_any(), &params, &Patch::Apply(&value))
        .await
}

/// Deletes exactly the object that was observed (UID and resourceVersion
/// preconditions); an object already gone is fine.
pub async fn delete_exact<K>(api: &Api<K>, obj: &K) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    delete_exact_with_grace(api, obj, None).await
}

/// Deletes the object observed, by its UID alone: a pod or a claim whose
/// status moved on since it was read is still the one meant (a
/// resourceVersion precondition would fail on every status update of a
/// crash-looping pod); an object already gone is fine.
pub async fn delete_same<K>(
    api: &Api<K>,
    obj: &K,
    grace_period_seconds: Option<u32>,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    delete_if(
        api,
        obj,
        (obj.meta().uid.clone(), None),
        grace_period_seconds,
    )
    .await
}

/// [`delete_exact`] with a grace period (`Some(0)`: at once, without
/// waiting for a kubelet to confirm the end of a pod's containers).
pub async fn delete_exact_with_grace<K>(
    api: &Api<K>,
    obj: &K,
    grace_period_seconds: Option<u32>,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let meta = obj.meta();
    let preconditions = (meta.uid.clone(), meta.resource_version.clone());
    delete_if(api, obj, preconditions, grace_period_seconds).await
}

/// Deletes `obj` under the (UID, resourceVersion) preconditions given; an
/// object already gone is fine.
async fn delete_if<K>(
    api: &Api<K>,
    obj: &K,
    (uid, resource_version): (Option<String>, Option<String>),
    grace_period_seconds: Option<u32>,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        grace_period_seconds,
        preconditions: Some(Preconditions {
            uid,
            resource_version,
        }),
        ..Default::default()
    };
    match api.delete(&obj.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
