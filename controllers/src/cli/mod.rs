//! The offline subcommands of the `etcdfleet` binary, as pure functions:
//! `render` (what the controller would write for a cluster, and where each
//! value came from) and `plan` (what it would do next, and why). They read
//! manifests only — no cluster, no network — so a platform engineer can ask
//! "what happens if I apply this?" and tests can answer it from YAML fixtures.
//!
//! `plan` runs the controller's own decisions: template resolution
//! (`etcdfleet_api::template::resolve`), the version policy
//! (`etcdfleet_api::version::decide`) and the planner
//! (`etcdcluster::plan::plan_next_step`) on an `Observation` rebuilt from
//! `status.members`. What the status cannot say (whether the workload objects
//! exist and match) is assumed to be in order. Its `Available` condition says
//! when the last reconcile reached too few members to see a quorum (cut off
//! from Ready pods, or quorum lost): then the members list is as last seen,
//! and the plan is made as the controller made it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::time::Duration;

use etcdfleet_api::conditions;
use etcdfleet_api::template::{Resolution, ResolveError, resolve};
use etcdfleet_api::validation::validate_object;
use etcdfleet_api::version::{
    VersionChange, VersionRejection, decide_for, image_repository, parse_full_version,
};
use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdCluster, EtcdClusterStatus, EtcdFleetRollout, EtcdTemplate,
    MemberStatus, TemplateKind,
};
use kube::{CustomResourceExt, ResourceExt};
use serde::Deserialize;

mod document;

use crate::etcd::{ClusterHealth, Member, MemberObservation, MemberStatus as EtcdMemberStatus};
use crate::etcdcluster::plan::{
    EtcdObservation, Observation, Plan, PodObservation, PvcObservation, QuorumView, RemovalCause,
    StatefulSetObservation, Step, plan_next_step, quorum_view,
};
use crate::etcdcluster::resolve::{
    is_materialized, rebase_requested, render_inputs, resolve_own_spec,
};
use crate::render::{self, Names, RenderInputs, RenderProfile};

use document::JsonDocument;

/// Bad input files.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{source_name}: document {index}: {message}")]
    Document {
        source_name: String,
        index: usize,
        message: String,
    },
    #[error("{0}: no EtcdCluster found")]
    NoCluster(String),
    #[error("EtcdCluster {cluster}: {error}")]
    Resolve {
        cluster: String,
        #[source]
        error: ResolveError,
    },
    /// The version policy refuses the resolved version (what `plan`
    /// reports as `VersionAccepted=False`): nothing is rendered for it.
    #[error("EtcdCluster {cluster}: spec.version: {error}")]
    Version {
        cluster: String,
        #[source]
        error: Box<etcdfleet_api::version::VersionRejection>,
    },
}

/// The objects found in a set of manifests.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub clusters: Vec<EtcdCluster>,
    pub templates: Vec<EtcdTemplate>,
    pub cluster_templates: Vec<ClusterEtcdTemplate>,
    pub rollouts: Vec<EtcdFleetRollout>,
    /// `kind name` of documents of other kinds, which are skipped.
    pub ignored: Vec<String>,
    /// Objects of the project's kinds that the API server would refuse; the
    /// others are still read, so one bad cluster hides nothing.
    pub invalid: Vec<InvalidObject>,
}

/// An object that fails the validation of its CRD (schema and CEL rules),
/// or holds fields its schema does not declare (a misspelling offline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidObject {
    pub source_name: String,
    pub index: usize,
    /// `EtcdCluster "shop"`.
    pub object: String,
    /// One line per field: `spec.replicas: Invalid value: ...`.
    pub errors: Vec<String>,
}

impl fmt::Display for InvalidObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: document {}: {} is invalid: {}",
            self.source_name,
            self.index,
            self.object,
            self.errors.join("; ")
        )
    }
}

