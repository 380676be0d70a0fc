//! One reconcile of one EtcdCluster, as six named stages:
//!
//! ```text
//! resolve  → template chain + materialization (pure, plus one apply, once)
//! connect  → kubeconfig Secret → workload client (cached; direct GET)
//! observe  → workload objects + etcd members and health (read only)
//! plan     → at most one next step (pure, `plan::plan_next_step`)
//! act      → execute that step (idempotent, deterministic names, preconditions)
//! report   → status + conditions + events + metrics
//! ```
//!
//! Each stage hands its result to the next or ends the reconcile with an
//! outcome ([`Stage`]); each runs in its own trace span.

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::{EtcdCluster, ManagedIdentity};
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::field::Empty;
use tracing::{Instrument, Span, info, info_span, warn};

use super::context::{Context, Error, FINALIZER, Outcome, Result, cluster_key};
use super::observe::Observed;
use super::plan::{self, Plan, RemovalCause, RestoreGate, Step};
use super::requeue::{held_requeue, in_flight_requeue, jitter, requeue_for};
use super::resolve::Resolved;
use super::{act, observe, resolve, status};
use crate::connector::{ConnectError, KubeconfigLocation, WorkloadCluster};
use crate::metrics::PlanLabel;

/// Entry point for kube-runtime's `Controller`.
pub async fn reconcile(cluster: Arc<EtcdCluster>, ctx: Arc<Context>) -> Result<Action> {
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

/// The report step: status, conditions (and the write's own API call).
async fn report_step(report: &status::Report, ctx: &Context, cluster: &str) -> Result<bool> {
    traced(step_span("report", cluster), report.write(ctx)).await
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

async fn reconcile_pipeline(cluster: &EtcdCluster, ctx: &Context, key: &str) -> Result<Outcome> {
    let mut run = next!(Run::admit(cluster, ctx, key).await?);
    let mut resolved = next!(unless_stopping(ctx, Box::pin(run.resolve())).await?);
    let connected = next!(unless_stopping(ctx, Box::pin(run.connect(&resolved))).await?);
    let observing = Box::pin(run.observe(&mut resolved, &connected));
    let observed = next!(unless_stopping(ctx, observing).await?);
    let plan = next!(run.plan(&observed).await?);
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

/// One reconcile in progress: the cluster, the status being built, and what
/// every stage needs.
struct Run<'a> {
    cluster: &'a EtcdCluster,
    ctx: &'a Context,
    key: &'a str,
    paused: bool,
    api: Api<EtcdCluster>,
    report: status::Report,
}

/// The workload cluster reached, and the etcd it holds.
struct Connected {
    location: KubeconfigLocation,
    identity: ManagedIdentity,
    workload: WorkloadCluster,
}

impl<'a> Run<'a> {
    /// Before the pipeline: another owner's cluster is not touched, a
    /// deleted one is cleaned up, and a new one gets the finalizer.
    async fn admit(
        cluster: &'a EtcdCluster,
        ctx: &'a Context,
        key: &'a str,
    ) -> Result<Stage<Self>> {
        // Another stage's (or shard's) cluster: no read, no write.
        if !ctx.owns(cluster) {
            return Ok(Stage::Done(Outcome::Blocked(format!(
                "not owned by this controller: {}/{} is outside its namespaces or label selector",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            ))));
        }
        let paused = cluster.spec.paused == Some(true);
        if cluster.meta().deletion_timestamp.is_some() {
            if paused && cluster.finalizers().iter().any(|f| f == FINALIZER) {
                // Paused means no write anywhere, cleanup included.
                return Ok(Stage::Done(Outcome::Paused(Some(
                    "clean up the workload cluster and release the finalizer".into(),
                ))));
            }
            let outcome = traced(step_span("act", key), act::finalize(cluster, ctx)).await?;
            return Ok(Stage::Done(outcome));
        }
        let api: Api<EtcdCluster> = Api::namespaced(
            ctx.management.clone(),
            &cluster.namespace().unwrap_or_default(),
        );
        let mut report = status::Report::new(cluster);
        if !paused && !cluster.finalizers().iter().any(|f| f == FINALIZER) {
            let mut finalizers = cluster.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            let patch = serde_json::json!({
                "metadata": { "finalizers": finalizers, "resourceVersion": cluster.resource_version() }
            });
            let patched = api
                .patch(
                    &cluster.name_any(),
                    &crate::controller_patch_params(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(Error::ManagementApi)?;
            report.advance_resource_version(patched.metadata.resource_version);
        }
        Ok(Stage::Next(Run {
            cluster,
            ctx,
            key,
            paused,
            api,
            report,
        }))
    }

    /// Ends the reconcile blocked, after the report stage.
    async fn blocked<T>(&self, why: String) -> Result<Stage<T>> {
        report_step(&self.report, self.ctx, self.key).await?;
        Ok(Stage::Done(Outcome::Blocked(why)))
    }

    /// resolve: the template chain and materialization.
    async fn resolve(&mut self) -> Result<Stage<Resolved>> {
        let resolving = resolve::resolve_cluster(self.cluster, self.ctx, &mut self.report);
        match traced(step_span("resolve", self.key), resolving).await? {
            Some(resolved) => Ok(Stage::Next(resolved)),
            None => self.blocked(self.report.blocked_reason()).await,
        }
    }

    /// connect: the kubeconfig Secret to the workload client, once the spec
    /// is known to point at the etcd this resource manages.
    async fn connect(&mut self, resolved: &Resolved) -> Result<Stage<Connected>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let Some(location) = KubeconfigLocation::of(cluster) else {
            self.report
                .remote_unreachable(&ConnectError::NoClusterReference);
            return self
                .blocked(ConnectError::NoClusterReference.to_string())
                .await;
        };
        // identity: the etcd this resource manages stays the one it started
        // with; a spec that points elsewhere is refused before any workload I/O.
        let identity = ManagedIdentity {
            kubeconfig_secret: format!("{}/{}", location.secret_name, location.key),
            workload_namespace: resolved.inputs.workload_namespace.clone(),
            tls: resolved.inputs.tls,
        };
        if let Some(message) = plan::identity_mismatch(
            cluster.status.as_ref().and_then(|s| s.identity.as_ref()),
            &identity,
        ) {
            self.report.refused(&plan::Refusal {
                reason: "IdentityChanged",
                message,
            });
            self.report.write(ctx).await?;
            return Ok(Stage::Done(Outcome::Blocked(self.report.blocked_reason())));
        }
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
                self.report.remote_unreachable(&e);
                report_step(&self.report, ctx, self.key).await?;
                info!(cluster = %cluster.name_any(), reason = e.reason(), ?delay, "workload cluster not reachable");
                Ok(Stage::Done(Outcome::Blocked(e.to_string())))
            }
        }
    }

    /// observe: the workload objects and etcd (read only), then, for a
    /// cluster that restores, its snapshot.
    async fn observe(
        &mut self,
        resolved: &mut Resolved,
        connected: &Connected,
    ) -> Result<Stage<Observed>> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let (location, workload) = (&connected.location, &connected.workload);
        let mut observed = match self.read_workload(resolved, connected).await? {
            Stage::Next(observed) => observed,
            Stage::Done(outcome) => return Ok(Stage::Done(outcome)),
        };
        // The memo is trusted only by a reconcile that ends converged: one
        // that will act reads every object again first, so each write knows,
        // in this reconcile, that the object is still this cluster's.
        if observed.trusted_memo && matches!(plan::plan_next_step(&observed.planner), Plan::Act(_))
        {
            ctx.memo.forget(&observed.memo_key.0);
            observed = match self.read_workload(resolved, connected).await? {
                Stage::Next(fresh) => fresh,
                Stage::Done(outcome) => return Ok(Stage::Done(outcome)),
            };
        }
        ctx.connector.record_success(location);
        self.report.remote_reachable(&workload.server);
        self.report.observed(&observed.planner);
        if let Some((warning, reason, note)) = self.report.adoption(&observed.planner) {
            let kind = if warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            publish(ctx, cluster, kind, reason, &note).await;
        }
        let bootstrapped =
            observed.planner.statefulset.is_some() || observed.planner.known_voters > 0;
        if crate::restore::needed(cluster, bootstrapped) {
            observed.planner.restore = self.restore_gate(resolved, &observed).await?;
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
        let (location, workload) = (&connected.location, &connected.workload);
        let observing = observe::observe(cluster, resolved, workload, ctx, &self.report);
        match traced(step_span("observe", self.key), observing).await {
            Ok(o) => Ok(Stage::Next(o)),
            Err(Error::WorkloadApi { server, source }) => {
                let e = ConnectError::from_workload(&server, &source);
                ctx.memo.forget(&cluster_key(cluster));
                ctx.connector.record_failure(location, &e);
                self.report.remote_unreachable(&e);
                self.blocked(e.to_string()).await
            }
            Err(e) => Err(e),
        }
    }

    /// A cluster restoring from a snapshot checks it before its first write:
    /// no member volume may exist yet, and the object must verify. The
    /// verified record is what the seeder is rendered from, from now on.
    async fn restore_gate(
        &mut self,
        resolved: &mut Resolved,
        observed: &Observed,
    ) -> Result<RestoreGate> {
        let (cluster, ctx) = (self.cluster, self.ctx);
        let kept: Vec<String> = observed.pvcs.values().map(|p| p.name_any()).collect();
        let gate = match crate::restore::kept_volumes(&kept) {
            Some(refused) => RestoreGate::Refused(refused.into()),
            None => {
                let requested = resolved.inputs.version.clone();
                let verdict = traced(step_span("restore", self.key), async {
                    crate::restore::gate(
                        &ctx.management,
                        cluster,
                        &requested,
                        &ctx.settings.seeder_image,
                    )
                    .await
                    .map_err(Error::ManagementApi)
                })
                .await?;
                match verdict {
                    Some(Ok(record)) => {
                        self.report.record_restore(&record);
                        resolved.inputs.restore = Some(record);
                        RestoreGate::Verified
                    }
                    Some(Err(refused)) => RestoreGate::Refused(refused.into()),
                    None => RestoreGate::NotNeeded,
                }
            }
        };
        self.report.restore_checked(&gate);
        if let RestoreGate::Refused(r) = &gate {
            publish(ctx, cluster, EventType::Warning, r.reason, &r.message).await;
        }
        Ok(gate)
    }

    /// plan: at most one next step (pure). A refusal, or a paused cluster,
    /// ends the reconcile here.
    async fn plan(&mut self, observed: &Observed) -> Result<Stage<Plan>> {
        let ctx = self.ctx;
        let plan = {
            let span = step_span("plan", self.key);
            let _in_plan = span.enter();
            let plan = plan::plan_next_step(&observed.planner);
            span.record("outcome", plan_label(&plan));
            plan
        };
        ctx.metrics.observe_plan(&plan);
        let (memo_key, fingerprint) = &observed.memo_key;
        if matches!(plan, Plan::Converged) && !self.paused {
            ctx.memo.remember(
                memo_key,
                *fingerprint,
                observed.pki.clone(),
                ctx.settings.reread_after,
            );
        } else {
            ctx.memo.forget(memo_key);
        }
        if let Plan::Refuse(refusal) = &plan {
            self.report.refused(refusal);
            self.report.write(ctx).await?;
            return Ok(Stage::Done(Outcome::Blocked(refusal.message.clone())));
        }
        self.report.no_conflict();
        if self.paused {
            let next = match &plan {
                Plan::Act(step) => Some(step.to_string()),
                _ => None,
            };
            self.report.paused(next.as_deref());
            report_step(&self.report, ctx, self.key).await?;
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
        self.report.record_identity(&connected.identity);
        Ok(Stage::Next(match plan {
            Plan::Converged => {
                self.report.converged();
                Outcome::Converged
            }
            Plan::Wait(why) => {
                self.report.waiting(&why);
                Outcome::Waiting(why)
            }
            Plan::Hold(why) => {
                self.report.held(&why);
                Outcome::Held(why)
            }
            Plan::Refuse(refusal) => {
                self.report.refused(&refusal);
                Outcome::Blocked(refusal.message)
            }
            Plan::Act(step) => {
                if let Some(why) = self.failure_grace_passed_live(&step, observed).await? {
                    self.report.waiting(&why);
                    self.report.write(self.ctx).await?;
                    return Ok(Stage::Done(Outcome::Waiting(why)));
                }
                self.take(step, resolved, observed, &connected.workload)
                    .await?
            }
        }))
    }

    /// The failure grace is judged again from the live object, not the copy
    /// this reconcile started from (a cache may be behind): why a failed
    /// member's removal is not taken after all, if it is not.
    async fn failure_grace_passed_live(
        &self,
        step: &Step,
        observed: &Observed,
    ) -> Result<Option<String>> {
        let Step::RemoveMember {
            member_id,
            cause: RemovalCause::Failed,
            ..
        } = step
        else {
            return Ok(None);
        };
        let Some(health) = &observed.health else {
            return Ok(None);
        };
        let live = self
            .api
            .get(&self.cluster.name_any())
            .await
            .map_err(Error::ManagementApi)?;
        let still_failed = status::Report::new(&live)
            .failed_members(health, self.ctx.settings.member_failure_grace)
            .contains(member_id);
        Ok((!still_failed).then(|| {
            format!(
                "member {member_id:x} is not past its failure grace on the live object; not removed"
            )
        }))
    }

    /// Executes one step in its span, with its metric and event.
    async fn take(
        &mut self,
        step: Step,
        resolved: &Resolved,
        observed: &Observed,
        workload: &WorkloadCluster,
    ) -> Result<Outcome> {
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
        let result = match &step {
            // The steps of a version change record into the status.
            Step::Version(v) => {
                let acting = act::version::execute(v, cluster, observed, ctx, &mut self.report);
                traced(span, acting).await
            }
            _ => {
                let acting = act::execute(&step, cluster, resolved, observed, workload, ctx);
                traced(span, acting).await
            }
        };
        ctx.metrics.observe_step(
            step.kind(),
            started.elapsed(),
            result.as_ref().err().map(Error::reason),
        );
        match result {
            Ok(()) => {
                self.report.acted(&step, None);
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
                self.report.acted(&step, Some(&e));
                publish(
                    ctx,
                    cluster,
                    EventType::Warning,
                    &format!("{}Failed", step.kind()),
                    &format!("{step}: {e}"),
                )
                .await;
                report_step(&self.report, ctx, self.key).await?;
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
            self.report.record_retirement(*member_id);
            self.report.write_before_acting(self.ctx).await?;
        }
        Ok(())
    }

    /// report: status and conditions.
    async fn report(self, outcome: Outcome) -> Result<Outcome> {
        report_step(&self.report, self.ctx, self.key).await?;
        Ok(outcome)
    }
}

/// Short label of a planner answer (trace attribute).
fn plan_label(plan: &Plan) -> &'static str {
    match plan {
        Plan::Converged => "converged",
        Plan::Wait(_) => "wait",
        Plan::Hold(_) => "hold",
        Plan::Refuse(_) => "refuse",
        Plan::Act(step) => step.kind(),
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
