//! Starting a drill: when the policy says the newest backup is due, the
//! cluster is settled (Available, not Progressing: no version change,
//! volume change or recovery under way) and a fleet-wide slot is free, the
//! drill's credentials Secret is created, then the pod, which then owns it.

use std::collections::BTreeMap;

use etcdfleet_api::backup::{DrillResult, drill_result, phase};
use etcdfleet_api::drill::{Candidate, Drills, Next, next_drill, unsettled};
use etcdfleet_api::version::{image_for, parse_full_version};
use etcdfleet_api::{EtcdBackup, EtcdBackupSchedule, EtcdCluster};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PostParams, Preconditions};

use super::pod::{DrillPodInputs, drill_pod, labels};
use super::site::{DrillReport, Site, last_drill};
use crate::backup::context::{Context, Error, Result};
use crate::render::RESTORE_CREDENTIAL_KEYS;
use crate::store::{Credentials, read_credentials};

/// Starts the next drill if it is due and allowed; says what it waits for
/// otherwise.
pub(super) async fn start_if_due(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    site: &Site,
    cluster: &EtcdCluster,
    policy: &Drills,
    backups: &[EtcdBackup],
    now: Timestamp,
) -> Result<DrillReport> {
    ctx.drill_slots.end(&site.key);
    let candidates: Vec<Candidate> = backups.iter().filter_map(candidate).collect();
    let next = next_drill(policy, &candidates, last_drill(backups).as_ref());
    let Next::Drill(name) = &next else {
        return Ok(DrillReport::next(next.to_string()));
    };
    let conditions = cluster
        .status
        .as_ref()
        .map(|s| &s.conditions[..])
        .unwrap_or(&[]);
    if let Some(why) = unsettled(&cluster.name_any(), conditions) {
        return Ok(DrillReport::next(format!("{name} waits: {why}")));
    }
    let backup = backups
        .iter()
        .find(|b| &b.name_any() == name)
        .expect("a candidate");
    let inputs = match inputs(schedule, ctx, site, cluster, backup, policy) {
        Ok(i) => i,
        Err(why) => {
            return Ok(DrillReport::next(format!(
                "{name} cannot be drilled: {why}"
            )));
        }
    };
    let max = ctx.drills.max_concurrent;
    if let Err(running) = ctx.drill_slots.start(&site.key, max) {
        return Ok(DrillReport::next(format!(
            "{name} waits: {running} drills run in this controller (drills.maxConcurrent {max})"
        )));
    }
    let ns = schedule.namespace().unwrap_or_default();
    let destination = backup.status.as_ref().and_then(|s| s.destination.clone());
    let credentials = match &destination {
        Some(d) => read_credentials(&ctx.access().management, &ctx.access().fence, &ns, d).await,
        None => Ok(None),
    };
    let credentials = match credentials {
        Ok(c) => c,
        Err(crate::store::StoreError::Api(e)) => return Err(Error::ManagementApi(e)),
        Err(e) => {
            ctx.drill_slots.end(&site.key);
            return Ok(DrillReport::next(format!("{name} waits: {e}")));
        }
    };
    if let Err(why) = create(site, &inputs, credentials).await {
        ctx.drill_slots.end(&site.key);
        return Ok(DrillReport::next(format!("{name} waits: {why}")));
    }
    Ok(DrillReport {
        in_progress: Some(DrillResult {
            backup: name.clone(),
            started_at: Some(Time(now)),
            result: drill_result::RUNNING.to_string(),
            message: format!("drill pod {}/{} created", site.namespace, site.pod_name),
            ..Default::default()
        }),
        busy: true,
        ..Default::default()
    })
}

/// A successful backup as the policy sees it.
pub fn candidate(b: &EtcdBackup) -> Option<Candidate> {
    let s = b.status.as_ref()?;
    (s.phase.as_deref() == Some(phase::SUCCEEDED)).then_some(())?;
    Some(Candidate {
        name: b.name_any(),
        completed: s.completed_at.as_ref()?.0,
    })
}

