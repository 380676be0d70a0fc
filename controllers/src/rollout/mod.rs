//! Fleet rollouts (`EtcdFleetRollout`): many clusters moved to a version or
//! rebased onto a template, in waves that stop at the first failure.
//!
//! ```text
//! resolve  → the rollout (fresh GET: its status is the planner's memory)
//! observe  → the selected clusters from the controller's EtcdCluster cache
//!            (no list or watch of its own), the rebase template's generation
//! plan     → at most ONE action and the new status (pure, `plan::plan_rollout`)
//! act      → server-side apply of the change into one cluster, under the
//!            rollout's field manager, conditional on the resourceVersion
//!            the planner judged (`act`)
//! report   → status, conditions, events (`status`)
//! ```
//!
//! [`preview`] runs the same planner offline for `etcdfleet plan`.

pub mod act;
pub mod context;
pub mod observe;
pub mod plan;
pub mod preview;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcdfleet_api::EtcdFleetRollout;
use etcdfleet_api::rollout::RESUME_ANNOTATION;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{info, warn};

pub use context::{Context, Error, Result, RolloutFilter, RolloutSettings};
pub use observe::ClusterCache;
use plan::{Decision, RolloutInput, plan_rollout};

/// What one rollout reconcile did.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The rollout is gone.
    Gone,
    /// Another controller's rollout (outside this one's label selector).
    NotOwned,
    /// The planner's decision, its action taken and its status written.
    Planned(Box<Decision>),
    /// The cluster to write changed since it was judged (409): nothing was
    /// written; the next reconcile judges it again.
    Retry(String),
}

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(rollout: Arc<EtcdFleetRollout>, ctx: Arc<Context>) -> Result<Action> {
    Ok(match reconcile_rollout(&rollout.name_any(), &ctx).await? {
        Reconciled::Gone | Reconciled::NotOwned => Action::await_change(),
        Reconciled::Retry(_) => Action::requeue(Duration::from_secs(1)),
        Reconciled::Planned(decision) => match decision.outcome.wake {
            Some(after) => Action::requeue(after.max(Duration::from_millis(100))),
            // Nothing in flight: a change of the rollout triggers it; the
            // slow poll picks up what the cache alone says (a cluster
            // selected or deleted).
            None => Action::requeue(Duration::from_secs(300)),
        },
    })
}

/// `error_policy` for the `Controller`.
pub fn error_policy(rollout: Arc<EtcdFleetRollout>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(rollout = %rollout.name_any(), error = %err, reason = err.reason(), "rollout reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// One reconcile of the rollout `name`: read it fresh (its status is the
/// planner's memory), observe its clusters in the cache, plan, take the one
/// action, report.
pub async fn reconcile_rollout(name: &str, ctx: &Context) -> Result<Reconciled> {
    let access = ctx.access();
    let api: Api<EtcdFleetRollout> = Api::all(access.management.clone());
    let Some(rollout) = api.get_opt(name).await? else {
        return Ok(Reconciled::Gone);
    };
    if !ctx.owns(&rollout) {
        return Ok(Reconciled::NotOwned);
    }
    let (clusters, views) = observe::observe(&rollout, &ctx.cache, access).await?;
    let previous = rollout.status.clone().unwrap_or_default();
    let planning = Instant::now();
    let decision = plan_rollout(&RolloutInput {
        name,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        previous: &previous,
        resume: rollout
            .annotations()
            .get(RESUME_ANNOTATION)
            .map(String::as_str),
        now: k8s_openapi::jiff::Timestamp::now(),
        clusters: &views,
        poll: ctx.settings.poll,
    });
    access.metrics.observe_rollout_plan(planning.elapsed());
    match &decision.outcome.action {
        plan::Action::Apply {
            cluster,
            resource_version,
            wave,
        } => {
            let Some(target) = clusters.iter().find(|c| observe::key_of(c) == *cluster) else {
                return Ok(Reconciled::Retry(format!("{cluster} left the cache")));
            };
            match act::apply_change(&rollout, target, resource_version.as_deref(), access).await? {
                act::Written::Yes => {
                    access.metrics.count_rollout_write(name);
                    info!(rollout = name, cluster = %cluster, wave, "rollout changed a cluster");
                    let note = format!(
                        "rollout {name} (wave {wave}) changed {}",
                        rollout.spec.change_summary()
                    );
                    access
                        .publish(target, EventType::Normal, "RolloutChanged", &note)
                        .await;
                }
                act::Written::Conflict(why) => {
                    info!(rollout = name, cluster = %cluster, %why, "cluster changed since judged; not written");
                    return Ok(Reconciled::Retry(why));
                }
            }
        }
        plan::Action::AcknowledgeResume | plan::Action::None => {}
    }
    let events = status::events(&previous, &decision.status);
    status::write(&rollout, &decision.status, access).await?;
    status::publish(&rollout, &events, access).await;
    // After the status that records the resume (`lastResume`): a removal
    // that fails is retried, never taken for a second resume.
    if decision.outcome.action == plan::Action::AcknowledgeResume {
        act::acknowledge_resume(&rollout, access).await?;
    }
    Ok(Reconciled::Planned(Box::new(decision)))
}
