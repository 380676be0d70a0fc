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

pub use etcdfleet_api::template::resolve_own_spec;
use etcdfleet_api::template::{Resolution, ResolveError, ResolvedEtcdSpec, resolve};
use etcdfleet_api::version::{decide_for, image_for, parse_full_version};
use etcdfleet_api::{
    AppliedTemplate, ClusterEtcdTemplate, EtcdCluster, EtcdClusterSpec, EtcdConfig, EtcdTemplate,
    EtcdTuning, StorageSpec, TemplateKind, TlsSpec,
};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::cluster_object::ClusterObject;
use super::context::{Context, Error, Result, now};
pub use super::resolved::Resolved;
use super::status::{TemplateOutcome, VersionVerdict};
use crate::render::RenderInputs;

pub use etcdfleet_api::template::REBASE_ANNOTATION;
/// Annotation holding the template values last written into the spec (JSON),
/// so a rebase can tell a user's edit from a template default.
pub const MATERIALIZED_ANNOTATION: &str = "etcdfleet.dev/materialized-values";

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
    // A name goes into a request path only once it is an object name.
    let invalid = |path: &str, name: &str| {
        etcdfleet_api::names::reference_problem(path, name).map(|message| {
            ResolveError::InvalidField {
                path: path.to_string(),
                message,
            }
        })
    };
    let get_cluster_template = |name: String, path: &'static str| {
        let api = cluster_templates.clone();
        async move {
            if let Some(e) = invalid(path, &name) {
                return Ok(Err(e));
            }
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
        TemplateKind::ClusterEtcdTemplate => Ok(get_cluster_template(
            template_ref.name.clone(),
            "spec.templateRef.name",
        )
        .await?
        .map(|ct| (Some(ct), None))),
        TemplateKind::EtcdTemplate => {
            if let Some(e) = invalid("spec.templateRef.name", &template_ref.name) {
                return Ok(Err(e));
            }
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
                Some(base) => Ok(get_cluster_template(base.clone(), "baseTemplate")
                    .await?
                    .map(|ct| (Some(ct), Some(t)))),
                None => Ok(Ok((None, Some(t)))),
            }
        }
    }
}

/// Whether the cluster's template values were materialized into its spec
/// (recorded in `status.template`): from then on its own spec is the truth.
pub fn is_materialized(cluster: &EtcdCluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .is_some()
}

/// Whether a person asked to re-resolve from the current template
/// ([`REBASE_ANNOTATION`]).
pub fn rebase_requested(cluster: &EtcdCluster) -> bool {
    cluster.annotations().contains_key(REBASE_ANNOTATION)
}

/// What the resolve stage found: the template chain's outcome, the
/// version policy's verdict, and the cluster ready to render (`None` when
/// it cannot be: the template or the version says why).
#[derive(Default)]
pub struct ResolveOutcome {
    pub template: Option<TemplateOutcome>,
    /// The spec resolved completely (from its own fields, after any
    /// template values were written into it).
    pub spec_resolved: bool,
    pub version: Option<VersionVerdict>,
    pub resolved: Option<Resolved>,
}

/// Where a cluster's resolution comes from: its template chain until the
/// chain's values are written into its spec (or a rebase asks again), its
/// own spec after that. The one choice, for the controller and for `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionSource {
    Templates,
    OwnSpec,
}

pub fn resolution_source(cluster: &EtcdCluster) -> ResolutionSource {
    let pending = !is_materialized(cluster) || rebase_requested(cluster);
    if cluster.spec.template_ref.is_some() && pending {
        ResolutionSource::Templates
    } else {
        ResolutionSource::OwnSpec
    }
}

/// Resolves the cluster. With `writes` (not paused), the template chain's
/// values and the controller's defaults are written into its spec first,
/// through `object`.
pub async fn resolve_cluster(
    cluster: &EtcdCluster,
    ctx: &Context,
    object: &mut ClusterObject,
    writes: bool,
) -> Result<ResolveOutcome> {
    let mut out = ResolveOutcome::default();
    let mut spec = cluster.spec.clone();
    // The values this controller wrote into the spec so far (for a rebase).
    let mut recorded = recorded_values(cluster);
    if writes && resolution_source(cluster) == ResolutionSource::Templates {
        match materialize(cluster, ctx, object).await? {
            Err(e) => {
                out.template = Some(TemplateOutcome::Failed(e));
                return Ok(out);
            }
            Ok(m) => {
                recorded = m.recorded;
                out.template = Some(TemplateOutcome::Applied(m.record));
                // Continue with the spec as now written.
                spec = m.spec;
            }
        }
    }
    // From here on the spec alone is the truth.
    let resolution = match resolve_own_spec(&spec) {
        Ok(r) => r,
        Err(e) => {
            out.template = Some(TemplateOutcome::Failed(e));
            return Ok(out);
        }
    };
    out.spec_resolved = true;
    // Every value the rendered objects depend on goes into the spec: a later
    // release that changes a built-in default then changes nothing here.
    let defaults = controller_defaults(&spec, &resolution.spec);
    if writes && defaults != EtcdConfig::default() {
        write_defaults(object, &defaults, recorded).await?;
    }
    let (verdict, resolved) = decide_version(cluster, resolution);
    out.version = Some(verdict);
    out.resolved = resolved;
    Ok(out)
}