/// Checks one object of a project kind as the API server would (its CRD's
/// schema and CEL rules), and also refuses fields the schema does not declare:
/// the API server would silently drop them, offline they are misspellings.
/// Returns one message per offending field, each starting with its path.
pub fn validate_offline(kind: &str, object: &serde_json::Value) -> Result<(), Vec<String>> {
    let crd = match kind {
        "EtcdCluster" => EtcdCluster::crd(),
        "EtcdTemplate" => EtcdTemplate::crd(),
        "ClusterEtcdTemplate" => ClusterEtcdTemplate::crd(),
        "EtcdFleetRollout" => EtcdFleetRollout::crd(),
        other => return Err(vec![format!("kind: {other} is not an etcdfleet kind")]),
    };
    let crd = crate::crd::with_also_served(crd, etcdfleet_api::ALSO_SERVED);
    let mut errors: Vec<String> = match validate_object(&crd, object, None) {
        Ok(v) => v
            .unknown_fields
            .iter()
            .map(|f| format!("{f}: unknown field (not in the {kind} schema)"))
            .collect(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    errors.extend(schedule_error(object));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// What the CRD's rule cannot say of `spec.backup.schedule` (it checks five
/// fields only): whether the cron parser the controller runs accepts it.
fn schedule_error(object: &serde_json::Value) -> Option<String> {
    let schedule = object.pointer("/spec/backup/schedule")?.as_str()?;
    let error = etcdfleet_api::backup::parse_schedule(schedule).err()?;
    Some(format!(
        "spec.backup.schedule: Invalid value: \"{schedule}\": {error}"
    ))
}

impl Manifests {
    /// Parses a multi-document YAML stream; `List` documents (what
    /// `kubectl get -o yaml` prints) are unpacked. `source_name` names the
    /// stream in errors.
    pub fn parse(yaml: &str, source_name: &str) -> Result<Self, CliError> {
        let mut out = Manifests::default();
        out.add(yaml, source_name)?;
        Ok(out)
    }

    /// Adds the documents of another stream.
    pub fn add(&mut self, yaml: &str, source_name: &str) -> Result<(), CliError> {
        for (i, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
            let index = i + 1;
            let err = |message: String| CliError::Document {
                source_name: source_name.to_string(),
                index,
                message,
            };
            let JsonDocument(value) =
                JsonDocument::deserialize(doc).map_err(|e| err(e.to_string()))?;
            self.add_value(value, source_name, index).map_err(err)?;
        }
        Ok(())
    }

    fn add_value(
        &mut self,
        value: serde_json::Value,
        source_name: &str,
        index: usize,
    ) -> Result<(), String> {
        if value.is_null() {
            return Ok(());
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or("no kind")?
            .to_string();
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        let typed = |e: serde_json::Error| format!("{kind} {name:?}: {e}");
        match kind.as_str() {
            "List"
            | "EtcdClusterList"
            | "EtcdTemplateList"
            | "ClusterEtcdTemplateList"
            | "EtcdFleetRolloutList" => {
                let items = value
                    .get("items")
                    .and_then(|i| i.as_array())
                    .cloned()
                    .unwrap_or_default();
                for item in items {
                    self.add_value(item, source_name, index)?;
                }
            }
            "EtcdCluster" | "EtcdTemplate" | "ClusterEtcdTemplate" | "EtcdFleetRollout" => {
                let invalid = |errors: Vec<String>| InvalidObject {
                    source_name: source_name.to_string(),
                    index,
                    object: format!("{kind} {name:?}"),
                    errors,
                };
                let json = value;
                if let Err(errors) = validate_offline(&kind, &json) {
                    self.invalid.push(invalid(errors));
                    return Ok(());
                }
                let added = match kind.as_str() {
                    "EtcdCluster" => serde_json::from_value(json).map(|c| self.clusters.push(c)),
                    "EtcdTemplate" => serde_json::from_value(json).map(|t| self.templates.push(t)),
                    "EtcdFleetRollout" => {
                        serde_json::from_value(json).map(|r| self.rollouts.push(r))
                    }
                    _ => serde_json::from_value(json).map(|t| self.cluster_templates.push(t)),
                };
                if let Err(e) = added {
                    self.invalid.push(invalid(vec![typed(e)]));
                }
            }
            _ => self.ignored.push(format!("{kind} {name}")),
        }
        Ok(())
    }

    pub fn extend(&mut self, other: Manifests) {
        self.clusters.extend(other.clusters);
        self.templates.extend(other.templates);
        self.cluster_templates.extend(other.cluster_templates);
        self.rollouts.extend(other.rollouts);
        self.ignored.extend(other.ignored);
        self.invalid.extend(other.invalid);
    }

    fn cluster_template(&self, name: &str) -> Option<&ClusterEtcdTemplate> {
        self.cluster_templates.iter().find(|t| t.name_any() == name)
    }

    /// A namespaced template of that name in the cluster's namespace (a
    /// template without a namespace in the file matches any).
    fn template(&self, name: &str, namespace: Option<&str>) -> Option<&EtcdTemplate> {
        self.templates.iter().find(|t| {
            t.name_any() == name
                && (t.namespace().is_none()
                    || namespace.is_none()
                    || t.namespace().as_deref() == namespace)
        })
    }

    /// The template chain of a cluster, as the controller would fetch it.
    pub fn templates_for(
        &self,
        cluster: &EtcdCluster,
    ) -> Result<(Option<&ClusterEtcdTemplate>, Option<&EtcdTemplate>), ResolveError> {
        let Some(template_ref) = &cluster.spec.template_ref else {
            return Ok((None, None));
        };
        let not_found = |kind, name: &str| ResolveError::TemplateNotFound {
            kind,
            name: name.to_string(),
        };
        match template_ref.kind {
            TemplateKind::ClusterEtcdTemplate => self
                .cluster_template(&template_ref.name)
                .map(|ct| (Some(ct), None))
                .ok_or_else(|| not_found(TemplateKind::ClusterEtcdTemplate, &template_ref.name)),
            TemplateKind::EtcdTemplate => {
                let ns = cluster.namespace();
                let t = self
                    .template(&template_ref.name, ns.as_deref())
                    .ok_or_else(|| not_found(TemplateKind::EtcdTemplate, &template_ref.name))?;
                match &t.spec.base_template {
                    Some(base) => self
                        .cluster_template(base)
                        .map(|ct| (Some(ct), Some(t)))
                        .ok_or_else(|| not_found(TemplateKind::ClusterEtcdTemplate, base)),
                    None => Ok((None, Some(t))),
                }
            }
        }
    }
}

fn cluster_id(cluster: &EtcdCluster) -> String {
    match cluster.namespace() {
        Some(ns) => format!("{ns}/{}", cluster.name_any()),
        None => cluster.name_any(),
    }
}

/// How a cluster resolves, the way the controller resolves it: through its
/// templates until their values are materialized into the spec (recorded in
/// `status.template`), from its own spec alone after that (unless a rebase is asked).
pub fn resolve_like_controller(
    cluster: &EtcdCluster,
    manifests: &Manifests,
) -> Result<(Resolution, ResolutionBasis), ResolveError> {
    if cluster.spec.template_ref.is_some() && is_materialized(cluster) && !rebase_requested(cluster)
    {
        return resolve_own_spec(&cluster.spec).map(|r| (r, ResolutionBasis::Materialized));
    }
    let (ct, t) = manifests.templates_for(cluster)?;
    resolve(ct, t, &cluster.spec).map(|r| (r, ResolutionBasis::Templates))
}

/// What a resolution was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionBasis {
    /// The template chain given, merged under the cluster's spec.
    Templates,
    /// The cluster's own spec: its template values were already written into it.
    Materialized,
}

/// The resolved spec as a YAML-friendly value.
fn resolved_spec_value(r: &Resolution) -> serde_json::Value {
    let s = &r.spec;
    serde_json::json!({
        "version": s.version.to_string(),
        "replicas": s.replicas,
        "image": s.image,
        "workloadNamespace": s.workload_namespace,
        "storage": { "storageClassName": s.storage.class, "size": s.storage.size.0 },
        "resources": s.resources,
        "tls": { "enabled": s.tls_enabled },
        "podTemplate": s.pod,
        "etcd": {
            "heartbeatIntervalMillis": s.tuning.heartbeat_interval_millis,
            "electionTimeoutMillis": s.tuning.election_timeout_millis,
            "quotaBackendBytes": s.tuning.quota_backend_bytes,
            "autoCompactionRetention": s.tuning.auto_compaction_retention,
            "snapshotCount": s.tuning.snapshot_count,
        },
        "backup": s.backup,
    })
}

/// What `render` prints for one cluster.
#[derive(Debug, Clone)]
pub struct RenderReport {
    pub cluster: String,
    pub resolution: Resolution,
    pub inputs: RenderInputs,
    /// The workload objects the first reconciles write, in order.
    pub objects: Vec<serde_json::Value>,
}

/// Resolves a cluster against the given templates and renders the workload
/// objects the controller would write when it creates the cluster.
pub fn render_cluster(
    cluster: &EtcdCluster,
    manifests: &Manifests,
) -> Result<RenderReport, CliError> {
    let id = cluster_id(cluster);
    let (ct, t) = manifests
        .templates_for(cluster)
        .map_err(|error| CliError::Resolve {
            cluster: id.clone(),
            error,
        })?;
    let resolution = resolve(ct, t, &cluster.spec).map_err(|error| CliError::Resolve {
        cluster: id.clone(),
        error,
    })?;
    etcdfleet_api::version::decide(None, &resolution.spec.version.to_string()).map_err(
        |error| CliError::Version {
            cluster: id.clone(),
            error: Box::new(error),
        },
    )?;
    let inputs = render_inputs(cluster, &resolution);
    let names = inputs.names();
    let json = |v: serde_json::Result<serde_json::Value>| v.expect("Kubernetes objects serialize");
    // Bootstrap starts one member; the others join one at a time as learners.
    let objects = vec![
        json(serde_json::to_value(render::namespace(&inputs))),
        json(serde_json::to_value(render::peer_service(&inputs))),
        json(serde_json::to_value(render::client_service(&inputs))),
        json(serde_json::to_value(render::pdb(&inputs))),
        json(serde_json::to_value(render::members_configmap(
            &inputs,
            &render::initial_cluster(&names, inputs.tls, [0]),
            "new",
        ))),
        json(serde_json::to_value(render::statefulset(
            &inputs,
            &RenderProfile::default(),
            1,
        ))),
    ];
    Ok(RenderReport {
        cluster: id,
        resolution,
        inputs,
        objects,
    })
}

impl fmt::Display for RenderReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yaml = |v: &serde_json::Value| serde_yaml::to_string(v).unwrap_or_default();
        writeln!(f, "# EtcdCluster {}", self.cluster)?;
        writeln!(f, "# resolved spec:")?;
        for line in yaml(&resolved_spec_value(&self.resolution)).lines() {
            writeln!(f, "#   {line}")?;
        }
        writeln!(f, "# where each field came from:")?;
        let width = self
            .resolution
            .sources
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(0);
        for (path, source) in &self.resolution.sources {
            writeln!(f, "#   {path:width$}  {source}")?;
        }
        writeln!(
            f,
            "# workload objects (namespace {}); the StatefulSet starts with 1 member, \
             and the others join one at a time as learners up to {}{}:",
            self.inputs.workload_namespace,
            self.resolution.spec.replicas,
            if self.inputs.tls {
                "; TLS Secrets are issued from the cluster's CA and not shown"
            } else {
                ""
            }
        )?;
        for object in &self.objects {
            writeln!(f, "---")?;
            f.write_str(&yaml(object))?;
        }
        Ok(())
    }
}

/// The version policy's verdict on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionVerdict {
    Accepted(VersionChange),
    Rejected(VersionRejection),
}

