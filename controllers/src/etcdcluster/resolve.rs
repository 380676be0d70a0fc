//! Resolve step: the template chain, materialization and the version policy.
//!
//! On the first reconcile of a cluster that names a template, the template
//! chain is fetched and resolved, and the template values of the fields the
//! user left empty are written into the cluster's own spec by server-side
//! apply (this controller's field manager); `status.template` records which
//! template and generation. From then on the cluster's spec alone is the
//! truth: later template edits or deletion change nothing. A rebase — the
//! annotation [`REBASE_ANNOTATION`] — re-resolves from the current template,
//! changing only fields that still hold the values written last time.

use etcdfleet_api::template::{Resolution, ResolveError, materialize, resolve};
use etcdfleet_api::version::{VersionChange, decide, image_for};
use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdCluster, EtcdClusterSpec, EtcdConfig, EtcdTemplate, FIELD_MANAGER,
    TemplateKind,
};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::status::Report;
use super::{Context, Error, Result};
use crate::render::RenderInputs;

/// Annotation that asks the controller to move a cluster onto the current
/// revision of its template. Removed by the controller once done.
pub const REBASE_ANNOTATION: &str = "etcdfleet.dev/rebase-template";
/// Annotation holding the template values last written into the spec (JSON),
/// so a rebase can tell a user's edit from a template default.
pub const MATERIALIZED_ANNOTATION: &str = "etcdfleet.dev/materialized-values";

/// The resolved cluster, ready to render.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resolution: Resolution,
    /// What to render with: the resolved spec, except the version and image
    /// stay at the running version while a version change is rejected.
    pub inputs: RenderInputs,
    /// `None` when the requested version change was rejected.
    pub version_change: Option<VersionChange>,
}

impl Resolved {
    /// While a version change is rejected the StatefulSet is left exactly as it is.
    pub fn hold_statefulset(&self) -> bool {
        self.version_change.is_none()
    }
}

async fn fetch_templates(
    cluster: &EtcdCluster,
    ctx: &Context,
) -> Result<std::result::Result<(Option<ClusterEtcdTemplate>, Option<EtcdTemplate>), ResolveError>>
{
    let Some(template_ref) = &cluster.spec.template_ref else {
        return Ok(Ok((None, None)));
    };
    let ns = cluster.namespace().unwrap_or_default();
    let cluster_templates: Api<ClusterEtcdTemplate> = Api::all(ctx.management.clone());
    let get_cluster_template = |name: String| {
        let api = cluster_templates.clone();
        async move {
            match api.get_opt(&name).await.map_err(Error::ManagementApi)? {
                Some(t) => Ok::<_, Error>(Ok(t)),
                None => Ok(Err(ResolveError::TemplateNotFound {
                    kind: TemplateKind::ClusterEtcdTemplate,
                    name,
                })),
            }
        }
    };
    match template_ref.kind {
        TemplateKind::ClusterEtcdTemplate => Ok(get_cluster_template(template_ref.name.clone())
            .await?
            .map(|ct| (Some(ct), None))),
        TemplateKind::EtcdTemplate => {
            let api: Api<EtcdTemplate> = Api::namespaced(ctx.management.clone(), &ns);
            let Some(t) = api
                .get_opt(&template_ref.name)
                .await
                .map_err(Error::ManagementApi)?
            else {
                return Ok(Err(ResolveError::TemplateNotFound {
                    kind: TemplateKind::EtcdTemplate,
                    name: template_ref.name.clone(),
                }));
            };
            match &t.spec.base_template {
                Some(base) => Ok(get_cluster_template(base.clone())
                    .await?
                    .map(|ct| (Some(ct), Some(t)))),
                None => Ok(Ok((None, Some(t)))),
            }
        }
    }
}