/// The version policy's verdict on the spec, and what to render with: at
/// the running version while a change is rejected (nothing, if the cluster
/// never ran).
fn decide_version(
    cluster: &EtcdCluster,
    resolution: Resolution,
) -> (VersionVerdict, Option<Resolved>) {
    let current = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_version.clone());
    let requested = resolution.spec.version.to_string();
    let (verdict, version_change) =
        match decide_for(current.as_deref(), &requested, cluster.annotations()) {
            Ok(change) => (VersionVerdict::Accepted(change.clone()), Some(change)),
            Err(rejection) => {
                let running = current.as_deref().and_then(parse_full_version);
                (VersionVerdict::Rejected { rejection, running }, None)
            }
        };
    if version_change.is_none() && current.is_none() {
        return (verdict, None);
    }
    let mut inputs = render_inputs(cluster, &resolution);
    if version_change.is_none()
        && let Some(current) = current
        && let Ok(v) = semver::Version::parse(&current)
    {
        inputs.version = current;
        inputs.image = image_for(cluster.spec.config.image_repository.as_deref(), &v);
    }
    let resolved = Resolved {
        resolution,
        inputs,
        version_change,
    };
    (verdict, Some(resolved))
}

/// The template values written into a cluster's spec this reconcile.
struct Materialized {
    /// The spec as now written.
    spec: EtcdClusterSpec,
    /// Which template, for `status.template`.
    record: Option<AppliedTemplate>,
    /// Every value the controller wrote into the spec so far.
    recorded: serde_json::Value,
}

/// Fetches the template chain, resolves the cluster against it (rebased if
/// asked) and writes the template values of the fields left empty into its
/// spec. `Ok(Err(_))`: the chain does not resolve; nothing was written.
async fn materialize(
    cluster: &EtcdCluster,
    ctx: &Context,
    object: &mut ClusterObject,
) -> Result<std::result::Result<Materialized, ResolveError>> {
    let rebase = rebase_requested(cluster);
    let (ct, t) = match fetch_templates(cluster, ctx).await? {
        Ok(templates) => templates,
        Err(e) => return Ok(Err(e)),
    };
    let mut spec = if rebase {
        match rebased_spec(cluster) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        }
    } else {
        cluster.spec.clone()
    };
    let resolution = match resolve(ct.as_ref(), t.as_ref(), &spec) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let mut values = etcdfleet_api::template::materialize(&spec, &resolution);
    let not_carried = match rebase {
        true => keep_storage(cluster.spec.config.storage.as_ref(), &spec, &mut values),
        false => Vec::new(),
    };
    let recorded = write_materialized(cluster, object, &values, rebase).await?;
    spec.config = merge_config(&spec.config, &values).map_err(Error::Invalid)?;
    let mut record = applied_template(ct.as_ref(), t.as_ref(), &resolution);
    if let Some(r) = record.as_mut() {
        r.not_carried = not_carried;
    }
    Ok(Ok(Materialized {
        spec,
        record,
        recorded,
    }))
}

/// The record of the template (chain) a cluster took its values from.
pub fn applied_template(
    cluster_template: Option<&ClusterEtcdTemplate>,
    template: Option<&EtcdTemplate>,
    resolution: &Resolution,
) -> Option<AppliedTemplate> {
    let (kind, name, generation) = match (template, cluster_template) {
        (Some(t), _) => ("EtcdTemplate", t.name_any(), t.meta().generation),
        (None, Some(ct)) => ("ClusterEtcdTemplate", ct.name_any(), ct.meta().generation),
        (None, None) => return None,
    };
    let base = template.and(cluster_template);
    Some(AppliedTemplate {
        kind: kind.to_string(),
        name,
        generation,
        base: base.map(|b| b.name_any()),
        base_generation: base.and_then(|b| b.meta().generation),
        materialized_fields: resolution.template_supplied_paths(),
        not_carried: Vec::new(),
        applied_at: Some(now()),
    })
}

