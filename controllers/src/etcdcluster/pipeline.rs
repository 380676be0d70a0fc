//! One reconcile of one EtcdCluster, as seven named stages:
//!
//! ```text
//! admit    → the admission rules: owned, deleting, identity, paused (pure)
//! resolve  → template chain + materialization (pure, plus one apply, once)
//! connect  → kubeconfig Secret → workload client (cached; direct GET)
//! observe  → workload objects + etcd members and health (read only)
//! plan     → at most one next step (pure, `plan::plan_next_step`)
//! act      → execute that step (idempotent, deterministic names, preconditions)
//! report   → the status composed from what the stages learned + metrics + events
//! ```
//!
//! Each stage hands its result to the next or ends the reconcile with an
//! outcome ([`Stage`]); each runs in its own trace span. Each returns what
//! it learned, kept in [`Learned`]; the status is composed from it, and
//! every write to the EtcdCluster goes through its [`ClusterObject`].

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::{EtcdCluster, ManagedIdentity};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::field::Empty;
use tracing::{Instrument, Span, info, info_span, warn};

use super::act;
use super::admission::{self, Admission, Candidate};
use super::cluster_object::ClusterObject;
use super::context::{Context, Error, FINALIZER, Outcome, Result, cluster_key};
use super::observe::{self, Observed};
use super::plan;
use super::plan::observation::RestoreGate;
use super::plan::step::{Plan, Step};
use super::requeue::{held_requeue, in_flight_requeue, jitter, requeue_for};
use super::resolve::{self, Resolved};
use super::status::{self, Composed, Decision, Learned, Remote};
use crate::connector::{ConnectError, KubeconfigLocation, WorkloadCluster};
use crate::metrics::PlanLabel;

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(cluster: Arc<EtcdCluster>, ctx: Arc<Context>) -> Result<Action> {
    // Sharded: no work on a cluster that is moving to another shard.
    let namespace = cluster.namespace().unwrap_or_default();
    let Ok(_pass) = ctx.access.enter(&namespace, &cluster.name_any()) else {
        return Ok(Action::requeue(crate::access::GATE_RETRY));
    };
    // All namespaces in one controller: no tenant holds every slot.
    let Some(_share) = ctx.access.shares.take(&namespace) else {
        return Ok(Action::requeue(crate::slots::RETRY));
    };
    let started = std::time::Instant::now();
    let outcome = reconcile_cluster(&cluster, &ctx).await;
    ctx.metrics
        .observe_reconcile(started.elapsed(), outcome.as_ref().err().map(Error::reason));
    let outcome = outcome?;
    // A workload cluster in backoff is retried when its backoff ends (sooner
    // than the converged poll), never in a tight loop.
    if let Outcome::Blocked(_) = outcome
        && let Some(location) = KubeconfigLocation::of(&cluster)
        && let Some(remaining) = ctx.connector.backoff_remaining(&location)
    {
        return Ok(Action::requeue(
            remaining.max(ctx.settings.requeue_progress),
        ));
    }
    if let Some(delay) = held_requeue(
        &ctx.held,
        &outcome,
        &cluster,
        jitter(ctx.settings.requeue_converged, &cluster.name_any()),
        ctx.settings.requeue_converged * 5,
    ) {
        return Ok(Action::requeue(delay));
    }
    Ok(match in_flight_requeue(&outcome, &ctx, &cluster) {
        Some(delay) => Action::requeue(delay),
        None => requeue_for(&outcome, &ctx.settings, &cluster),
    })
}

/// `error_policy` for the `Controller`: count and back off.
pub fn error_policy(cluster: Arc<EtcdCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(cluster = %cluster.name_any(), error = %err, reason = err.reason(), "reconcile failed");
    if let Error::Connect(e) = err
        && let Some(location) = KubeconfigLocation::of(&cluster)
    {
        return Action::requeue(ctx.connector.record_failure(&location, e));
    }
    Action::requeue(Duration::from_secs(5))
}