impl fmt::Display for VersionVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionVerdict::Accepted(VersionChange::Initial { requested }) => {
                write!(f, "accepted: create at {requested}")
            }
            VersionVerdict::Accepted(VersionChange::NoChange { version }) => {
                write!(f, "no-op: already runs {version}")
            }
            VersionVerdict::Accepted(VersionChange::PatchUpgrade { from, to }) => {
                write!(f, "accepted: patch upgrade from {from} to {to}")
            }
            VersionVerdict::Accepted(VersionChange::MinorUpgrade { from, to }) => {
                write!(f, "accepted: minor upgrade from {from} to {to}")
            }
            VersionVerdict::Accepted(VersionChange::Downgrade { from, to }) => {
                write!(f, "accepted: online downgrade from {from} to {to}")
            }
            VersionVerdict::Rejected(r) => write!(
                f,
                "rejected: VersionAccepted=False ({}): {}",
                r.reason(),
                r.message()
            ),
        }
    }
}

/// What `plan` says about one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    pub cluster: String,
    /// `Err((reason, message))` when the cluster does not resolve
    /// (`TemplateResolved=False`).
    pub resolve: Result<ResolutionBasis, (String, String)>,
    pub version: Option<VersionVerdict>,
    /// What the controller does next, one line (`upgrade: …`, `scale: …`,
    /// `waiting: …`, `no change`, `blocked: …`).
    pub next: String,
    pub paused: bool,
}

/// How a cluster's plan counts toward `plan`'s exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlanOutcome {
    /// Converged, or paused: the controller would do nothing.
    NoChange,
    /// The controller would act or is waiting to (not converged).
    Changes,
    /// It cannot proceed: the template does not resolve, the version is
    /// rejected, or the next step is blocked.
    Blocked,
}

/// `plan` exit code when every cluster is converged.
pub const EXIT_NO_CHANGE: u8 = 0;
/// `plan` / `render` exit code for input errors: an unreadable file, YAML
/// that does not parse, an object the API server would refuse.
pub const EXIT_INPUT_ERROR: u8 = 2;
/// `plan` exit code when some cluster has changes to make.
pub const EXIT_CHANGES: u8 = 3;
/// `plan` exit code when some cluster is rejected or blocked.
pub const EXIT_BLOCKED: u8 = 4;

/// The exit code of `plan`: input errors first, then blocked, then changes.
pub fn plan_exit_code(plans: &[ClusterPlan], invalid_inputs: usize) -> u8 {
    if invalid_inputs > 0 {
        return EXIT_INPUT_ERROR;
    }
    match plans.iter().map(ClusterPlan::outcome).max() {
        Some(PlanOutcome::Blocked) => EXIT_BLOCKED,
        Some(PlanOutcome::Changes) => EXIT_CHANGES,
        Some(PlanOutcome::NoChange) | None => EXIT_NO_CHANGE,
    }
}

impl ClusterPlan {
    pub fn outcome(&self) -> PlanOutcome {
        let rejected = matches!(self.version, Some(VersionVerdict::Rejected(_)));
        if self.resolve.is_err() || rejected || self.next.starts_with("blocked") {
            PlanOutcome::Blocked
        } else if self.paused || self.next == "no change" {
            PlanOutcome::NoChange
        } else {
            PlanOutcome::Changes
        }
    }
}

