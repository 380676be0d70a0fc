//! Writing the workload objects (the render contract: each carries the
//! hash of the inputs it was rendered from) and bootstrap, which creates
//! the members ConfigMap and the StatefulSet.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use etcdfleet_api::EtcdCluster;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ObjectMeta, Patch, PostParams};
use kube::{Resource, ResourceExt};

use super::super::context::{Context, Error, Result};
use super::super::observe::Observed;
use super::super::plan::step::ObjectKind;
use super::pki;
use super::target::{CERT_VALIDITY_DAYS, Target, apply, apply_new};
use crate::access::{read_pki, secret_str};
use crate::pki::{CertUsage, LeafSpec, issued_by, remaining_validity};
use crate::render::{self, RenderInputs};

/// Writes the objects in the order given (the PKI first).
pub(super) async fn write_objects(on: &Target<'_>, kinds: &[ObjectKind]) -> Result<()> {
    for kind in kinds {
        write_object(on, *kind).await?;
    }
    Ok(())
}

async fn write_object(on: &Target<'_>, kind: ObjectKind) -> Result<()> {
    let (cluster, ctx, inputs, observed) = (on.cluster, on.ctx, on.inputs, on.observed);
    let names = observed.names();
    let err = |e| on.err(e);
    match kind {
        ObjectKind::Pki => match &observed.pki {
            Some(p) => pki::renew_client_identity(cluster, ctx, names, p).await,
            None => pki::create_pki(cluster, ctx, names).await,
        },
        ObjectKind::Namespace => {
            match Api::<Namespace>::all(on.workload.client.clone())
                .create(&PostParams::default(), &render::namespace(inputs))
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(err(e)),
            }
        }
        ObjectKind::ServerTlsSecret | ObjectKind::PeerTlsSecret => write_tls_secret(on, kind).await,
        ObjectKind::PeerService => apply(&on.api::<Service>(), &render::peer_service(inputs))
            .await
            .map(|_| ())
            .map_err(err),
        ObjectKind::ClientService => apply(&on.api::<Service>(), &render::client_service(inputs))
            .await
            .map(|_| ())
            .map_err(err),
        ObjectKind::PodDisruptionBudget => {
            apply(&on.api::<PodDisruptionBudget>(), &render::pdb(inputs))
                .await
                .map(|_| ())
                .map_err(err)
        }
        ObjectKind::MembersConfigMap => write_members_configmap(on).await,
        ObjectKind::CaBundleConfigMap => write_ca_bundle(on).await,
        ObjectKind::StatefulSet => write_statefulset(on).await,
    }
}