/// What the controller recorded it wrote into the spec so far.
fn recorded_values(cluster: &EtcdCluster) -> serde_json::Value {
    cluster
        .annotations()
        .get(MATERIALIZED_ANNOTATION)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| serde_json::json!({}))
}

/// The token member 0 bootstraps with while a recovery restores it from a
/// backup (see [`crate::render::restored_cluster_token`]).
fn restored_cluster_token(cluster: &EtcdCluster) -> Option<String> {
    let status = cluster.status.as_ref()?;
    let record =
        (status.last_recovery.as_ref()).filter(|r| r.in_progress() && r.backup.is_some())?;
    let started = record.started_time.as_ref().map(|t| t.0.to_string());
    let recovery = format!("{}@{}", record.id, started.unwrap_or_default());
    let uid = cluster.meta().uid.clone().unwrap_or_default();
    Some(crate::render::restored_cluster_token(
        &cluster.name_any(),
        &uid,
        &recovery,
    ))
}

/// The render inputs of a resolved cluster.
pub fn render_inputs(cluster: &EtcdCluster, resolution: &Resolution) -> RenderInputs {
    let r = &resolution.spec;
    let resources = (r.resources.requests.as_ref().is_some_and(|m| !m.is_empty())
        || r.resources.limits.as_ref().is_some_and(|m| !m.is_empty()))
    .then(|| r.resources.clone());
    let rotation = cluster.status.as_ref().and_then(|s| s.ca_rotation.as_ref());
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
        // The snapshot verified before the first write, never re-resolved;
        // while a recovery from a backup is under way, that backup's.
        restore: cluster.status.as_ref().and_then(|s| {
            let recovering = (s.last_recovery.as_ref()).filter(|r| r.in_progress());
            match recovering.and_then(|r| r.backup.as_ref()) {
                Some(b) => Some(b.snapshot.clone()),
                None => s.restore.clone(),
            }
        }),
        // Read from the StatefulSet when one is rewritten (`act`); a
        // restore by a recovery starts a cluster of its own token.
        initial_cluster_token: restored_cluster_token(cluster),
        ca_roll_stamp: etcdfleet_api::ca_rotation::roll_stamp(rotation),
        publish_ca_bundle: rotation.is_some(),
        force_new_cluster: None,
    }
}

/// The values the controller itself would fill in (built-in defaults) for
/// fields the spec leaves empty: what the rendered objects depend on.
pub fn controller_defaults(spec: &EtcdClusterSpec, r: &ResolvedEtcdSpec) -> EtcdConfig {
    let c = &spec.config;
    let mut out = EtcdConfig::default();
    if c.replicas.is_none() {
        out.replicas = Some(r.replicas);
    }
    if c.image_repository.is_none() {
        out.image_repository = Some(
            r.image
                .rsplit_once(':')
                .map_or(r.image.as_str(), |(repo, _)| repo)
                .to_string(),
        );
    }
    if c.workload_namespace.is_none() {
        out.workload_namespace = Some(r.workload_namespace.clone());
    }
    let storage = c.storage.clone().unwrap_or_default();
    let mut add_storage = StorageSpec::default();
    if storage.size.is_none() {
        add_storage.size = Some(r.storage.size.clone());
    }
    if storage.storage_class_name.is_none() {
        add_storage.storage_class_name = r.storage.class.clone();
    }
    if add_storage != StorageSpec::default() {
        out.storage = Some(add_storage);
    }
    if c.tls.as_ref().and_then(|t| t.enabled).is_none() {
        out.tls = Some(TlsSpec {
            enabled: Some(r.tls_enabled),
        });
    }
    let tuning = c.etcd.clone().unwrap_or_default();
    let t = &r.tuning;
    let add_tuning = EtcdTuning {
        heartbeat_interval_millis: tuning
            .heartbeat_interval_millis
            .is_none()
            .then_some(t.heartbeat_interval_millis),
        election_timeout_millis: tuning
            .election_timeout_millis
            .is_none()
            .then_some(t.election_timeout_millis),
        // A quota derived from the size follows the size: never pinned.
        quota_backend_bytes: (tuning.quota_backend_bytes.is_none() && !t.quota_from_storage)
            .then_some(t.quota_backend_bytes),
        quota_backend_percent_of_storage: None,
        auto_compaction_retention: tuning
            .auto_compaction_retention
            .is_none()
            .then(|| t.auto_compaction_retention.clone()),
        snapshot_count: tuning.snapshot_count.is_none().then_some(t.snapshot_count),
    };
    if add_tuning != EtcdTuning::default() {
        out.etcd = Some(add_tuning);
    }
    out
}