/// One reconcile of one EtcdCluster, traced: a `reconcile` span with the
/// cluster, the outcome and (when spans are exported) the trace id, so log
/// lines inside it can be found in the trace backend.
pub async fn reconcile_cluster(cluster: &EtcdCluster, ctx: &Context) -> Result<Outcome> {
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let span = info_span!(
        "reconcile",
        cluster = %key,
        outcome = Empty,
        trace_id = Empty,
        otel.status_code = Empty
    );
    if let Some(id) = crate::telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    let result = Box::pin(reconcile_pipeline(cluster, ctx, &key).instrument(span.clone())).await;
    if result.as_ref().is_ok_and(Outcome::is_at_rest) {
        // Until its next slow poll a cluster at rest holds no etcd
        // connection (nor the port-forward tunnel under it): a replica's
        // memory grows with the clusters in flight, not with the fleet.
        ctx.etcd_clients.evict(&key);
    }
    match &result {
        Ok(outcome) => span.record("outcome", outcome.label()),
        Err(e) => span
            .record("outcome", e.reason())
            .record("otel.status_code", "ERROR"),
    };
    result
}

/// A child span of the reconcile for one pipeline step.
fn step_span(step: &'static str, cluster: &str) -> Span {
    info_span!(
        "step",
        otel.name = step,
        step,
        cluster,
        outcome = Empty,
        otel.status_code = Empty
    )
}

/// Runs one pipeline step in its span and records how it ended.
async fn traced<T, E: StepFailure>(
    span: Span,
    step: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> std::result::Result<T, E> {
    // Boxed: the step futures are large and a debug build would otherwise
    // carry each one several times on the polling thread's stack.
    let result = Box::pin(step.instrument(span.clone())).await;
    match &result {
        Ok(_) => span.record("outcome", "ok"),
        Err(e) => span
            .record("outcome", e.failure_reason())
            .record("otel.status_code", "ERROR"),
    };
    result
}

/// Failures whose short reason a step span records as its outcome.
trait StepFailure {
    fn failure_reason(&self) -> &'static str;
}

impl StepFailure for Error {
    fn failure_reason(&self) -> &'static str {
        self.reason()
    }
}

impl StepFailure for ConnectError {
    fn failure_reason(&self) -> &'static str {
        self.reason()
    }
}

/// What a stage answers: the next stage's input, or the reconcile's outcome.
enum Stage<T> {
    Next(T),
    Done(Outcome),
}

/// The next stage's input, or return the outcome the stage ended with.
macro_rules! next {
    ($stage:expr) => {
        match $stage {
            Stage::Next(value) => value,
            Stage::Done(outcome) => return Ok(outcome),
        }
    };
}

/// A stage's input, or the reconcile's outcome from inside a stage.
macro_rules! next_in_stage {
    ($stage:expr) => {
        match $stage {
            Stage::Next(value) => value,
            Stage::Done(outcome) => return Ok(Stage::Done(outcome)),
        }
    };
}

async fn reconcile_pipeline(cluster: &EtcdCluster, ctx: &Context, key: &str) -> Result<Outcome> {
    let mut run = Run::new(cluster, ctx, key);
    let writes = next!(run.admit().await?);
    let resolved = next!(unless_stopping(ctx, Box::pin(run.resolve(writes))).await?);
    let connected = next!(unless_stopping(ctx, Box::pin(run.connect(&resolved))).await?);
    let observed = next!(unless_stopping(ctx, Box::pin(run.observe(&resolved, &connected))).await?);
    let plan = next!(run.plan(&observed, writes).await?);
    let acted = run.act(plan, &connected, &resolved, &observed).await;
    observed
        .let_go_of_members_in_transition(resolved.inputs.tls)
        .await;
    let outcome = next!(acted?);
    run.report(outcome).await
}

/// A stage before the act, unless the controller starts to stop first: a
/// reconcile that has taken no step yet ends at once (`Outcome::Stopped`),
/// rather than holding the process's exit behind a read of a slow workload
/// cluster. What it leaves half done is what a crash would, and every
/// stage tolerates that. A step once begun is finished (within the
/// shutdown grace).
/// (Boxed: the stages' futures are large, and a debug build would carry
/// each one several times on the polling thread's stack.)
async fn unless_stopping<T>(
    ctx: &Context,
    stage: std::pin::Pin<Box<impl std::future::Future<Output = Result<Stage<T>>>>>,
) -> Result<Stage<T>> {
    match ctx.shutdown.race(stage).await {
        Some(result) => result,
        None => Ok(Stage::Done(Outcome::Stopped)),
    }
}

