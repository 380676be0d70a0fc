//! Starting a drill: when the policy says the newest backup is due, the
//! cluster is settled (Available, not Progressing: no version change,
//! volume change or recovery under way) and a fleet-wide slot is free, the
//! drill pod is created, then its credentials Secret, owned by the pod.

use std::collections::BTreeMap;

use etcdfleet_api::backup::{DrillResult, drill_result, phase};
use etcdfleet_api::drill::{Candidate, Drills, Next, next_drill, unsettled};
use etcdfleet_api::version::{image_for, parse_full_version};
use etcdfleet_api::{EtcdBackup, EtcdBackupSchedule, EtcdCluster};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

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
        Some(d) => read_credentials(&ctx.access().management, &ns, d).await,
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

/// Creates the pod, then its credentials Secret owned by it (the seeder
/// waits for the Secret: the kubelet starts no container whose required
/// Secret key is missing).
async fn create(
    site: &Site,
    inputs: &DrillPodInputs,
    credentials: Option<Credentials>,
) -> std::result::Result<(), String> {
    let pod = site
        .pods()
        .create(&PostParams::default(), &drill_pod(inputs))
        .await
        .map_err(|e| format!("creating drill pod {}: {e}", site.pod_name))?;
    let Some(credentials) = credentials else {
        return Ok(());
    };
    let secret = credentials_secret(inputs, &pod, credentials);
    let secrets: Api<Secret> = Api::namespaced(site.workload.client.clone(), &site.namespace);
    let failed = |e| format!("creating the drill's Secret: {e}");
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // One an earlier drill left (owned by its pod, which is gone: the
        // garbage collector would soon remove it from under this pod).
        // Another's Secret of that name is never touched.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let found = (secrets.get_opt(&inputs.secret_name).await).map_err(failed)?;
            let Some(found) = found.filter(|f| f.labels() == &labels(inputs)) else {
                return Err(format!(
                    "Secret {}/{} exists and is not an earlier drill's of this cluster",
                    inputs.namespace, inputs.secret_name
                ));
            };
            let uid = Preconditions {
                uid: found.uid(),
                ..Default::default()
            };
            let params = DeleteParams {
                preconditions: Some(uid),
                ..Default::default()
            };
            (secrets.delete(&inputs.secret_name, &params).await).map_err(failed)?;
            (secrets.create(&PostParams::default(), &secret).await).map_err(failed)?;
            Ok(())
        }
        Err(e) => Err(failed(e)),
    }
}

fn credentials_secret(inputs: &DrillPodInputs, pod: &Pod, c: Credentials) -> Secret {
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
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}
