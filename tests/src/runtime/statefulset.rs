//! The StatefulSet controller of emulated mode (point 1 of the runtime's
//! docs): pods `<sts>-<ordinal>` and their PVCs from the template, one at a
//! time or in parallel, scale-down highest ordinal first, `RollingUpdate`
//! and `OnDelete`, and the status the controller under test reads. In node
//! mode the real kube-controller-manager plays it.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::state::{Inner, PodKey, is_status_code};

const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
const REVISION_LABEL: &str = "controller-revision-hash";

impl Inner {
    pub(super) async fn run_statefulsets(&self) -> Result<()> {
        let lp = ListParams::default();
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::all(self.client.clone()).list(&lp).await?.items;
        let pvcs: BTreeSet<PodKey> = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&lp)
            .await?
            .items
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        for sts in &stss {
            self.run_statefulset(sts, &pods, &pvcs)
                .await
                .with_context(|| format!("statefulset {}", sts.name_any()))?;
        }
        Ok(())
    }

    async fn run_statefulset(
        &self,
        sts: &StatefulSet,
        pods: &[Pod],
        pvcs: &BTreeSet<PodKey>,
    ) -> Result<()> {
        let spec = &sts.spec;
        let ns = sts.namespace().unwrap_or_default();
        let name = sts.name_any();
        let uid = sts.uid().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
        let revision = template_revision(sts);
        let pod_api = Api::<Pod>::namespaced(self.client.clone(), &ns);
        if self.adopt_orphans(sts, pods).await? {
            return Ok(()); // the next sync sees them owned
        }
        let owned: BTreeMap<i32, &Pod> = pods
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && controlled_by(p, &uid))
            .filter_map(|p| Some((ordinal_of(&name, &p.name_any())?, p)))
            .collect();

        // Scale down first, highest ordinal first.
        let excess: Vec<(&i32, &&Pod)> = owned.range(replicas..).rev().collect();
        for (_, pod) in excess {
            delete_tolerant(&pod_api, &pod.name_any()).await?;
            if !parallel {
                return Ok(());
            }
        }

        for ordinal in 0..replicas {
            let pod_name = format!("{name}-{ordinal}");
            for template in spec.volume_claim_templates.iter().flatten() {
                let claim = format!("{}-{pod_name}", template.name_any());
                if !pvcs.contains(&(ns.clone(), claim.clone())) {
                    self.create_pvc(sts, template, &claim).await?;
                }
            }
            if owned.contains_key(&ordinal) {
                continue;
            }
            let lower_ready = (0..ordinal).all(|j| owned.get(&j).is_some_and(|p| pod_ready(p)));
            if !parallel && !lower_ready {
                break;
            }
            let taken = pods
                .iter()
                .any(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() == pod_name);
            if !taken {
                self.create_pod(sts, ordinal, &revision).await?;
            }
            if !parallel {
                break;
            }
        }

        // RollingUpdate (the default): replace the highest out-of-date pod,
        // one at a time, while every pod is present and ready.
        let strategy = spec.update_strategy.as_ref();
        let on_delete = strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete");
        let all_ready = (0..replicas).all(|j| owned.get(&j).is_some_and(|p| pod_ready(p)));
        if !on_delete && all_ready {
            let partition = strategy
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.partition)
                .unwrap_or(0);
            let stale = (partition..replicas).rev().find(|j| {
                owned
                    .get(j)
                    .is_some_and(|p| p.labels().get(REVISION_LABEL) != Some(&revision))
            });
            if let Some(j) = stale {
                delete_tolerant(&pod_api, &format!("{name}-{j}")).await?;
            }
        }
        Ok(())
    }

    /// Pods at this StatefulSet's names, matching its selector, that no
    /// controller owns (their StatefulSet was deleted with
    /// `propagationPolicy: Orphan`) are adopted, as the StatefulSet
    /// controller's ref manager does: a controller reference is added, the
    /// pod keeps running. Whether any was.
    async fn adopt_orphans(&self, sts: &StatefulSet, pods: &[Pod]) -> Result<bool> {
        let ns = sts.namespace().unwrap_or_default();
        let name = sts.name_any();
        let selector = sts.spec.selector.match_labels.clone().unwrap_or_default();
        let orphans = pods.iter().filter(|p| {
            p.namespace().as_deref() == Some(ns.as_str())
                && p.metadata.deletion_timestamp.is_none()
                && ordinal_of(&name, &p.name_any()).is_some()
                && !(p.owner_references().iter()).any(|r| r.controller == Some(true))
                && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
        });
        let mut adopted = false;
        for pod in orphans {
            let owner = OwnerReference {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: name.clone(),
                uid: sts.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            let patch = json!({
                "metadata": {
                    "resourceVersion": pod.resource_version(),
                    "ownerReferences": [owner],
                },
            });
            Api::<Pod>::namespaced(self.client.clone(), &ns)
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await?;
            adopted = true;
        }
        Ok(adopted)
    }

    async fn create_pvc(
        &self,
        sts: &StatefulSet,
        template: &PersistentVolumeClaim,
        claim: &str,
    ) -> Result<()> {
        let ns = sts.namespace().unwrap_or_default();
        let mut labels = template.labels().clone();
        if let Some(selector) = sts.spec.selector.match_labels.as_ref() {
            labels.extend(selector.clone());
        }
        let mut spec = template.spec.clone().unwrap_or_default();
        // Bound at once, as a provisioner binds it: to a volume of its own
        // (no PersistentVolume object stands behind it unless a test makes
        // one); left Pending on a class that does not provision (below).
        let provisions = self.provisions(spec.storage_class_name.as_deref());
        if provisions {
            spec.volume_name = Some(format!("pv-{ns}-{claim}-{}", next_volume()));
        }
        let pvc = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim,
                "namespace": ns,
                "labels": labels,
                "annotations": template.annotations(),
            },
            "spec": spec,
            "status": if provisions { json!({
                "phase": "Bound",
                "accessModes": spec.access_modes,
                "capacity": spec.resources.as_ref().and_then(|r| r.requests.clone()),
            }) } else { json!({ "phase": "Pending" }) },
        });
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc)?;
        match Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &pvc)
            .await
        {
            Err(e) if !is_status_code(&e, 409) => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn create_pod(&self, sts: &StatefulSet, ordinal: i32, revision: &str) -> Result<()> {
        let spec = &sts.spec;
        let ns = sts.namespace().unwrap_or_default();
        let name = sts.name_any();
        let pod_name = format!("{name}-{ordinal}");
        let template_meta = spec.template.metadata.clone().unwrap_or_default();
        let mut labels = template_meta.labels.unwrap_or_default();
        labels.insert(POD_NAME_LABEL.into(), pod_name.clone());
        labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
        labels.insert(REVISION_LABEL.into(), revision.to_string());
        let mut pod_spec = spec.template.spec.clone().unwrap_or_default();
        pod_spec.hostname = Some(pod_name.clone());
        pod_spec.subdomain = spec.service_name.clone().filter(|s| !s.is_empty());
        let mut volumes = pod_spec.volumes.take().unwrap_or_default();
        for template in spec.volume_claim_templates.iter().flatten() {
            let volume_name = template.name_any();
            volumes.retain(|v| v.name != volume_name);
            volumes.push(Volume {
                name: volume_name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: format!("{volume_name}-{pod_name}"),
                    read_only: None,
                }),
                ..Volume::default()
            });
        }
        pod_spec.volumes = Some(volumes);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(pod_name),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: template_meta.annotations,
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "StatefulSet".into(),
                    name,
                    uid: sts.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec),
            status: None,
        };
        match Api::<Pod>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &pod)
            .await
        {
            Err(e) if !is_status_code(&e, 409) => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub(super) async fn update_statefulset_status(&self) -> Result<()> {
        let lp = ListParams::default();
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::all(self.client.clone()).list(&lp).await?.items;
        for sts in &stss {
            let ns = sts.namespace().unwrap_or_default();
            let name = sts.name_any();
            let uid = sts.uid().unwrap_or_default();
            let revision = template_revision(sts);
            let want = sts.spec.replicas.unwrap_or(1);
            let owned: Vec<&Pod> = pods
                .iter()
                .filter(|p| {
                    p.namespace().as_deref() == Some(ns.as_str())
                        && controlled_by(p, &uid)
                        && ordinal_of(&name, &p.name_any()).is_some()
                })
                .collect();
            let ready = owned.iter().filter(|p| pod_ready(p)).count() as i32;
            let at = |rev: &str| {
                owned
                    .iter()
                    .filter(|p| p.labels().get(REVISION_LABEL).map(String::as_str) == Some(rev))
                    .count() as i32
            };
            let updated = at(&revision);
            let current_revision =
                match sts.status.as_ref().and_then(|s| s.current_revision.clone()) {
                    Some(current) if !(updated == want && owned.len() as i32 == want) => current,
                    _ => revision.clone(),
                };
            let desired = StatefulSetStatus {
                replicas: owned.len() as i32,
                ready_replicas: Some(ready),
                available_replicas: Some(ready),
                current_replicas: Some(at(&current_revision)),
                updated_replicas: Some(updated),
                current_revision: Some(current_revision),
                update_revision: Some(revision),
                observed_generation: sts.metadata.generation,
                ..StatefulSetStatus::default()
            };
            if sts.status.as_ref() != Some(&desired) {
                Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": desired })),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// StatefulSets whose replicas are not all present, ready and reported.
    pub(super) async fn statefulsets_not_ready(&self) -> Result<Vec<String>> {
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(stss
            .iter()
            .filter(|sts| {
                let want = sts.spec.replicas.unwrap_or(1);
                let status = sts.status.clone().unwrap_or_default();
                status.replicas != want
                    || status.ready_replicas.unwrap_or(0) != want
                    || status.observed_generation != sts.metadata.generation
            })
            .map(|sts| format!("{}/{}", sts.namespace().unwrap_or_default(), sts.name_any()))
            .collect())
    }
}

/// `<sts>-<ordinal>` → ordinal.
fn ordinal_of(sts: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(sts)?.strip_prefix('-')?.parse().ok()
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A short stable hash of the pod template (the revision of a StatefulSet).
fn template_revision(sts: &StatefulSet) -> String {
    let template = serde_json::to_string(&sts.spec.template).expect("a pod template serializes");
    // FNV-1a: stable across processes, unlike the std hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in template.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{}-{:010x}", sts.name_any(), h & 0xff_ffff_ffff)
}

/// Deletes a pod, tolerating that it is already gone.
async fn delete_tolerant(api: &Api<Pod>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Err(e) if !is_status_code(&e, 404) => Err(e.into()),
        _ => Ok(()),
    }
}

/// A number no volume of this process had: a claim made again gets a new
/// volume, as from a provisioner.
pub(super) fn next_volume() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