/// One reconcile in progress: the cluster, the object every write to it
/// goes through, and what the stages learned (from which the report
/// composes the status).
struct Run<'a> {
    cluster: &'a EtcdCluster,
    ctx: &'a Context,
    key: &'a str,
    object: ClusterObject,
    learned: Learned,
}

/// The workload cluster reached, and the identity it is for.
struct Connected {
    location: KubeconfigLocation,
    identity: ManagedIdentity,
    workload: WorkloadCluster,
}

impl<'a> Run<'a> {
    fn new(cluster: &'a EtcdCluster, ctx: &'a Context, key: &'a str) -> Self {
        Run {
            cluster,
            ctx,
            key,
            object: ClusterObject::new(&ctx.management, cluster),
            learned: Learned::default(),
        }
    }

    /// Admission ([`admission::RULES`]): whether the reconcile goes on, and
    /// whether it may write (false while paused). A new cluster gets the
    /// finalizer; a deleted one is cleaned up.
    async fn admit(&mut self) -> Result<Stage<bool>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        match admission::admit(&Candidate::new(cluster, ctx.owns(cluster))) {
            Admission::Stop(outcome) => Ok(Stage::Done(outcome)),
            Admission::Finalize => {
                let finalizing = act::finalize(cluster, ctx, &mut self.object);
                let outcome = traced(step_span("act", self.key), finalizing).await?;
                Ok(Stage::Done(outcome))
            }
            Admission::Refuse(refusal) => {
                self.learned.admission_refusal = Some(refusal);
                self.blocked().await
            }
            Admission::Proceed {
                writes,
                add_finalizer,
            } => {
                if add_finalizer {
                    self.object
                        .add_finalizer(cluster.finalizers(), FINALIZER)
                        .await?;
                }
                Ok(Stage::Next(writes))
            }
        }
    }

    /// Ends the reconcile blocked, after the report stage.
    async fn blocked<T>(&mut self) -> Result<Stage<T>> {
        let composed = self.write_report().await?;
        Ok(Stage::Done(Outcome::Blocked(composed.blocked_reason())))
    }

    /// resolve: the template chain and materialization, and the version.
    async fn resolve(&mut self, writes: bool) -> Result<Stage<Resolved>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let resolving = resolve::resolve_cluster(cluster, ctx, &mut self.object, writes);
        let found = traced(step_span("resolve", self.key), resolving).await?;
        self.learned.template = found.template;
        self.learned.resolved = found.spec_resolved;
        self.learned.version = found.version;
        match found.resolved {
            Some(resolved) => Ok(Stage::Next(resolved)),
            None => self.blocked().await,
        }
    }

    /// connect: the kubeconfig Secret to the workload client.
    async fn connect(&mut self, resolved: &Resolved) -> Result<Stage<Connected>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let Some(location) = KubeconfigLocation::of(cluster) else {
            return self.unreachable(&ConnectError::NoClusterReference).await;
        };
        let identity = ManagedIdentity {
            kubeconfig_secret: format!("{}/{}", location.secret_name, location.key),
            workload_namespace: resolved.inputs.workload_namespace.clone(),
            tls: resolved.inputs.tls,
        };
        let connecting = ctx
            .connector
            .connect_trusting(&location, ctx.settings.reread_after);
        match traced(step_span("connect", self.key), connecting).await {
            Ok(workload) => Ok(Stage::Next(Connected {
                location,
                identity,
                workload,
            })),
            Err(e) => {
                let delay = ctx.connector.record_failure(&location, &e);
                info!(cluster = %cluster.name_any(), reason = e.reason(), ?delay, "workload cluster not reachable");
                self.unreachable(&e).await
            }
        }
    }

    /// Ends the reconcile blocked on a workload cluster it cannot reach.
    async fn unreachable<T>(&mut self, e: &ConnectError) -> Result<Stage<T>> {
        self.learned.remote = Some(Remote::Unreachable {
            reason: e.reason(),
            message: e.to_string(),
        });
        self.blocked().await
    }

    /// observe: the workload objects, etcd and the EtcdCluster's memory
    /// (read only). An observation that trusted the memo and would take a
    /// step is made again from fresh reads.
    async fn observe(
        &mut self,
        resolved: &Resolved,
        connected: &Connected,
    ) -> Result<Stage<Observed>> {
        let ctx = self.ctx;
        let mut observed = next_in_stage!(self.read_workload(resolved, connected).await?);
        // The memo is trusted only by a reconcile that ends converged: one
        // that will act reads every object again first, so each write knows,
        // in this reconcile, that the object is still this cluster's.
        if observed.trusted_memo && matches!(plan::plan_next_step(&observed.planner), Plan::Act(_))
        {
            ctx.memo.forget(&observed.memo_key.0);
            observed = next_in_stage!(self.read_workload(resolved, connected).await?);
        }
        ctx.connector.record_success(&connected.location);
        self.learned.remote = Some(Remote::Reachable {
            server: connected.workload.server.clone(),
        });
        self.learned.observation = Some(observed.planner.clone());
        if observed.restore_record.is_some() || observed.planner.restore != RestoreGate::NotNeeded {
            let gate = observed.planner.restore.clone();
            if let RestoreGate::Refused(r) = &gate {
                publish(ctx, self.cluster, EventType::Warning, r.reason, &r.message).await;
            }
            self.learned.restore = Some((gate, observed.restore_record.clone()));
        }
        Ok(Stage::Next(observed))
    }

    /// One observation of the workload cluster and etcd; a workload API
    /// that fails ends the reconcile blocked (reported unreachable).
    async fn read_workload(
        &mut self,
        resolved: &Resolved,
        connected: &Connected,
    ) -> Result<Stage<Observed>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let observing = observe::observe(cluster, resolved, &connected.workload, ctx);
        match traced(step_span("observe", self.key), observing).await {
            Ok(o) => Ok(Stage::Next(o)),
            Err(Error::WorkloadApi { server, source }) => {
                let e = ConnectError::from_workload(&server, &source);
                ctx.memo.forget(&cluster_key(cluster));
                ctx.connector.record_failure(&connected.location, &e);
                self.unreachable(&e).await
            }
            Err(e) => Err(e),
        }
    }

    /// plan: at most one next step (pure). A refusal, or a cluster that
    /// may not write (paused), ends the reconcile here.
    async fn plan(&mut self, observed: &Observed, writes: bool) -> Result<Stage<Plan>> {
        let ctx = self.ctx;
        let plan = {
            let span = step_span("plan", self.key);
            let _in_plan = span.enter();
            let plan = plan::plan_next_step(&observed.planner);
            span.record("outcome", trace_label(&plan));
            plan
        };
        ctx.metrics.observe_plan(&plan);
        let (memo_key, fingerprint) = &observed.memo_key;
        if matches!(plan, Plan::Converged) && writes {
            let pki = observed.pki.clone();
            ctx.memo
                .remember(memo_key, *fingerprint, pki, ctx.settings.reread_after);
        } else {
            ctx.memo.forget(memo_key);
        }
        if let Plan::Refuse(refusal) = &plan {
            let message = refusal.message.clone();
            self.learned.decision = Some(Decision::Refused(refusal.clone()));
            self.write_report().await?;
            return Ok(Stage::Done(Outcome::Blocked(message)));
        }
        if !writes {
            let next = match &plan {
                Plan::Act(step) => Some(step.to_string()),
                _ => None,
            };
            self.learned.decision = Some(Decision::Paused(next.clone()));
            self.write_report().await?;
            return Ok(Stage::Done(Outcome::Paused(next)));
        }
        Ok(Stage::Next(plan))
    }

    /// act: take the planned step, or say why none is taken.
    async fn act(
        &mut self,
        plan: Plan,
        connected: &Connected,
        resolved: &Resolved,
        observed: &Observed,
    ) -> Result<Stage<Outcome>> {
        // Recorded before the first workload write: from now on this is the etcd
        // this resource manages.
        self.learned.identity = Some(connected.identity.clone());
        let (decision, outcome) = match plan {
            Plan::Converged => (Decision::Converged, Outcome::Converged),
            Plan::Wait(why) => (Decision::Waiting(why.clone()), Outcome::Waiting(why)),
            Plan::Hold(why) => (Decision::Held(why.clone()), Outcome::Held(why)),
            Plan::Refuse(r) => (Decision::Refused(r.clone()), Outcome::Blocked(r.message)),
            Plan::Act(step) => {
                let acting = act::Acting {
                    cluster: self.cluster,
                    inputs: &resolved.inputs,
                    observed,
                    workload: &connected.workload,
                    ctx: self.ctx,
                };
                return self.take(step, acting).await.map(Stage::Next);
            }
        };
        self.learned.decision = Some(decision);
        Ok(Stage::Next(outcome))
    }

    /// Executes one step in its span, with its metric and event.
    async fn take(&mut self, step: Step, acting: act::Acting<'_>) -> Result<Outcome> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        self.record_intent(&step).await?;
        let started = std::time::Instant::now();
        let span = info_span!(
            "step",
            otel.name = "act",
            step = "act",
            action = step.kind(),
            cluster = self.key,
            outcome = Empty,
            otel.status_code = Empty
        );
        let result = traced(span, act::execute(&step, acting, &mut self.object)).await;
        ctx.metrics.observe_step(
            step.kind(),
            started.elapsed(),
            result.as_ref().err().map(Error::reason),
        );
        let error = result.as_ref().err().map(ToString::to_string);
        self.learned.decision = Some(Decision::Acted {
            step: step.clone(),
            error: error.clone(),
        });
        match result {
            Ok(record) => {
                self.learned.snapshot = record.snapshot;
                publish(
                    ctx,
                    cluster,
                    EventType::Normal,
                    step.kind(),
                    &step.to_string(),
                )
                .await;
                Ok(Outcome::Acted(step))
            }
            Err(e) => {
                let reason = format!("{}Failed", step.kind());
                let note = format!("{step}: {}", error.unwrap_or_default());
                publish(ctx, cluster, EventType::Warning, &reason, &note).await;
                self.write_report().await?;
                Err(e)
            }
        }
    }

    /// A step whose effect could not be told from someone else's after a
    /// crash records what it is about to do in status first: the removal
    /// of an adopted etcd's old member (a member gone that etcdfleet did
    /// not remove halts the takeover).
    async fn record_intent(&mut self, step: &Step) -> Result<()> {
        if let Step::RetireMember { member_id } = step {
            self.learned.retiring = Some(*member_id);
            self.learned.decision = Some(Decision::Acting);
            self.write_status().await?;
        }
        Ok(())
    }

    /// report: status, conditions and their metrics, and events.
    async fn report(mut self, outcome: Outcome) -> Result<Outcome> {
        self.write_report().await?;
        Ok(outcome)
    }

    /// The report stage in its span: the status composed from what was
    /// learned, written if it changed, and the adoption's event when its
    /// phase changed. Every reconcile that observed ends in it once.
    async fn write_report(&mut self) -> Result<Composed> {
        let span = step_span("report", self.key);
        let composed = traced(span, self.write_status()).await?;
        if let Some((warning, reason, note)) = &composed.adoption_event {
            let kind = if *warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            publish(self.ctx, self.cluster, kind, reason, note).await;
        }
        Ok(composed)
    }

    async fn write_status(&mut self) -> Result<Composed> {
        let composed = status::compose(self.cluster, &self.learned);
        let metrics = &self.ctx.metrics;
        let new = &composed.status;
        metrics.set_cluster_conditions(self.key, Some(&new.conditions));
        metrics.set_cluster_members(self.key, new.replicas, new.ready_members);
        metrics.set_ca_rotation_phase(
            self.key,
            &etcdfleet_api::ca_rotation::phase::ALL,
            new.ca_rotation.as_ref().map(|r| r.phase.as_str()),
        );
        self.object.write_status(new).await?;
        Ok(composed)
    }
}

/// The planner's answer as the plan step's trace attribute: the step's
/// kind, or the answer in lower case (`converged`, `wait`, ...).
fn trace_label(plan: &Plan) -> String {
    match plan {
        Plan::Act(step) => step.kind().to_string(),
        other => other.plan_label().to_ascii_lowercase(),
    }
}

/// The planner's answer in the plans counter.
impl PlanLabel for Plan {
    fn plan_label(&self) -> &'static str {
        match self {
            Plan::Act(step) => step.kind(),
            Plan::Wait(_) => "Wait",
            Plan::Hold(_) => "Hold",
            Plan::Converged => "Converged",
            Plan::Refuse(_) => "Refuse",
        }
    }
}

/// Publishes an event about a cluster; a failure to publish is logged, never fatal.
pub async fn publish(
    ctx: &Context,
    cluster: &EtcdCluster,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    ctx.access.publish(cluster, type_, reason, note).await;
}