/// Writes the controller's defaults into the spec (a merge patch conditional
/// on the resourceVersion read: a concurrent edit wins and is re-read) and
/// records them with the template values, so a rebase treats them alike.
async fn write_defaults(
    object: &mut ClusterObject,
    defaults: &EtcdConfig,
    mut recorded: serde_json::Value,
) -> Result<()> {
    let values = to_json(defaults).map_err(Error::Invalid)?;
    merge_json(&mut recorded, &values);
    let patch = serde_json::json!({
        "metadata": {
            "annotations": { MATERIALIZED_ANNOTATION: recorded.to_string() },
        },
        "spec": values,
    });
    object.merge(patch).await.map(|_| ())
}

fn to_json(config: &EtcdConfig) -> std::result::Result<serde_json::Value, String> {
    serde_json::to_value(config).map_err(|e| format!("spec does not serialize: {e}"))
}

/// For a rebase: the spec with every field that still holds the value last
/// written from a template cleared, so the current template fills it again.
/// Fields the user changed since are kept. Clearing can leave an object
/// without a required field (a backup destination without its bucket): that
/// is a resolve error, reported, never a panic.
fn rebased_spec(cluster: &EtcdCluster) -> Result<EtcdClusterSpec, ResolveError> {
    let mut spec = cluster.spec.clone();
    let Some(previous) = cluster
        .annotations()
        .get(MATERIALIZED_ANNOTATION)
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
    else {
        return Ok(spec);
    };
    let invalid = |e: serde_json::Error| ResolveError::InvalidField {
        path: "metadata.annotations".into(),
        message: format!("rebase cannot clear the values written last time: {e}"),
    };
    let mut current = serde_json::to_value(&spec.config).map_err(invalid)?;
    clear_matching(&mut current, &previous);
    spec.config = serde_json::from_value(current).map_err(invalid)?;
    Ok(spec)
}

/// A rebase carries storage like every other field: a larger size grows the
/// volumes and another class moves them (the storage rules do both), but a
/// size below the one set, or a field the template no longer gives (the API
/// keeps a size and a class once set), is not carried: the value set stays
/// in `values`, and the returned lines say which and why, for
/// `status.template.notCarried` and the `TemplateResolved` condition.
fn keep_storage(
    before: Option<&StorageSpec>,
    rebased: &EtcdClusterSpec,
    values: &mut EtcdConfig,
) -> Vec<String> {
    let Some(before) = before else {
        return Vec::new();
    };
    let kept = rebased.config.storage.clone().unwrap_or_default();
    let mut supplied = values.storage.clone().unwrap_or_default();
    let mut notes = Vec::new();
    if let Some(set) = &before.size {
        match kept.size.as_ref().or(supplied.size.as_ref()) {
            None => notes.push(format!(
                "spec.storage.size stays {}: the template gives none, and a size once set \
                 stays",
                set.0
            )),
            Some(new) if smaller(&new.0, &set.0) => notes.push(format!(
                "spec.storage.size stays {}: the template's {} is smaller, and volumes never \
                 shrink",
                set.0, new.0
            )),
            Some(_) => {}
        }
        if !notes.is_empty() && kept.size.is_none() {
            supplied.size = Some(set.clone());
        }
    }
    if let Some(class) = &before.storage_class_name
        && kept.storage_class_name.is_none()
        && supplied.storage_class_name.is_none()
    {
        notes.push(format!(
            "spec.storage.storageClassName stays {class}: the template names none, and a \
             class once set stays"
        ));
        supplied.storage_class_name = Some(class.clone());
    }
    if !notes.is_empty() {
        values.storage = Some(supplied);
    }
    notes
}