/// The drill pod's inputs from the backup's status.
fn inputs(
    schedule: &EtcdBackupSchedule,
    ctx: &Context,
    site: &Site,
    cluster: &EtcdCluster,
    backup: &EtcdBackup,
    policy: &Drills,
) -> std::result::Result<DrillPodInputs, String> {
    let s = backup.status.as_ref().ok_or("it has no status")?;
    let version = s
        .etcd_version
        .as_deref()
        .ok_or("it records no etcd version")?;
    let parsed = parse_full_version(version).ok_or_else(|| format!("etcd version {version:?}"))?;
    let destination = s.destination.clone().ok_or("it records no destination")?;
    Ok(DrillPodInputs {
        pod_name: site.pod_name.clone(),
        secret_name: site.pod_name.clone(),
        namespace: site.namespace.clone(),
        owner: site.owner.clone(),
        backup: format!(
            "{}/{}",
            backup.namespace().unwrap_or_default(),
            backup.name_any()
        ),
        schedule: schedule.name_any(),
        backup_uid: backup.uid().unwrap_or_default(),
        etcd_version: version.to_string(),
        etcd_image: image_for(cluster.spec.config.image_repository.as_deref(), &parsed),
        seeder_image: ctx.drills.seeder_image.clone(),
        credentials: destination.credentials_secret_name.is_some(),
        destination,
        object_key: s.object_key.clone().ok_or("it records no object key")?,
        sha256: s.sha256.clone().ok_or("it records no SHA-256")?,
        size_bytes: s.size_bytes.map(|b| b.max(0) as u64),
        node_selector: policy.node_selector.clone(),
    })
}

/// Creates the credentials Secret first, then the pod, then makes the pod
/// the Secret's owner (the garbage collector removes it with the pod): the
/// pod references only a Secret this reconcile created. A Secret of that
/// name that another owner holds is never touched, and no pod is created
/// (the kubelet would start the seeder with that owner's keys).
async fn create(
    site: &Site,
    inputs: &DrillPodInputs,
    credentials: Option<Credentials>,
) -> std::result::Result<(), String> {
    let secrets: Api<Secret> = Api::namespaced(site.workload.client.clone(), &site.namespace);
    let secret = match credentials {
        Some(c) => Some(claim_secret(&secrets, inputs, credentials_secret(inputs, c)).await?),
        None => None,
    };
    let pod = match site
        .pods()
        .create(&PostParams::default(), &drill_pod(inputs))
        .await
    {
        Ok(pod) => pod,
        Err(e) => {
            if let Some(secret) = &secret {
                let _ = secrets.delete(&inputs.secret_name, &exactly(secret)).await;
            }
            return Err(format!("creating drill pod {}: {e}", site.pod_name));
        }
    };
    let Some(secret) = secret else {
        return Ok(());
    };
    let owned = serde_json::json!({
        "metadata": {
            "resourceVersion": secret.resource_version(),
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name_any(),
                "uid": pod.uid().unwrap_or_default(),
            }],
        }
    });
    (secrets.patch(
        &inputs.secret_name,
        &crate::controller_patch_params(),
        &Patch::Merge(&owned),
    ))
    .await
    .map(|_| ())
    .map_err(|e| format!("making drill pod {} own its Secret: {e}", site.pod_name))
}

/// Creates the drill's credentials Secret. One an earlier drill of this
/// cluster left (its labels; its pod is gone, and the garbage collector
/// would remove it from under a new pod) is replaced; another's is refused.
async fn claim_secret(
    secrets: &Api<Secret>,
    inputs: &DrillPodInputs,
    secret: Secret,
) -> std::result::Result<Secret, String> {
    let failed = |e| format!("creating the drill's Secret: {e}");
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let found = (secrets.get_opt(&inputs.secret_name).await).map_err(failed)?;
            let Some(found) = found.filter(|f| f.labels() == &labels(inputs)) else {
                return Err(format!(
                    "Secret {}/{} exists and is not an earlier drill's of this cluster: \
                     no drill pod is created while another owner holds that name",
                    inputs.namespace, inputs.secret_name
                ));
            };
            (secrets.delete(&inputs.secret_name, &exactly(&found)).await).map_err(failed)?;
            (secrets.create(&PostParams::default(), &secret).await).map_err(failed)
        }
        Err(e) => Err(failed(e)),
    }
}

/// A delete of exactly `secret` (its UID).
fn exactly(secret: &Secret) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: secret.uid(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn credentials_secret(inputs: &DrillPodInputs, c: Credentials) -> Secret {
    let values = [
        Some(c.access_key_id),
        Some(c.secret_access_key),
        c.session_token,
    ];
    let data: BTreeMap<String, ByteString> = (RESTORE_CREDENTIAL_KEYS.iter().zip(values))
        .filter_map(|((key, _), v)| Some((key.to_string(), ByteString(v?.into_bytes()))))
        .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(inputs.secret_name.clone()),
            namespace: Some(inputs.namespace.clone()),
            labels: Some(labels(inputs)),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}
