//! What the rollout planner knows about one selected `EtcdCluster`: the
//! fields the rollout writes and who last wrote them (from
//! `metadata.managedFields`), and what the cluster reconciler reported
//! (its conditions and version). Built from the controller's cache by
//! `observe`, or from manifests by the offline preview; the predicates here
//! are the gates, pure.

use etcdfleet_api::conditions::VERSION_ACCEPTED;
use etcdfleet_api::conditions::{AVAILABLE, CONFLICT, DEGRADED, PROGRESSING, TEMPLATE_RESOLVED};
use etcdfleet_api::{EtcdFleetRolloutSpec, TemplateRef};
use k8s_openapi::jiff::Timestamp;

/// The reason `Progressing=False` carries when the cluster matches its spec.
pub const CONVERGED_REASON: &str = "Converged";
/// `Degraded` reasons of etcd alarms (NOSPACE, CORRUPT).
pub const ALARM_REASON_PREFIX: &str = "Alarm";

/// One condition as the planner reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConditionView {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub observed_generation: Option<i64>,
}

impl ConditionView {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
    pub fn is_false(&self) -> bool {
        self.status == "False"
    }
}

/// One manager that owns a field (an entry of `metadata.managedFields`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldOwner {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// When that manager last changed any field it owns (the API server
    /// keeps one time per manager and operation, not per field).
    pub time: Option<Timestamp>,
}

/// The cluster's own report, as the cluster reconciler last wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportedState {
    pub observed_generation: Option<i64>,
    pub current_version: Option<String>,
    pub available: Option<ConditionView>,
    pub degraded: Option<ConditionView>,
    pub progressing: Option<ConditionView>,
    pub version_accepted: Option<ConditionView>,
    pub template_resolved: Option<ConditionView>,
    pub conflict: Option<ConditionView>,
    /// `status.template`: kind, name and generation last applied.
    pub applied_template: Option<(String, String, Option<i64>)>,
}

impl ReportedState {
    /// Reads the conditions the planner uses out of a status.
    pub fn from_status(status: Option<&etcdfleet_api::EtcdClusterStatus>) -> Self {
        let Some(s) = status else {
            return ReportedState::default();
        };
        let find = |type_: &str| {
            etcdfleet_api::conditions::find(&s.conditions, type_).map(|c| ConditionView {
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: c.observed_generation,
            })
        };
        ReportedState {
            observed_generation: s.observed_generation,
            current_version: s.current_version.clone(),
            available: find(AVAILABLE),
            degraded: find(DEGRADED),
            progressing: find(PROGRESSING),
            version_accepted: find(VERSION_ACCEPTED),
            template_resolved: find(TEMPLATE_RESOLVED),
            conflict: find(CONFLICT),
            applied_template: s
                .template
                .as_ref()
                .map(|t| (t.kind.clone(), t.name.clone(), t.generation)),
        }
    }
}

/// One selected cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// `namespace/name`.
    pub key: String,
    pub resource_version: Option<String>,
    pub generation: Option<i64>,
    pub created: Option<Timestamp>,
    pub deleting: bool,
    pub paused: bool,
    /// `spec.version`.
    pub version: Option<String>,
    /// `spec.templateRef`.
    pub template_ref: Option<TemplateRef>,
    /// The rebase annotation is set (a rebase is asked and not done yet).
    pub rebase_pending: bool,
    /// Owners of `spec.version`.
    pub version_owners: Vec<FieldOwner>,
    /// Owners of `spec.templateRef`.
    pub template_owners: Vec<FieldOwner>,
    /// The current generation of the template the rollout rebases onto, as
    /// this cluster would resolve it (`None`: not found or no rebase).
    pub target_template_generation: Option<i64>,
    pub reported: ReportedState,
}

/// A field of a cluster's spec that a rollout writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutField {
    Version,
    TemplateRef,
}

impl RolloutField {
    pub fn path(self) -> &'static str {
        match self {
            RolloutField::Version => "spec.version",
            RolloutField::TemplateRef => "spec.templateRef",
        }
    }
}

/// What a person edited: the field, its value now, who owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub field: RolloutField,
    pub value: String,
    pub by: Vec<String>,
}