impl fmt::Display for ClusterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "EtcdCluster {}", self.cluster)?;
        match &self.resolve {
            Ok(ResolutionBasis::Templates) => {
                writeln!(f, "  template: TemplateResolved=True (from its templates)")?
            }
            Ok(ResolutionBasis::Materialized) => writeln!(
                f,
                "  template: TemplateResolved=True (template values already in the spec)"
            )?,
            Err((reason, message)) => writeln!(
                f,
                "  template: TemplateResolved=False ({reason}): {message}"
            )?,
        }
        if let Some(v) = &self.version {
            writeln!(f, "  version: {v}")?;
        }
        writeln!(f, "  next: {}", self.next)?;
        if self.paused {
            writeln!(
                f,
                "  paused: spec.paused is true, so the step above is not taken"
            )?;
        }
        Ok(())
    }
}

/// Plans every cluster in the manifests; `now` and `member_failure_grace`
/// decide which unhealthy members count as failed.
pub fn plan_all(
    manifests: &Manifests,
    now: k8s_openapi::jiff::Timestamp,
    member_failure_grace: Duration,
) -> Vec<ClusterPlan> {
    manifests
        .clusters
        .iter()
        .map(|c| plan_cluster(c, manifests, now, member_failure_grace))
        .collect()
}

/// What the controller would do next for one cluster, and why.
pub fn plan_cluster(
    cluster: &EtcdCluster,
    manifests: &Manifests,
    now: k8s_openapi::jiff::Timestamp,
    member_failure_grace: Duration,
) -> ClusterPlan {
    let id = cluster_id(cluster);
    let paused = cluster.spec.paused == Some(true);
    let (resolution, basis) = match resolve_like_controller(cluster, manifests) {
        Ok(r) => r,
        Err(e) => {
            return ClusterPlan {
                cluster: id,
                resolve: Err((e.reason().to_string(), e.to_string())),
                version: None,
                next: format!("blocked: fix {e}"),
                paused,
            };
        }
    };
    let status = cluster.status.clone().unwrap_or_default();
    let current = status.current_version.clone();
    let requested = resolution.spec.version.to_string();
    let verdict = match decide_for(current.as_deref(), &requested, cluster.annotations()) {
        Ok(change) => VersionVerdict::Accepted(change),
        Err(r) => VersionVerdict::Rejected(r),
    };
    let mut inputs = render_inputs(cluster, &resolution);
    let repository = image_repository(&inputs.image);
    let plan = |next: String| ClusterPlan {
        cluster: id.clone(),
        resolve: Ok(basis),
        version: Some(verdict.clone()),
        next,
        paused,
    };
    if let Some(next) = without_members(&status, &verdict) {
        return plan(next);
    }
    if let VersionVerdict::Rejected(_) = &verdict {
        // The controller holds the StatefulSet at the running version.
        if let Some(v) = current.as_deref().and_then(parse_full_version) {
            inputs.image = format!("{repository}:v{v}");
        }
    }
    let replicas = resolution.spec.replicas.max(1) as u32;
    let next = if status.members.is_empty() {
        format!(
            "create: no members in status yet; write the workload objects and bootstrap \
             member 0 of {replicas} (the others join one at a time as learners)"
        )
    } else {
        let mut obs = observation_from_status(
            &inputs,
            replicas,
            &status.members,
            now,
            member_failure_grace,
        );
        unanswered_as_reported(&status, &mut obs);
        describe_plan(&plan_next_step(&obs), &obs)
    };
    plan(next)
}

/// The plan of a status that lists no members, when it is not a new
/// cluster's: one story, never "create" beside a refusal or beside a
/// version the status says runs.
fn without_members(status: &EtcdClusterStatus, verdict: &VersionVerdict) -> Option<String> {
    if !status.members.is_empty() {
        return None;
    }
    match (verdict, status.current_version.as_deref()) {
        (VersionVerdict::Rejected(r), _) => Some(format!(
            "blocked: spec.version is refused ({}); nothing is created or changed until it is fixed",
            r.reason()
        )),
        (_, Some(running)) => Some(format!(
            "observe first: the status records etcd {running} running but lists no members \
             (the last reconcile reached none); the controller reads the members, pods and \
             volumes before acting, and never bootstraps over a cluster that ran"
        )),
        (_, None) => None,
    }
}

/// Rebuilds what the planner would observe from `status.members`: each
/// listed member has its pod (running the image of its reported version) and
/// its PVC; the workload objects are assumed present and current.
pub fn observation_from_status(
    inputs: &RenderInputs,
    desired_replicas: u32,
    members: &[MemberStatus],
    now: k8s_openapi::jiff::Timestamp,
    member_failure_grace: Duration,
) -> Observation {
    let names: Names = inputs.names();
    let entries = status_entries(&names, members);
    let observations = member_observations(&entries, &names, inputs.tls);
    let failed_members = failed_from_status(&entries, now, member_failure_grace);
    let (pods, pvcs) = pods_and_volumes_from_status(&entries, inputs);
    let sts_replicas = pods.keys().max().map_or(0, |o| o + 1);
    Observation {
        names,
        tls: inputs.tls,
        desired_replicas,
        stale_objects: Vec::new(),
        statefulset: Some(StatefulSetObservation {
            replicas: sts_replicas,
            image: inputs.image.clone(),
            template_hash: None,
            template_seen: true,
        }),
        pods,
        pvcs,
        etcd: EtcdObservation::Observed(ClusterHealth::new(observations)),
        failed_long_ago: BTreeSet::new(),
        failed_members,
        // Alarms are not in the status; `plan` cannot see them.
        alarms: Vec::new(),
        // Ownership, PKI and storage are read from the workload cluster, which
        // `plan` does not contact.
        conflicts: Vec::new(),
        pki_lost: false,
        storage_change: None,
        // The version policy is reported on its own line (VersionAccepted).
        requested_version: None,
        downgrade_acknowledged: None,
        version: Default::default(),
        known_voters: members.iter().filter(|m| !m.learner).count() as u32,
        last_failure: None,
        // A running cluster: the restore gate applies only before bootstrap.
        restore: Default::default(),
        adoption: None,
        ca_rotation: Default::default(),
    }
}

/// A listed member: its ordinal (from its name or peer URL), an id (its own,
/// else a made-up one no other member has) and its status.
type StatusEntry<'a> = (Option<u32>, u64, &'a MemberStatus);