/// `a < b` as byte counts (an unreadable quantity compares as not smaller:
/// the storage rules refuse it with their own reason).
fn smaller(a: &str, b: &str) -> bool {
    use etcdfleet_api::quantity::bytes;
    matches!((bytes(a), bytes(b)), (Ok(a), Ok(b)) if a < b)
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

fn merge_config(base: &EtcdConfig, add: &EtcdConfig) -> std::result::Result<EtcdConfig, String> {
    let err = |e: serde_json::Error| format!("spec does not round-trip: {e}");
    let mut b = serde_json::to_value(base).map_err(err)?;
    let a = serde_json::to_value(add).map_err(err)?;
    merge_json(&mut b, &a);
    serde_json::from_value(b).map_err(err)
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
    object: &mut ClusterObject,
    values: &EtcdConfig,
    rebase: bool,
) -> Result<serde_json::Value> {
    let previous: serde_json::Value = cluster
        .annotations()
        .get(MATERIALIZED_ANNOTATION)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let values_json = to_json(values).map_err(Error::Invalid)?;
    let mut recorded = if rebase {
        serde_json::json!({})
    } else {
        previous
    };
    merge_json(&mut recorded, &values_json);
    // Server-side apply: this field manager owns exactly what it applies, and
    // a field it applied before and omits now is REMOVED. So every apply
    // carries the whole set the controller owns: what it wrote before plus
    // the new values (a second pass must not drop the first pass's fields);
    // on a rebase, the rebased values, so the values the template no longer
    // supplies are removed and nothing else (storage keeps what it must:
    // `keep_storage` put it back in `values`).
    // Fields the user edited since are owned by the user's manager and stay:
    // what was written before is applied with its CURRENT value, so the
    // (forced) apply never overwrites such an edit.
    let current = to_json(&cluster.spec.config).map_err(Error::Invalid)?;
    let mut spec = if rebase {
        serde_json::json!({})
    } else {
        pick(&current, &recorded)
    };
    merge_json(&mut spec, &values_json);
    object.apply_spec(spec).await?;
    // Bookkeeping annotations by merge patch (null deletes the rebase request).
    let mut annotations = serde_json::Map::new();
    annotations.insert(MATERIALIZED_ANNOTATION.into(), recorded.to_string().into());
    if rebase {
        annotations.insert(REBASE_ANNOTATION.into(), serde_json::Value::Null);
    }
    object
        .merge(serde_json::json!({ "metadata": { "annotations": annotations } }))
        .await?;
    Ok(recorded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebase_clears_only_template_values_and_never_panics() {
        // The template wrote a backup destination; clearing the values written
        // last time leaves `destination` without its required `bucket`.
        let mut cluster = EtcdCluster::new(
            "c",
            serde_json::from_value(serde_json::json!({
                "clusterRef": { "name": "w" },
                "version": "3.5.1",
                "backup": { "destination": { "bucket": "b", "prefix": "mine" } }
            }))
            .unwrap(),
        );
        cluster.metadata.annotations = Some(
            [(
                MATERIALIZED_ANNOTATION.to_string(),
                serde_json::json!({ "backup": { "destination": { "bucket": "b" } } }).to_string(),
            )]
            .into(),
        );
        // Every backup field is optional now, so clearing the bucket the
        // template wrote leaves a valid spec; the user's prefix stays theirs.
        // (A spec that would no longer parse is an InvalidField error, never a
        // panic: `rebased_spec` returns a Result.)
        let spec = rebased_spec(&cluster).expect("a valid rebased spec");
        let destination = spec.config.backup.and_then(|b| b.destination).unwrap();
        assert_eq!(destination.bucket, None);
        assert_eq!(destination.prefix.as_deref(), Some("mine"));
    }

    #[test]
    fn every_value_the_renderer_needs_is_a_controller_default_until_set() {
        let spec: EtcdClusterSpec = serde_json::from_value(serde_json::json!({
            "clusterRef": { "name": "w" },
            "version": "3.5.1",
            "replicas": 3,
            "etcd": { "quotaBackendBytes": 1000000000 }
        }))
        .unwrap();
        let resolved = resolve_own_spec(&spec).unwrap();
        let d = controller_defaults(&spec, &resolved.spec);
        assert_eq!(d.replicas, None, "set by the user");
        assert!(d.image_repository.is_some() && d.workload_namespace.is_some());
        assert!(d.storage.as_ref().and_then(|s| s.size.as_ref()).is_some());
        assert_eq!(d.tls.and_then(|t| t.enabled), Some(true));
        let tuning = d.etcd.unwrap();
        assert_eq!(tuning.quota_backend_bytes, None, "set by the user");
        assert!(tuning.heartbeat_interval_millis.is_some() && tuning.snapshot_count.is_some());
        // Once they are all in the spec, there is nothing left to fill.
        let mut full = spec.clone();
        full.config =
            merge_config(&spec.config, &controller_defaults(&spec, &resolved.spec)).unwrap();
        assert_eq!(
            controller_defaults(&full, &resolve_own_spec(&full).unwrap().spec),
            EtcdConfig::default()
        );
    }
}
