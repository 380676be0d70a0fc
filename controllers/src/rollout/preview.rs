//! The offline preview of a rollout (`etcdfleet plan` given an
//! `EtcdFleetRollout` with the clusters it selects): the waves as the
//! controller would cut them, what it would do to each cluster, which the
//! version policy or the gates would refuse, and what it would do next.
//! It runs the controller's own planner on the clusters as the manifests
//! show them (`kubectl get etcdclusters -A -o yaml`, with status and
//! managedFields), so the preview and the rollout agree.

use std::fmt;

use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::rollout::{RESUME_ANNOTATION, WaveSize};
use etcdfleet_api::version::decide;
use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdCluster, EtcdFleetRollout, EtcdTemplate, TemplateKind,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::observe::{selected, view_of};
use super::plan::{ClusterView, Decision, RolloutInput, plan_rollout};

/// What would become of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Written: from which version to which change.
    Change(String),
    /// Not written: the spec already asks for it, or it already runs it.
    NoWrite(String),
    /// The version policy or a gate refuses it: the rollout would halt here.
    Refused(String),
    /// Left alone (paused, a person's edit, deleted).
    Skipped(String),
    /// As the rollout's status records it (in flight, done, failed).
    Recorded(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Change(s) => write!(f, "change: {s}"),
            Verdict::NoWrite(s) => write!(f, "no write: {s}"),
            Verdict::Refused(s) => write!(f, "REFUSED: {s}"),
            Verdict::Skipped(s) => write!(f, "skipped: {s}"),
            Verdict::Recorded(s) => f.write_str(s),
        }
    }
}

/// The preview of one rollout.
#[derive(Debug, Clone)]
pub struct RolloutPreview {
    pub name: String,
    pub change: String,
    pub strategy: String,
    /// Per wave, each cluster and its verdict.
    pub waves: Vec<(i32, Vec<(String, Verdict)>)>,
    /// What the controller would do next, and why.
    pub next: String,
    pub decision: Decision,
}

impl RolloutPreview {
    pub fn refused(&self) -> Vec<&str> {
        self.clusters(|v| matches!(v, Verdict::Refused(_)))
    }

    pub fn changes(&self) -> Vec<&str> {
        self.clusters(|v| matches!(v, Verdict::Change(_)))
    }

    fn clusters(&self, pred: impl Fn(&Verdict) -> bool) -> Vec<&str> {
        self.waves
            .iter()
            .flat_map(|(_, cs)| cs.iter())
            .filter(|(_, v)| pred(v))
            .map(|(c, _)| c.as_str())
            .collect()
    }
}

/// The generation of the rebase target a cluster in `namespace` resolves.
fn template_generation(
    rollout: &EtcdFleetRollout,
    namespace: &str,
    cluster_templates: &[ClusterEtcdTemplate],
    templates: &[EtcdTemplate],
) -> Option<i64> {
    let target = rollout.spec.template_ref.as_ref()?;
    match target.kind {
        TemplateKind::ClusterEtcdTemplate => {
            cluster_templates
                .iter()
                .find(|t| t.name_any() == target.name)?
                .metadata
                .generation
        }
        TemplateKind::EtcdTemplate => {
            templates
                .iter()
                .find(|t| {
                    t.name_any() == target.name && t.namespace().is_none_or(|ns| ns == namespace)
                })?
                .metadata
                .generation
        }
    }
}

/// What the policy would do to a cluster the rollout has not touched.
fn judge_pending(rollout: &EtcdFleetRollout, view: &ClusterView) -> Verdict {
    let spec = &rollout.spec;
    let from = view
        .reported
        .current_version
        .as_deref()
        .unwrap_or("not running yet");
    if let Some(target) = &spec.version
        && let Err(rejection) = decide(view.reported.current_version.as_deref(), target)
    {
        return Verdict::Refused(format!("{}: {}", rejection.reason(), rejection.message()));
    }
    if view.paused {
        return Verdict::Skipped("spec.paused is true on the cluster".into());
    }
    if let Err(why) = view.healthy() {
        return Verdict::Refused(format!("not healthy before the change: {why}"));
    }
    if view.spec_matches(spec) {
        return Verdict::NoWrite(format!(
            "its spec already asks for {}",
            spec.change_summary()
        ));
    }
    Verdict::Change(format!("{from} → {}", spec.change_summary()))
}