fn status_entries<'a>(names: &Names, members: &'a [MemberStatus]) -> Vec<StatusEntry<'a>> {
    let mut used_ids = BTreeSet::new();
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let ordinal = names.ordinal_of(&m.name).or_else(|| {
                m.peer_urls
                    .iter()
                    .find_map(|u| names.ordinal_of_peer_url(u))
            });
            let id =
                m.id.as_deref()
                    .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                    .filter(|id| *id != 0 && !used_ids.contains(id))
                    .unwrap_or(0x1000 + i as u64);
            used_ids.insert(id);
            (ordinal, id, m)
        })
        .collect()
}

/// What etcd would say about each listed member.
fn member_observations(
    entries: &[StatusEntry<'_>],
    names: &Names,
    tls: bool,
) -> Vec<MemberObservation> {
    let leader = entries
        .iter()
        .find(|(_, _, m)| m.leader && m.healthy && !m.learner)
        .map_or(0, |(_, id, _)| *id);
    entries
        .iter()
        .map(|(ordinal, id, m)| {
            let peer_urls = match ordinal {
                Some(o) => vec![names.peer_url(*o, tls)],
                None => m.peer_urls.clone(),
            };
            let member = Member {
                id: *id,
                name: m.name.clone(),
                peer_urls,
                client_urls: m.client_urls.clone(),
                is_learner: m.learner,
            };
            // Raft indexes are not in the status: healthy members count as caught up.
            let status = m.healthy.then(|| EtcdMemberStatus {
                member_id: *id,
                cluster_id: 0,
                version: m.version.clone().unwrap_or_default(),
                leader,
                raft_index: 1,
                raft_term: 1,
                raft_applied_index: 1,
                db_size: m.db_size_bytes.unwrap_or(0),
                db_size_in_use: m.db_size_in_use_bytes.unwrap_or(0),
                is_learner: m.learner,
                ..Default::default()
            });
            MemberObservation {
                member,
                status,
                healthy: m.healthy,
                error: m.message.clone(),
            }
        })
        .collect()
}

/// Members unhealthy for longer than the failure grace, by the stored
/// `unhealthySince`.
fn failed_from_status(
    entries: &[StatusEntry<'_>],
    now: k8s_openapi::jiff::Timestamp,
    member_failure_grace: Duration,
) -> BTreeSet<u64> {
    entries
        .iter()
        .filter(|(_, _, m)| !m.healthy)
        .filter(|(_, _, m)| {
            m.unhealthy_since.as_ref().is_some_and(|since| {
                now.duration_since(since.0).as_secs_f64() >= member_failure_grace.as_secs_f64()
            })
        })
        .map(|(_, id, _)| *id)
        .collect()
}

/// The pods and volumes of the listed members at this cluster's ordinals.
fn pods_and_volumes_from_status(
    entries: &[StatusEntry<'_>],
    inputs: &RenderInputs,
) -> (BTreeMap<u32, PodObservation>, BTreeMap<u32, PvcObservation>) {
    let repository = image_repository(&inputs.image).to_string();
    let ordinals: BTreeMap<u32, &MemberStatus> = entries
        .iter()
        .filter_map(|(o, _, m)| o.map(|o| (o, *m)))
        .collect();
    let ids: BTreeMap<u32, u64> = entries
        .iter()
        .filter_map(|(o, id, _)| o.map(|o| (o, *id)))
        .collect();
    let pods = ordinals
        .iter()
        .map(|(o, m)| {
            let image = m
                .version
                .as_deref()
                .and_then(parse_full_version)
                .map_or_else(|| inputs.image.clone(), |v| format!("{repository}:v{v}"));
            (
                *o,
                PodObservation {
                    image,
                    template_hash: None,
                    running: true,
                    ready: m.healthy,
                    restart_count: 0,
                    deleting: false,
                    ready_means_etcd_healthy: true,
                    last_exit: None,
                },
            )
        })
        .collect();
    // Offline, volumes are taken as recorded for the member status lists
    // (what the controller would have written): no bookkeeping step shows.
    let pvcs = ids
        .iter()
        .map(|(o, id)| {
            (
                *o,
                PvcObservation {
                    member_id: Some(*id),
                    owner_recorded: true,
                    etcd_version: ordinals.get(o).and_then(|m| m.version.clone()),
                    deleting: false,
                },
            )
        })
        .collect();
    (pods, pvcs)
}

/// What the members list cannot say, `Available` does: when the last
/// reconcile reached too few members to see a quorum, the list holds the
/// members as last seen. `MembersUnreachableFromController`: their pods were
/// Ready by etcd's own health check (the controller is cut off, not etcd);
/// `QuorumLost` while the list still shows a quorum healthy: no member
/// answered and their pods were not Ready. Planned as the controller did,
/// so `plan` says what the controller says (no restore advice for a cut-off
/// controller).
fn unanswered_as_reported(status: &EtcdClusterStatus, obs: &mut Observation) {
    let Some(available) = conditions::find(&status.conditions, conditions::AVAILABLE) else {
        return;
    };
    let ready = match available.reason.as_str() {
        conditions::MEMBERS_UNREACHABLE_FROM_CONTROLLER => true,
        conditions::QUORUM_LOST => false,
        _ => return,
    };
    if ready {
        obs.pods.values_mut().for_each(|p| p.ready = true);
    }
    if let QuorumView::Healthy { .. } = quorum_view(obs) {
        obs.etcd = EtcdObservation::Unreachable(format!(
            "the last reconcile reported Available {}: {}",
            available.status, available.reason
        ));
        obs.pods.values_mut().for_each(|p| p.ready = ready);
    }
}

/// One line for the planner's answer, in the operator's words.
pub fn describe_plan(plan: &Plan, obs: &Observation) -> String {
    let step = match plan {
        Plan::Converged => return "no change".to_string(),
        Plan::Wait(why) => return format!("waiting: {why}"),
        // Nothing will move by itself: `plan` exits with the blocked code.
        Plan::Hold(why) => return format!("blocked, needs attention: {why}"),
        Plan::Refuse(r) => return format!("refused ({}): {}", r.reason, r.message),
        Plan::Act(step) => step,
    };
    let health = match &obs.etcd {
        EtcdObservation::Observed(h) => Some(h),
        EtcdObservation::Unreachable(_) => None,
    };
    let pod_of = |id: u64| -> String {
        health
            .and_then(|h| h.member(id))
            .and_then(|m| m.member.peer_urls.first())
            .and_then(|u| obs.names.ordinal_of_peer_url(u))
            .map_or_else(|| format!("{id:x}"), |o| obs.names.pod(o))
    };
    let image = obs
        .statefulset
        .as_ref()
        .map(|s| s.image.clone())
        .unwrap_or_default();
    let rolling = obs.pods.values().any(|p| p.image != image);
    let mut out = String::new();
    let _ = match step {
        Step::RestartMember { ordinal, .. } => write!(
            out,
            "{}: restart member {} onto {image}",
            if rolling { "upgrade" } else { "restart" },
            obs.names.pod(*ordinal)
        ),
        Step::MoveLeader { from, to } => write!(
            out,
            "{}: move leadership from {} to {}",
            if rolling { "upgrade" } else { "scale" },
            pod_of(*from),
            pod_of(*to)
        ),
        Step::RemoveMember {
            member_id, cause, ..
        } => write!(
            out,
            "{}: remove member {} ({member_id:x}){}",
            match cause {
                RemovalCause::ScaleDown => "scale",
                RemovalCause::Failed => "repair",
            },
            pod_of(*member_id),
            match cause {
                RemovalCause::ScaleDown => " to shrink the cluster".to_string(),
                RemovalCause::Failed => {
                    " : it has been unhealthy past the failure grace period".to_string()
                }
            }
        ),
        Step::PromoteLearner { ordinal, .. } => write!(
            out,
            "scale: promote learner {} to a voting member",
            obs.names.pod(*ordinal)
        ),
        Step::AddLearner { .. } | Step::ScaleStatefulSet { .. } | Step::DeletePvc { .. } => {
            write!(out, "scale: {step}")
        }
        Step::DeleteStaleStorage { .. } | Step::RecordPvcMember { .. } => {
            write!(out, "repair: {step}")
        }
        Step::WriteObjects(_) | Step::Bootstrap { .. } => write!(out, "create: {step}"),
        Step::RecoverFromNoSpace | Step::Defragment { .. } => write!(out, "maintenance: {step}"),
        Step::Version(_) => write!(out, "version: {step}"),
        Step::ImportCa | Step::RetireMember { .. } => write!(out, "adopt: {step}"),
        _ => write!(out, "ca-rotation: {step}"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATES: &str = r#"
apiVersion: etcdfleet.dev/v1alpha1
kind: ClusterEtcdTemplate
metadata: {name: ha-3}
spec:
  version: 3.5.1
  replicas: 3
  storage: {size: 20Gi}
  tls: {enabled: true}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdTemplate
metadata: {name: payments, namespace: team-pay}
spec:
  baseTemplate: ha-3
  replicas: 5
"#;

    fn now() -> k8s_openapi::jiff::Timestamp {
        "2025-06-01T12:00:00Z".parse().unwrap()
    }

    fn plan(yaml: &str) -> Vec<ClusterPlan> {
        let mut m = Manifests::parse(TEMPLATES, "templates.yaml").unwrap();
        m.extend(Manifests::parse(yaml, "clusters.yaml").unwrap());
        plan_all(&m, now(), Duration::from_secs(120))
    }

    fn member(ordinal: u32, version: &str, leader: bool, healthy: bool) -> String {
        format!(
            "      - name: c-etcd-{ordinal}\n        id: \"{:x}\"\n        version: {version}\n        leader: {leader}\n        healthy: {healthy}\n",
            0xa0 + ordinal
        )
    }

    /// `n` healthy members on `version`, the first one leading.
    fn healthy(n: u32, version: &str) -> Vec<String> {
        (0..n).map(|o| member(o, version, o == 0, true)).collect()
    }

    fn cluster(spec: &str, current: &str, members: &[String]) -> String {
        format!(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{name: c, namespace: team-pay}}\nspec:\n  clusterRef: {{name: c}}\n{spec}status:\n  currentVersion: {current}\n  members:\n{}",
            members.concat()
        )
    }

    #[test]
    fn parses_multi_doc_and_lists() {
        let yaml = format!(
            "{TEMPLATES}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: etcdfleet.dev/v1alpha1\n  kind: EtcdCluster\n  metadata: {{name: a, namespace: n}}\n  spec: {{clusterRef: {{name: a}}, version: 3.5.1, replicas: 1}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n"
        );
        let m = Manifests::parse(&yaml, "all.yaml").unwrap();
        assert_eq!(m.cluster_templates.len(), 1);
        assert_eq!(m.templates.len(), 1);
        assert_eq!(m.clusters.len(), 1);
        assert_eq!(m.ignored, vec!["ConfigMap x"]);
    }

    #[test]
    fn bad_documents_are_named_and_do_not_hide_good_ones() {
        let m = Manifests::parse(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a}\nspec: {clusterRef: {name: a}, replicas: three}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: b}\nspec: {clusterRef: {name: b}, replicas: 3}\n",
            "bad.yaml",
        )
        .unwrap();
        assert_eq!(m.clusters.len(), 1, "the good cluster is kept");
        let err = m.invalid[0].to_string();
        assert_eq!(
            err,
            "bad.yaml: document 1: EtcdCluster \"a\" is invalid: spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"; <nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
        );
        let err = Manifests::parse("metadata: {name: a}\n", "x.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no kind"), "{err}");
    }

    #[test]
    fn render_shows_sources_and_objects() {
        let mut m = Manifests::parse(TEMPLATES, "t.yaml").unwrap();
        m.extend(
            Manifests::parse(
                "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: shop, namespace: team-pay}\nspec:\n  clusterRef: {name: shop}\n  templateRef: {kind: EtcdTemplate, name: payments}\n  storage: {size: 50Gi}\n",
                "c.yaml",
            )
            .unwrap(),
        );
        let report = render_cluster(&m.clusters[0], &m).unwrap();
        assert_eq!(report.resolution.spec.replicas, 5);
        let text = report.to_string();
        assert!(text.contains("spec.version"), "{text}");
        assert!(text.contains("ClusterEtcdTemplate/ha-3"), "{text}");
        assert!(text.contains("EtcdTemplate/payments"), "{text}");
        assert!(text.contains("spec.storage.size"), "{text}");
        let kinds: Vec<&str> = report
            .objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "Service",
                "Service",
                "PodDisruptionBudget",
                "ConfigMap",
                "StatefulSet"
            ]
        );
        assert!(text.contains("kind: StatefulSet"));
        assert!(text.contains("image: gcr.io/etcd-development/etcd:v3.5.1"));
    }

    #[test]
    fn render_errors_name_the_field() {
        let m = Manifests::parse(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a, namespace: n}\nspec:\n  clusterRef: {name: a}\n  templateRef: {kind: ClusterEtcdTemplate, name: nope}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: b, namespace: n}\nspec: {clusterRef: {name: b}, replicas: 3}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: c, namespace: n}\nspec: {clusterRef: {name: c}, version: 3.5.1, replicas: 4}\n",
            "c.yaml",
        )
        .unwrap();
        let errs: Vec<String> = m
            .clusters
            .iter()
            .map(|c| render_cluster(c, &m).unwrap_err().to_string())
            .collect();
        assert!(
            errs[0].contains("n/a: spec.templateRef: ClusterEtcdTemplate \"nope\" not found"),
            "{}",
            errs[0]
        );
        assert!(errs[1].contains("spec.version"), "{}", errs[1]);
        // An even replica count is refused by the CRD's rule before rendering.
        let invalid = m.invalid[0].to_string();
        assert!(
            invalid.contains("EtcdCluster \"c\" is invalid: spec.replicas: Invalid value"),
            "{invalid}"
        );
    }

    #[test]
    fn plan_upgrade_restarts_a_follower_onto_the_new_image() {
        let members = healthy(3, "3.5.0");
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.0",
            &members,
        ))[0];
        assert_eq!(p.resolve, Ok(ResolutionBasis::Templates));
        assert!(
            p.version
                .as_ref()
                .unwrap()
                .to_string()
                .starts_with("accepted: patch upgrade"),
            "{p}"
        );
        assert_eq!(
            p.next,
            "upgrade: restart member c-etcd-1 onto gcr.io/etcd-development/etcd:v3.5.1"
        );
    }

    #[test]
    fn plan_upgrade_moves_leadership_last() {
        let members = [
            member(0, "3.5.0", true, true),
            member(1, "3.5.1", false, true),
            member(2, "3.5.1", false, true),
        ];
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.0",
            &members,
        ))[0];
        assert_eq!(p.next, "upgrade: move leadership from c-etcd-0 to c-etcd-1");
    }

    #[test]
    fn plan_scale_up_adds_a_learner() {
        let members = healthy(3, "3.5.1");
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 5\n",
            "3.5.1",
            &members,
        ))[0];
        assert_eq!(
            p.version,
            Some(VersionVerdict::Accepted(VersionChange::NoChange {
                version: "3.5.1".parse().unwrap()
            }))
        );
        assert!(p.to_string().contains("version: no-op"), "{p}");
        assert_eq!(p.next, "scale: add member 3 as a learner");
    }

    #[test]
    fn plan_waits_for_an_unhealthy_member() {
        let members = [
            member(0, "3.5.1", true, true),
            member(1, "3.5.1", false, true),
            member(2, "3.5.1", false, false),
        ];
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.1",
            &members,
        ))[0];
        assert!(
            p.next.starts_with("waiting: member c-etcd-2 is unhealthy"),
            "{}",
            p.next
        );
    }

    #[test]
    fn plan_replaces_a_member_failed_past_the_grace() {
        let mut sick = member(2, "3.5.1", false, false);
        sick.push_str("        unhealthySince: \"2025-06-01T11:50:00Z\"\n");
        let members = [
            member(0, "3.5.1", true, true),
            member(1, "3.5.1", false, true),
            sick,
        ];
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.1",
            &members,
        ))[0];
        assert!(
            p.next.starts_with("repair: remove member c-etcd-2 (a2)"),
            "{}",
            p.next
        );
    }

    /// `cluster` with an `Available` condition in its status.
    fn with_available(yaml: String, status: &str, reason: &str) -> String {
        format!(
            "{yaml}  conditions:\n      - type: Available\n        status: \"{status}\"\n        reason: {reason}\n        message: as reported\n        lastTransitionTime: \"2025-06-01T11:59:00Z\"\n"
        )
    }

    #[test]
    fn plan_of_a_controller_cut_off_from_ready_members_holds_without_restore_advice() {
        // No member answered the last reconcile (the list is as last seen),
        // or only one did; their pods were Ready by etcd's own health check.
        let all_silent = healthy(3, "3.5.1");
        let one_answers = [
            member(0, "3.5.1", true, true),
            member(1, "3.5.1", false, false),
            member(2, "3.5.1", false, false),
        ];
        for members in [&all_silent[..], &one_answers[..]] {
            let yaml = cluster("  version: 3.5.1\n  replicas: 3\n", "3.5.1", members);
            let p = &plan(&with_available(
                yaml,
                "Unknown",
                "MembersUnreachableFromController",
            ))[0];
            assert!(
                p.next.starts_with("blocked, needs attention:")
                    && p.next.contains("cut off")
                    && p.next.contains("network")
                    && !p.next.contains("quorum lost")
                    && !p.next.contains("restore"),
                "{}",
                p.next
            );
            assert_eq!(p.outcome(), PlanOutcome::Blocked);
        }
        // Quorum lost by the members' own health: the advice stays.
        let yaml = cluster("  version: 3.5.1\n  replicas: 3\n", "3.5.1", &all_silent);
        let p = &plan(&with_available(yaml, "False", "QuorumLost"))[0];
        assert!(
            p.next.contains("quorum lost") && p.next.contains("restore"),
            "{}",
            p.next
        );
    }

    #[test]
    fn plan_exit_code_prefers_input_errors_then_blocked_then_changes() {
        let members = healthy(3, "3.5.1");
        let converged = plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.1",
            &members,
        ));
        let scaling = plan(&cluster(
            "  version: 3.5.1\n  replicas: 5\n",
            "3.5.1",
            &members,
        ));
        let rejected = plan(&cluster(
            "  version: 3.4.0\n  replicas: 3\n",
            "3.5.1",
            &members,
        ));
        let paused = plan(&cluster(
            "  version: 3.5.1\n  replicas: 5\n  paused: true\n",
            "3.5.1",
            &members,
        ));
        assert_eq!(converged[0].outcome(), PlanOutcome::NoChange);
        assert_eq!(scaling[0].outcome(), PlanOutcome::Changes);
        assert_eq!(rejected[0].outcome(), PlanOutcome::Blocked);
        assert_eq!(paused[0].outcome(), PlanOutcome::NoChange);
        let all: Vec<ClusterPlan> = [&converged, &scaling, &rejected]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        assert_eq!(plan_exit_code(&converged, 0), EXIT_NO_CHANGE);
        assert_eq!(
            plan_exit_code(&[converged[0].clone(), scaling[0].clone()], 0),
            EXIT_CHANGES
        );
        assert_eq!(plan_exit_code(&all, 0), EXIT_BLOCKED);
        assert_eq!(plan_exit_code(&all, 1), EXIT_INPUT_ERROR);
    }

    /// One EtcdCluster with `spec` (YAML flow mapping fields).
    fn cluster_with(spec: &str) -> String {
        format!(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{name: a, namespace: t}}\n\
             spec: {{clusterRef: {{name: a}}, version: 3.5.1, replicas: 3, {spec}}}\n"
        )
    }

    fn offline_errors(spec: &str) -> String {
        let m = Manifests::parse(&cluster_with(spec), "c.yaml").unwrap();
        m.invalid
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn sizes_quantities_and_schedules_are_refused_offline_as_the_api_server_refuses_them() {
        for (spec, wanted) in [
            ("storage: {size: -5Gi}", "size must be a positive quantity"),
            ("storage: {size: \"0\"}", "size must be a positive quantity"),
            (
                "resources: {requests: {memory: lots}}",
                "spec.resources.requests.memory in body should match",
            ),
            (
                "resources: {limits: {cpu: \"-1\"}}",
                "spec.resources.limits.cpu in body should match",
            ),
            (
                "backup: {schedule: every night}",
                "five space-separated cron fields",
            ),
            (
                "backup: {schedule: \"61 * * * *\"}",
                "spec.backup.schedule: Invalid value: \"61 * * * *\"",
            ),
        ] {
            let errors = offline_errors(spec);
            assert!(errors.contains(wanted), "{spec}: {errors}");
        }
        assert_eq!(
            offline_errors("storage: {size: 8Gi}, backup: {schedule: \"0 2 * * *\"}"),
            ""
        );
    }

    #[test]
    fn every_wrong_field_of_an_object_is_reported_at_once() {
        let errors = offline_errors(
            "storage: {size: -5Gi}, resources: {requests: {memory: lots}}, backup: {schedule: every night}",
        );
        for wanted in [
            "spec.storage.size",
            "spec.resources",
            "spec.backup.schedule",
        ] {
            assert!(errors.contains(wanted), "{wanted} missing from: {errors}");
        }
    }

    #[test]
    fn a_status_with_a_version_but_no_members_tells_one_story() {
        let with = |version: &str| {
            format!(
                "apiVersion: etcdfleet.dev/v1beta1\nkind: EtcdCluster\nmetadata: {{name: c, namespace: team-pay}}\n\
                 spec: {{clusterRef: {{name: c}}, version: {version}, replicas: 3}}\n\
                 status: {{currentVersion: 3.5.1}}\n"
            )
        };
        // A downgrade is refused, and nothing is planned beside the refusal.
        let refused = plan(&with("3.4.23"))[0].to_string();
        assert!(refused.contains("Downgrade"), "{refused}");
        assert!(
            refused.contains("blocked: spec.version is refused"),
            "{refused}"
        );
        // The version the status says runs: no change of version, and no
        // bootstrap of a cluster that ran.
        let same = plan(&with("3.5.1"))[0].to_string();
        assert!(same.contains("lists no members"), "{same}");
        for contradiction in ["create:", "bootstrap member 0", "rejected"] {
            assert!(!same.contains(contradiction), "{contradiction}: {same}");
        }
        assert!(!refused.contains("create:"), "{refused}");
        // A new cluster (no version in status) is still created.
        let new =
            plan(&with("3.5.1").replace("status: {currentVersion: 3.5.1}\n", ""))[0].to_string();
        assert!(new.contains("create: no members in status yet"), "{new}");
    }

    #[test]
    fn render_refuses_a_version_plan_refuses() {
        let m = Manifests::parse(
            &cluster_with("storage: {size: 8Gi}").replace("3.5.1", "3.9.0"),
            "c.yaml",
        )
        .unwrap();
        let err = render_cluster(&m.clusters[0], &m).unwrap_err().to_string();
        assert!(
            err.contains("spec.version") && err.contains("3.9.0"),
            "{err}"
        );
        let plans = plan_all(&m, now(), Duration::from_secs(120));
        assert!(
            plans.iter().all(|p| p.to_string().contains("3.9.0")),
            "plan refuses it too"
        );
    }

    #[test]
    fn plan_converged_is_no_change() {
        let members = healthy(3, "3.5.1");
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.1",
            &members,
        ))[0];
        assert_eq!(p.next, "no change");
    }

    #[test]
    fn plan_scale_down_removes_the_highest_member() {
        let members = healthy(5, "3.5.1");
        let p = &plan(&cluster(
            "  version: 3.5.1\n  replicas: 3\n",
            "3.5.1",
            &members,
        ))[0];
        assert_eq!(
            p.next,
            "scale: remove member c-etcd-4 (a4) to shrink the cluster"
        );
    }

    #[test]
    fn plan_rejected_version_holds_the_running_version() {
        let members = healthy(3, "3.5.1");
        let p = &plan(&cluster(
            "  version: 3.4.0\n  replicas: 3\n",
            "3.5.1",
            &members,
        ))[0];
        let text = p.to_string();
        assert!(
            text.contains("version: rejected: VersionAccepted=False (Downgrade)"),
            "{text}"
        );
        assert_eq!(p.next, "no change");
    }

    #[test]
    fn plan_reports_resolve_errors() {
        let p = &plan(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: missing}\n",
        )[0];
        assert_eq!(p.resolve.as_ref().unwrap_err().0, "TemplateNotFound");
        assert!(
            p.to_string()
                .contains("TemplateResolved=False (TemplateNotFound)")
        );
        assert!(p.next.starts_with("blocked:"));
    }

    #[test]
    fn plan_new_cluster_bootstraps() {
        let p = &plan(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: payments}\n",
        )[0];
        assert!(
            p.version
                .as_ref()
                .unwrap()
                .to_string()
                .starts_with("accepted: create at 3.5.1")
        );
        assert!(p.next.starts_with("create:"), "{}", p.next);
        assert!(p.next.contains("of 5"), "{}", p.next);
    }

    #[test]
    fn plan_materialized_cluster_ignores_templates() {
        let p = &plan(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: gone}\n  version: 3.5.1\n  replicas: 1\nstatus:\n  template: {kind: EtcdTemplate, name: gone}\n",
        )[0];
        assert_eq!(p.resolve, Ok(ResolutionBasis::Materialized));
    }
}