impl ClusterView {
    /// The fields the rollout writes, each with whether it already holds
    /// the rollout's value.
    pub fn fields<'a>(
        &'a self,
        spec: &'a EtcdFleetRolloutSpec,
    ) -> Vec<(RolloutField, bool, String, &'a [FieldOwner])> {
        let mut out = Vec::new();
        if let Some(target) = &spec.version {
            let now = self.version.clone().unwrap_or_default();
            out.push((
                RolloutField::Version,
                &now == target,
                now,
                self.version_owners.as_slice(),
            ));
        }
        if let Some(target) = &spec.template_ref {
            let now = self
                .template_ref
                .as_ref()
                .map_or_else(String::new, |t| format!("{:?}/{}", t.kind, t.name));
            out.push((
                RolloutField::TemplateRef,
                self.template_ref.as_ref() == Some(target),
                now,
                self.template_owners.as_slice(),
            ));
        }
        out
    }

    /// Whether the spec already asks for the rollout's change (every field
    /// it writes holds its value, and a rebase is not waiting).
    pub fn spec_matches(&self, spec: &EtcdFleetRolloutSpec) -> bool {
        self.fields(spec).iter().all(|(_, matches, _, _)| *matches)
    }

    /// Whether `manager` wrote the rollout's values into this cluster: it
    /// owns every field the rollout writes, and each holds the value.
    pub fn written_by(&self, spec: &EtcdFleetRolloutSpec, manager: &str) -> Option<Timestamp> {
        let fields = self.fields(spec);
        let mut when = None;
        for (_, matches, _, owners) in &fields {
            let ours = owners.iter().find(|o| o.manager == manager)?;
            if !matches {
                return None;
            }
            when = when.max(ours.time);
        }
        (!fields.is_empty()).then(|| when.unwrap_or_default())
    }

    /// A field the rollout writes that holds another value and was last
    /// written after `since` by someone other than the rollout (`ours`) and
    /// the controller's own template materialization: a person's edit.
    pub fn edited_since(
        &self,
        spec: &EtcdFleetRolloutSpec,
        ours: &str,
        since: Option<Timestamp>,
    ) -> Option<Edit> {
        let since = since.max(self.created);
        self.first_edit(spec, |o| {
            o.manager != ours
                && o.manager != etcdfleet_api::FIELD_MANAGER
                && since.is_some_and(|s| o.time.is_some_and(|t| t > s))
        })
    }

    /// A field the rollout wrote at `written` that holds another value now,
    /// set by someone else since (whoever owns it now, with its value). A
    /// field that differs with no such owner is a cache that has not seen
    /// the rollout's write yet: not an edit.
    pub fn changed_after_write(
        &self,
        spec: &EtcdFleetRolloutSpec,
        ours: &str,
        written: Timestamp,
    ) -> Option<Edit> {
        self.first_edit(spec, |o| {
            o.manager != ours && o.time.is_some_and(|t| t >= written)
        })
    }

    /// The first field of the change that differs from the target and has
    /// owners passing `edited_by` (those owners, with the field's value).
    fn first_edit(
        &self,
        spec: &EtcdFleetRolloutSpec,
        edited_by: impl Fn(&FieldOwner) -> bool,
    ) -> Option<Edit> {
        self.fields(spec)
            .into_iter()
            .filter(|(_, matches, _, _)| !matches)
            .find_map(|(field, _, value, owners)| {
                let by: Vec<String> = owners
                    .iter()
                    .filter(|o| edited_by(o))
                    .map(|o| o.manager.clone())
                    .collect();
                (!by.is_empty()).then_some(Edit { field, value, by })
            })
    }

    /// Whether a condition was computed for the cluster's current spec.
    fn current(&self, c: &ConditionView) -> bool {
        c.observed_generation.is_none() || c.observed_generation == self.generation
    }

    /// The cluster is healthy: `Available=True`, not `Degraded`.
    pub fn healthy(&self) -> Result<(), String> {
        let r = &self.reported;
        match (&r.available, &r.degraded) {
            (Some(a), _) if !a.is_true() => Err(format!(
                "Available={} ({}): {}",
                a.status, a.reason, a.message
            )),
            (None, _) => Err("no Available condition reported yet".into()),
            (_, Some(d)) if !d.is_false() => Err(format!(
                "Degraded={} ({}): {}",
                d.status, d.reason, d.message
            )),
            _ => Ok(()),
        }
    }

    /// An etcd alarm (`Degraded` reason `AlarmNOSPACE`, `AlarmCORRUPT`).
    pub fn alarm(&self) -> Option<String> {
        self.reported
            .degraded
            .as_ref()
            .filter(|d| d.is_true() && d.reason.starts_with(ALARM_REASON_PREFIX))
            .map(|d| format!("{}: {}", d.reason, d.message))
    }

    /// Why the cluster reconciler refuses the current spec, if it does: a
    /// rejected version, a conflict, a template that does not resolve.
    pub fn refusal(&self) -> Option<(&'static str, String)> {
        let r = &self.reported;
        if let Some(v) = r.version_accepted.as_ref()
            && v.is_false()
            && self.current(v)
        {
            return Some(("VersionRefused", format!("{}: {}", v.reason, v.message)));
        }
        if let Some(c) = r.conflict.as_ref().filter(|c| c.is_true()) {
            return Some(("Conflict", format!("{}: {}", c.reason, c.message)));
        }
        if let Some(t) = r.template_resolved.as_ref()
            && t.is_false()
            && self.current(t)
        {
            return Some((
                "TemplateNotResolved",
                format!("{}: {}", t.reason, t.message),
            ));
        }
        None
    }

    /// The cluster runs what its spec asks, as far as the rollout's change
    /// goes: its report is of the current generation, `Progressing=False`
    /// (converged), healthy, every member at `spec.version`, and a rebase
    /// onto the rollout's template is done.
    pub fn converged(&self, spec: &EtcdFleetRolloutSpec) -> bool {
        let r = &self.reported;
        let progressing_done = r
            .progressing
            .as_ref()
            .is_some_and(|p| p.is_false() && p.reason == CONVERGED_REASON && self.current(p));
        let version_done = self.version.is_some() && r.current_version == self.version;
        let template_done = spec.template_ref.as_ref().is_none_or(|t| {
            !self.rebase_pending
                && r.applied_template.as_ref().is_some_and(|(kind, name, _)| {
                    *kind == format!("{:?}", t.kind) && *name == t.name
                })
        });
        r.observed_generation.is_some()
            && r.observed_generation == self.generation
            && progressing_done
            && version_done
            && template_done
            && self.healthy().is_ok()
    }

    /// The cluster already is where the rollout would take it, unwritten:
    /// its spec asks for the change, it converged, and a rebase target was
    /// applied at the template's current generation.
    pub fn already_matches(&self, spec: &EtcdFleetRolloutSpec) -> bool {
        let template_current = spec.template_ref.is_none()
            || self
                .reported
                .applied_template
                .as_ref()
                .is_some_and(|(_, _, g)| g.is_some() && *g == self.target_template_generation);
        self.spec_matches(spec) && template_current && self.converged(spec)
    }
}