/// Previews `rollout` over `clusters` (those it selects), at `now`.
pub fn preview(
    rollout: &EtcdFleetRollout,
    clusters: &[EtcdCluster],
    cluster_templates: &[ClusterEtcdTemplate],
    templates: &[EtcdTemplate],
    now: Timestamp,
) -> RolloutPreview {
    let views: Vec<ClusterView> = clusters
        .iter()
        .filter(|c| selected(rollout, c))
        .map(|c| {
            let ns = c.namespace().unwrap_or_default();
            view_of(
                c,
                template_generation(rollout, &ns, cluster_templates, templates),
            )
        })
        .collect();
    let previous = rollout.status.clone().unwrap_or_default();
    let name = rollout.name_any();
    let decision = plan_rollout(&RolloutInput {
        name: &name,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        previous: &previous,
        resume: rollout
            .annotations()
            .get(RESUME_ANNOTATION)
            .map(String::as_str),
        now,
        clusters: &views,
        poll: std::time::Duration::from_secs(5),
    });
    let mut waves: Vec<(i32, Vec<(String, Verdict)>)> = Vec::new();
    for wave in &decision.status.waves {
        let mut of = Vec::new();
        for rec in decision
            .status
            .clusters
            .iter()
            .filter(|r| r.wave == wave.wave)
        {
            let was_pending = previous
                .clusters
                .iter()
                .find(|p| p.name == rec.name)
                .is_none_or(|p| p.state == PENDING);
            let view = views.iter().find(|v| v.key == rec.name);
            let verdict = match (rec.state.as_str(), view) {
                // What the planner just decided for an untouched cluster
                // (the canary it would write now) is judged like the rest.
                (PENDING | IN_PROGRESS | FAILED, Some(view)) if was_pending => {
                    judge_pending(rollout, view)
                }
                (DONE | SKIPPED | IN_PROGRESS | FAILED, _) => Verdict::Recorded(format!(
                    "{}{}",
                    rec.state,
                    rec.reason
                        .as_ref()
                        .map_or_else(String::new, |r| format!(" ({r})"))
                )),
                _ => Verdict::Recorded(rec.state.clone()),
            };
            of.push((rec.name.clone(), verdict));
        }
        waves.push((wave.wave, of));
    }
    RolloutPreview {
        name,
        change: rollout.spec.change_summary(),
        strategy: describe_strategy(rollout, views.len()),
        waves,
        next: format!("{}: {}", decision.outcome.phase, decision.outcome.message),
        decision,
    }
}

fn describe_strategy(rollout: &EtcdFleetRollout, total: usize) -> String {
    match rollout.spec.strategy.resolve() {
        Ok(s) => {
            let later = match s.wave {
                WaveSize::Count(n) => format!("{n} per wave"),
                WaveSize::Percent(p) => format!("{p}% ({}) per wave", s.wave.of(total)),
            };
            let window = s.window.map_or_else(String::new, |w| {
                format!("; maintenance window {} for {}", w.schedule, w.duration)
            });
            format!(
                "canary {}, then {later}; at most {} in flight; soak {}s; deadline {}s{window}",
                s.canary,
                s.max_in_flight,
                s.soak.as_secs(),
                s.progress_deadline.as_secs()
            )
        }
        Err(e) => format!("invalid strategy: {e}"),
    }
}

impl fmt::Display for RolloutPreview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.waves.iter().map(|(_, c)| c.len()).sum();
        writeln!(f, "# EtcdFleetRollout {}: {}", self.name, self.change)?;
        writeln!(
            f,
            "# {total} clusters in {} waves: {}",
            self.waves.len(),
            self.strategy
        )?;
        writeln!(f, "# next: {}", self.next)?;
        let width = self
            .waves
            .iter()
            .flat_map(|(_, c)| c.iter().map(|(n, _)| n.len()))
            .max()
            .unwrap_or(0);
        for (wave, clusters) in &self.waves {
            writeln!(f, "wave {wave} ({} clusters):", clusters.len())?;
            for (name, verdict) in clusters {
                writeln!(f, "  {name:width$}  {verdict}")?;
            }
        }
        let refused = self.refused();
        if refused.is_empty() {
            writeln!(
                f,
                "# no cluster is refused by the version policy or the gates"
            )
        } else {
            writeln!(
                f,
                "# refused ({}): {}; the rollout halts at the first of them and touches no \
                 other cluster",
                refused.len(),
                refused.join(", ")
            )
        }
    }
}