/// Resolves the cluster; `Ok(None)` when it cannot be (the report says why).
pub async fn resolve_cluster(
    cluster: &EtcdCluster,
    ctx: &Context,
    report: &mut Report,
) -> Result<Option<Resolved>> {
    let materialized = cluster
        .status
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .is_some();
    let rebase = cluster.annotations().contains_key(REBASE_ANNOTATION);
    let mut spec = cluster.spec.clone();

    if spec.template_ref.is_some() && (!materialized || rebase) {
        let templates = match fetch_templates(cluster, ctx).await? {
            Ok(t) => t,
            Err(e) => {
                report.template_failed(&e);
                return Ok(None);
            }
        };
        let (ct, t) = templates;
        if rebase {
            spec = rebased_spec(cluster);
        }
        let resolution = match resolve(ct.as_ref(), t.as_ref(), &spec) {
            Ok(r) => r,
            Err(e) => {
                report.template_failed(&e);
                return Ok(None);
            }
        };
        let values = materialize(&spec, &resolution);
        write_materialized(cluster, ctx, &values, rebase).await?;
        report.template_applied(ct.as_ref(), t.as_ref(), &resolution);
        // Continue with the spec as now written.
        spec.config = merge_config(&spec.config, &values);
    }

    // From here on the spec alone is the truth.
    let resolution = match resolve_own_spec(&spec) {
        Ok(r) => r,
        Err(e) => {
            report.template_failed(&e);
            return Ok(None);
        }
    };
    report.template_resolved(&resolution);

    let current = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_version.clone());
    let requested = resolution.spec.version.to_string();
    let version_change = match decide(current.as_deref(), &requested) {
        Ok(change) => {
            report.version_accepted(&change);
            Some(change)
        }
        Err(rejection) => {
            report.version_rejected(&rejection);
            if current.is_none() {
                return Ok(None);
            }
            None
        }
    };
    let mut inputs = render_inputs(cluster, &resolution);
    if version_change.is_none()
        && let Some(current) = current
        && let Ok(v) = semver::Version::parse(&current)
    {
        inputs.version = current;
        inputs.image = image_for(spec.config.image_repository.as_deref(), &v);
    }
    Ok(Some(Resolved {
        resolution,
        inputs,
        version_change,
    }))
}

/// Resolves a spec on its own, ignoring `templateRef`: how a cluster whose
/// template values were materialized into its spec is resolved.
pub fn resolve_own_spec(spec: &EtcdClusterSpec) -> Result<Resolution, ResolveError> {
    let mut own = spec.clone();
    own.template_ref = None;
    resolve(None, None, &own)
}

/// The render inputs of a resolved cluster.
pub fn render_inputs(cluster: &EtcdCluster, resolution: &Resolution) -> RenderInputs {
    let r = &resolution.spec;
    let resources = (r.resources.requests.as_ref().is_some_and(|m| !m.is_empty())
        || r.resources.limits.as_ref().is_some_and(|m| !m.is_empty()))
    .then(|| r.resources.clone());
    RenderInputs {
        name: cluster.name_any(),
        owner_namespace: cluster.namespace().unwrap_or_default(),
        uid: cluster.meta().uid.clone().unwrap_or_default(),
        workload_namespace: r.workload_namespace.clone(),
        image: r.image.clone(),
        version: r.version.to_string(),
        tls: r.tls_enabled,
        storage_class: r.storage.class.clone(),
        storage_size: r.storage.size.0.clone(),
        resources,
        pod: r.pod.clone(),
        heartbeat_interval_millis: r.tuning.heartbeat_interval_millis,
        election_timeout_millis: r.tuning.election_timeout_millis,
        quota_backend_bytes: r.tuning.quota_backend_bytes,
        snapshot_count: r.tuning.snapshot_count,
        auto_compaction_retention: r.tuning.auto_compaction_retention.clone(),
    }
}

/// For a rebase: the spec with every field that still holds the value last
/// written from a template cleared, so the current template fills it again.
/// Fields the user changed since are kept.
fn rebased_spec(cluster: &EtcdCluster) -> EtcdClusterSpec {
    let mut spec = cluster.spec.clone();
    let Some(previous) = cluster
        .annotations()
        .get(MATERIALIZED_ANNOTATION)
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
    else {
        return spec;
    };
    let mut current = serde_json::to_value(&spec.config).expect("EtcdConfig serializes");
    clear_matching(&mut current, &previous);
    let storage = spec.config.storage.take();
    spec.config = serde_json::from_value(current).expect("EtcdConfig round-trips");
    // Storage is immutable once set (the CRD enforces it): a rebase never moves it.
    spec.config.storage = storage;
    spec
}