/// The server or peer certificate, issued by the cluster's CA.
async fn write_tls_secret(on: &Target<'_>, kind: ObjectKind) -> Result<()> {
    let (inputs, names) = (on.inputs, on.names());
    // The Pki step comes first in the same WriteObjects; read it back.
    let pki = match &on.observed.pki {
        Some(p) => p.clone(),
        None => read_pki(&on.ctx.management, on.cluster, names)
            .await?
            .ok_or_else(|| Error::Invalid("PKI Secret missing".into()))?,
    };
    let (name, usage, cn) = if kind == ObjectKind::ServerTlsSecret {
        (names.server_tls_secret(), CertUsage::Server, "etcd-server")
    } else {
        (names.peer_tls_secret(), CertUsage::Peer, "etcd-peer")
    };
    let cert = match kept_leaf(on, &name, kind, &pki).await? {
        Some(cert) => cert,
        None => pki.ca.issue(&LeafSpec {
            common_name: cn.to_string(),
            dns_names: names.member_dns_names(),
            ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            usage,
            validity_days: CERT_VALIDITY_DAYS,
        })?,
    };
    let secret = tls_secret(inputs, name, kind, &pki.trust_bundle(), &cert);
    apply(&on.api::<Secret>(), &secret)
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

/// The CA bundle ConfigMap: the CAs trusted now, for the cluster's clients.
async fn write_ca_bundle(on: &Target<'_>) -> Result<()> {
    let Some(pki) = &on.observed.pki else {
        return Ok(());
    };
    apply(
        &on.api::<ConfigMap>(),
        &render::ca_bundle_configmap(on.inputs, &pki.trust_bundle()),
    )
    .await
    .map(|_| ())
    .map_err(|e| on.err(e))
}

/// The certificate of the existing TLS Secret `name` when only its trust
/// bundle changes (a CA rotation): rendered from these inputs, issued by the
/// current CA and not due for renewal. A CA recovered without its key
/// could not issue another one.
async fn kept_leaf(
    on: &Target<'_>,
    name: &str,
    kind: ObjectKind,
    pki: &crate::access::Pki,
) -> Result<Option<crate::pki::IssuedCert>> {
    let Some(existing) = on
        .api::<Secret>()
        .get_opt(name)
        .await
        .map_err(|e| on.err(e))?
    else {
        return Ok(None);
    };
    let hash = on.inputs.identity_hash(&format!("{kind:?}"));
    let (cert, key) = (
        secret_str(&existing, "tls.crt"),
        secret_str(&existing, "tls.key"),
    );
    let renew_before = on.ctx.settings.cert_renew_before;
    Ok(match (cert, key) {
        (Some(cert_pem), Some(key_pem))
            if render::carried_hash(&existing.metadata) == Some(hash.as_str())
                && issued_by(&cert_pem, pki.ca.cert_pem())
                && remaining_validity(&cert_pem).is_ok_and(|left| left > renew_before) =>
        {
            Some(crate::pki::IssuedCert { cert_pem, key_pem })
        }
        _ => None,
    })
}

/// The members ConfigMap, lost after bootstrap: members start with existing
/// data, or join as learners that AddLearner announces. While a member
/// added to etcd has not started yet, it is announced again with the
/// members etcd lists; otherwise no member is (a member whose volume comes
/// back empty must not join under its old identity).
async fn write_members_configmap(on: &Target<'_>) -> Result<()> {
    let (inputs, observed, names) = (on.inputs, on.observed, on.names());
    let joining = observed
        .health
        .as_ref()
        .filter(|h| h.members().iter().any(|m| !m.member.is_started()));
    let configmap = match joining {
        Some(h) => render::members_configmap(
            inputs,
            &super::members::initial_cluster_of(names, inputs.tls, h, None),
            "existing",
        ),
        None => render::closed_members_configmap(inputs),
    };
    apply(&on.api::<ConfigMap>(), &configmap)
        .await
        .map(|_| ())
        .map_err(|e| on.err(e))
}

/// The StatefulSet rewritten at its current size.
async fn write_statefulset(on: &Target<'_>) -> Result<()> {
    let replicas = (on.observed.planner.statefulset.as_ref()).map_or(1, |s| s.replicas);
    write_statefulset_at(on, replicas).await
}

/// The StatefulSet rewritten with `replicas`.
pub(super) async fn write_statefulset_at(on: &Target<'_>, replicas: u32) -> Result<()> {
    let (ctx, observed) = (on.ctx, on.observed);
    let replicas = replicas as i32;
    // The members keep the token they were bootstrapped with (etcd
    // ignores it on a data directory, but the template stays true).
    let inputs = &RenderInputs {
        initial_cluster_token: kept_token(observed, on.inputs),
        ..on.inputs.clone()
    };
    let api = on.api::<StatefulSet>();
    let stored = apply(&api, &render::statefulset(inputs, &ctx.profile, replicas))
        .await
        .map_err(|e| on.err(e))?;
    record_admitted_image(&api, &stored, &ctx.profile.statefulset_hash(inputs), inputs)
        .await
        .map_err(|e| on.err(e))
}

/// The `--initial-cluster-token` the members run with: the StatefulSet's,
/// or its running pods' when it was deleted around them (a volume growth
/// re-creates it so); without either, the one the inputs bootstrap with.
fn kept_token(observed: &Observed, inputs: &RenderInputs) -> Option<String> {
    let from_pods = || {
        let mut pods = observed.pods.values().filter_map(|p| p.spec.as_ref());
        pods.find_map(render::pod_cluster_token)
    };
    (observed.statefulset.as_ref())
        .and_then(render::statefulset_cluster_token)
        .or_else(from_pods)
        .or_else(|| inputs.initial_cluster_token.clone())
}

/// Creates the members ConfigMap (if missing), the restore credentials of a
/// cluster that restores, and the StatefulSet with `replicas` (around the
/// pods that still run, with their token).
pub(super) async fn bootstrap(on: &Target<'_>, replicas: u32) -> Result<()> {
    let (cluster, ctx, names) = (on.cluster, on.ctx, on.names());
    let inputs = &RenderInputs {
        initial_cluster_token: kept_token(on.observed, on.inputs),
        ..on.inputs.clone()
    };
    let err = |e| on.err(e);
    let cms: Api<ConfigMap> = on.api();
    if cms
        .get_opt(&names.members_configmap())
        .await
        .map_err(err)?
        .is_none()
    {
        let (initial, state) = if replicas == 1 {
            (render::initial_cluster(names, inputs.tls, [0]), "new")
        } else {
            (
                render::initial_cluster(names, inputs.tls, 0..replicas),
                "existing",
            )
        };
        apply_new(&cms, &render::members_configmap(inputs, &initial, state))
            .await
            .map_err(err)?;
    }
    if let Some(record) = &inputs.restore {
        write_restore_credentials(cluster, ctx, inputs, record, &on.workload.client)
            .await
            .map_err(|e| match e {
                RestoreSecretError::Workload(source) => err(source),
                RestoreSecretError::Other(e) => e,
            })?;
    }
    let sts = render::statefulset(inputs, &ctx.profile, replicas as i32);
    let api = on.api::<StatefulSet>();
    // Planned because none was observed: made, never taken over.
    let stored = apply_new(&api, &sts).await.map_err(err)?;
    record_admitted_image(&api, &stored, &ctx.profile.statefulset_hash(inputs), inputs)
        .await
        .map_err(err)?;
    Ok(())
}

fn tls_secret(
    inputs: &RenderInputs,
    name: String,
    kind: ObjectKind,
    ca_pem: &str,
    cert: &crate::pki::IssuedCert,
) -> Secret {
    let names = inputs.names();
    let mut labels = render::selector_labels(&names);
    labels.insert(render::OWNER_LABEL.into(), inputs.owner_label());
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(inputs.workload_namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                render::INPUTS_HASH.to_string(),
                inputs.identity_hash(&format!("{kind:?}")),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("ca.crt".to_string(), ByteString(ca_pem.as_bytes().to_vec())),
            (
                "tls.crt".to_string(),
                ByteString(cert.cert_pem.as_bytes().to_vec()),
            ),
            (
                "tls.key".to_string(),
                ByteString(cert.key_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// If the API server stored another image than the one written (an admission
/// webhook), records it (for the inputs hash `hash` the write carried) so the
/// next reconcile does not see drift and write again, forever. Conditional
/// on the stored object's resourceVersion.
async fn record_admitted_image(
    api: &Api<StatefulSet>,
    stored: &StatefulSet,
    hash: &str,
    inputs: &RenderInputs,
) -> kube::Result<()> {
    let Some(image) = render::statefulset_image(stored) else {
        return Ok(());
    };
    if image == inputs.image {
        return Ok(());
    }
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": stored.resource_version(),
            "annotations": {
                render::ADMITTED_IMAGE: render::admitted_image(hash, image)
            }
        }
    });
    api.patch(
        &stored.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

enum RestoreSecretError {
    Workload(kube::Error),
    Other(Error),
}

/// Copies the object-store credentials of a restore into the workload
/// namespace (`<cluster>-etcd-restore`), where member 0's seeder reads them
/// through `secretKeyRef`. Read from the management cluster by direct GET;
/// a Secret of that name owned by anyone else is never overwritten.
async fn write_restore_credentials(
    cluster: &EtcdCluster,
    ctx: &Context,
    inputs: &RenderInputs,
    record: &etcdfleet_api::restore::RestoreRecord,
    client: &kube::Client,
) -> Result<(), RestoreSecretError> {
    if record.destination.credentials_secret_name.is_none() {
        return Ok(());
    }
    let names = inputs.names();
    let credentials = crate::store::read_credentials(
        &ctx.management,
        &ctx.fence,
        &cluster.namespace().unwrap_or_default(),
        &record.destination,
    )
    .await
    .map_err(|e| match e {
        crate::store::StoreError::Api(e) => RestoreSecretError::Other(Error::ManagementApi(e)),
        other => RestoreSecretError::Other(Error::Invalid(format!("restore credentials: {other}"))),
    })?;
    let Some(credentials) = credentials else {
        return Ok(());
    };
    let api = Api::<Secret>::namespaced(client.clone(), &inputs.workload_namespace);
    let name = names.restore_secret();
    if let Some(existing) = api
        .get_opt(&name)
        .await
        .map_err(RestoreSecretError::Workload)?
    {
        let owner = render::owner_of(existing.meta());
        if owner != Some(inputs.owner_label().as_str()) {
            return Err(RestoreSecretError::Other(Error::Invalid(format!(
                "Secret {}/{name} exists and belongs to {}; not overwritten",
                inputs.workload_namespace,
                owner.unwrap_or("nobody (no etcdfleet.dev/owner label)")
            ))));
        }
    }
    let mut labels = render::selector_labels(&names);
    labels.insert(render::OWNER_LABEL.into(), inputs.owner_label());
    let mut data = BTreeMap::new();
    let values = [
        Some(credentials.access_key_id),
        Some(credentials.secret_access_key),
        credentials.session_token,
    ];
    for ((key, _), value) in render::RESTORE_CREDENTIAL_KEYS.iter().zip(values) {
        if let Some(v) = value {
            data.insert(key.to_string(), ByteString(v.into_bytes()));
        }
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(inputs.workload_namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    };
    apply(&api, &secret)
        .await
        .map(|_| ())
        .map_err(RestoreSecretError::Workload)
}