/// Removes from `current` every leaf equal to the same leaf in `previous`.
fn clear_matching(current: &mut serde_json::Value, previous: &serde_json::Value) {
    let (Some(cur), Some(prev)) = (current.as_object_mut(), previous.as_object()) else {
        return;
    };
    for (key, prev_value) in prev {
        let Some(cur_value) = cur.get_mut(key) else {
            continue;
        };
        if cur_value == prev_value {
            cur.remove(key);
        } else if cur_value.is_object() && prev_value.is_object() {
            clear_matching(cur_value, prev_value);
            if cur_value.as_object().is_some_and(|o| o.is_empty()) {
                cur.remove(key);
            }
        }
    }
}

fn merge_config(base: &EtcdConfig, add: &EtcdConfig) -> EtcdConfig {
    let mut b = serde_json::to_value(base).expect("EtcdConfig serializes");
    let a = serde_json::to_value(add).expect("EtcdConfig serializes");
    merge_json(&mut b, &a);
    serde_json::from_value(b).expect("EtcdConfig round-trips")
}

fn merge_json(base: &mut serde_json::Value, add: &serde_json::Value) {
    match (base.as_object_mut(), add.as_object()) {
        (Some(b), Some(a)) => {
            for (k, v) in a {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_json(existing, v)
                    }
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        _ => *base = add.clone(),
    }
}

/// The leaves of `from` at the paths `shape` has (objects recursed).
fn pick(from: &serde_json::Value, shape: &serde_json::Value) -> serde_json::Value {
    let (Some(f), Some(sh)) = (from.as_object(), shape.as_object()) else {
        return from.clone();
    };
    let mut out = serde_json::Map::new();
    for (key, sub) in sh {
        if let Some(value) = f.get(key) {
            let picked = if sub.is_object() && value.is_object() {
                pick(value, sub)
            } else {
                value.clone()
            };
            out.insert(key.clone(), picked);
        }
    }
    serde_json::Value::Object(out)
}

/// Writes the template values into the cluster's spec by server-side apply
/// with this controller's field manager, and records them for a later rebase.
async fn write_materialized(
    cluster: &EtcdCluster,
    ctx: &Context,
    values: &EtcdConfig,
    rebase: bool,
) -> Result<()> {
    let api: Api<EtcdCluster> = Api::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let previous: serde_json::Value = cluster
        .annotations()
        .get(MATERIALIZED_ANNOTATION)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let values_json = serde_json::to_value(values).expect("EtcdConfig serializes");
    let mut recorded = if rebase {
        // Storage is never rebased (immutable once set): it stays recorded.
        match previous.get("storage") {
            Some(storage) => serde_json::json!({ "storage": storage }),
            None => serde_json::json!({}),
        }
    } else {
        previous
    };
    merge_json(&mut recorded, &values_json);
    // Server-side apply: this field manager owns exactly what it applies, and
    // a field it applied before and omits now is REMOVED. So every apply
    // carries the whole set the controller owns: what it wrote before plus
    // the new values (a second pass must not drop the first pass's fields);
    // on a rebase, the rebased values (plus the immutable storage), so the
    // values the template no longer supplies are removed and nothing else.
    // Fields the user edited since are owned by the user's manager and stay:
    // what was written before is applied with its CURRENT value, so the
    // (forced) apply never overwrites such an edit.
    let current = serde_json::to_value(&cluster.spec.config).expect("EtcdConfig serializes");
    let mut spec = if rebase {
        serde_json::json!({})
    } else {
        pick(&current, &recorded)
    };
    if rebase && let Some(storage) = current.get("storage") {
        spec["storage"] = storage.clone();
    }
    merge_json(&mut spec, &values_json);
    let apply = serde_json::json!({
        "apiVersion": "etcdfleet.dev/v1alpha1",
        "kind": "EtcdCluster",
        "metadata": { "name": cluster.name_any() },
        "spec": spec,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&cluster.name_any(), &params, &Patch::Apply(&apply))
        .await
        .map_err(Error::ManagementApi)?;
    // Bookkeeping annotations by merge patch (null deletes the rebase request).
    let mut annotations = serde_json::Map::new();
    annotations.insert(MATERIALIZED_ANNOTATION.into(), recorded.to_string().into());
    if rebase {
        annotations.insert(REBASE_ANNOTATION.into(), serde_json::Value::Null);
    }
    let merge = serde_json::json!({ "metadata": { "annotations": annotations } });
    api.patch(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&merge),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}
