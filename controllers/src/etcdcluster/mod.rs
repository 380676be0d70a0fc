//! The EtcdCluster reconciler. One reconcile is a pipeline:
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
//! Everything that decides lives in `plan` (and in `etcdfleet_api`); this
//! module and its siblings only move data between the APIs and those pure
//! functions.

pub mod act;
pub mod memo;
pub mod observe;
pub mod plan;
pub mod resolve;
pub mod status;
pub mod version_change;

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use tracing::field::Empty;
use tracing::{Instrument, Span, info, info_span, warn};

use crate::connector::{ConnectError, KubeconfigLocation, WorkloadClusterConnector};
use crate::dialer::EtcdDialer;
use crate::etcd::{Deadlines, EtcdError};
use crate::metrics::Metrics;
use crate::render::RenderProfile;
use plan::{Plan, Step};

/// Finalizer that removes the workload objects when an EtcdCluster is deleted.
pub const FINALIZER: &str = "etcdfleet.dev/cleanup";

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// How long a member may stay unhealthy before it is replaced.
    pub member_failure_grace: Duration,
    /// How long deletion keeps trying to clean an unreachable workload cluster
    /// before it gives up and releases the EtcdCluster (objects are left behind).
    pub deletion_timeout: Duration,
    /// Deadlines of etcd calls made while reconciling.
    pub etcd_deadlines: Deadlines,
    /// Requeue of a converged cluster (remote health polling), before jitter.
    pub requeue_converged: Duration,
    /// Requeue while a step is in progress or the planner waits.
    pub requeue_progress: Duration,
    /// Leaf certificates (server, peer, the controller's client identity) are
    /// reissued when they expire within this long. Leaves are valid 365 days.
    pub cert_renew_before: Duration,
    /// How long a converged cluster's kubeconfig, PKI Secret and static
    /// workload objects are trusted without reading them again (zero: read
    /// every reconcile). See [`memo`].
    pub reread_after: Duration,
    /// Default image of the restore seeder (see `ControllerConfig::seeder_image`).
    pub seeder_image: String,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        ReconcilerSettings {
            member_failure_grace: Duration::from_secs(120),
            deletion_timeout: Duration::from_secs(600),
            etcd_deadlines: Deadlines {
                connect: Duration::from_secs(3),
                request: Duration::from_secs(5),
                health: Duration::from_secs(3),
                reconfigure: Duration::from_secs(15),
                promote: Duration::from_secs(5),
                defragment: Duration::from_secs(120),
                snapshot: Duration::from_secs(600),
            },
            requeue_converged: Duration::from_secs(60),
            requeue_progress: Duration::from_secs(2),
            cert_renew_before: Duration::from_secs(30 * 86400),
            reread_after: Duration::from_secs(10 * 60),
            seeder_image: crate::config::DEFAULT_SEEDER_IMAGE.to_string(),
        }
    }
}

/// Decides whether this controller owns an EtcdCluster (see
/// `crate::config::ControllerConfig::owns`).
pub type OwnerFilter = Arc<dyn Fn(&EtcdCluster) -> bool + Send + Sync>;

/// Everything a reconcile needs, shared by all reconciles.
pub struct Context {
    pub management: Client,
    pub connector: WorkloadClusterConnector,
    pub dialer: Arc<dyn EtcdDialer>,
    /// etcd clients kept between reconciles, one per cluster.
    pub etcd_clients: crate::etcd::ClientPool,
    /// Converged observations, to skip re-reading static objects.
    pub memo: memo::ObservationMemo,
    /// Per cluster, how many short requeues in a row while an operation is
    /// in flight (the next one waits half as long again, up to `requeue_progress`).
    pub in_flight: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Per cluster, how many holds in a row for the same generation (each
    /// waits twice as long as the one before).
    pub held: std::sync::Mutex<std::collections::HashMap<String, (Option<i64>, u32)>>,
    pub settings: ReconcilerSettings,
    pub profile: RenderProfile,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// Clusters this controller may touch; `None` owns all. The watch is
    /// filtered too; this is the defence in depth.
    pub owner_filter: Option<OwnerFilter>,
}

impl Context {
    pub fn new(
        management: Client,
        connector: WorkloadClusterConnector,
        dialer: Arc<dyn EtcdDialer>,
        settings: ReconcilerSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(
            management.clone(),
            Reporter {
                controller: "etcdfleet-controller".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Context {
            management,
            connector,
            dialer,
            etcd_clients: crate::etcd::ClientPool::default(),
            memo: memo::ObservationMemo::default(),
            in_flight: Default::default(),
            held: Default::default(),
            settings,
            profile: RenderProfile::default(),
            metrics,
            recorder,
            owner_filter: None,
        }
    }

    /// Restricts the reconciler to the clusters `owns` accepts.
    pub fn with_owner_filter(mut self, owns: OwnerFilter) -> Self {
        self.owner_filter = Some(owns);
        self
    }
}

/// Failures of one reconcile. Every variant has a short `reason()` used as a
/// metric label (and, where it concerns the cluster, a condition reason).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("management API: {0}")]
    ManagementApi(#[source] kube::Error),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("workload API of {server}: {source}")]
    WorkloadApi {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("certificates: {0}")]
    Pki(#[from] crate::pki::PkiError),
    #[error("{0}")]
    Invalid(String),
    /// A snapshot before a version change failed (the backup's own reason).
    #[error("snapshot: {0}")]
    Snapshot(Box<crate::backup::act::BackupError>),
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ManagementApi(_) => "ManagementAPIError",
            Error::Connect(e) => e.reason(),
            Error::WorkloadApi { .. } => "WorkloadAPIError",
            Error::Etcd(e) => e.reason(),
            Error::Pki(e) => e.reason(),
            Error::Invalid(_) => "InvalidObject",
            Error::Snapshot(e) => e.reason(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What one reconcile did, for the test driver and the demo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The planner had nothing to do.
    Converged,
    /// The planner waits for something (the message says what).
    Waiting(String),
    /// Nothing changes until a person acts (the message says what to do);
    /// looked at again with exponential backoff.
    Held(String),
    /// A step was taken.
    Acted(Step),
    /// The step the planner chose was not taken because the cluster is paused.
    Paused(Option<String>),
    /// Nothing can be done until the input changes (bad spec, rejected version,
    /// unreachable workload cluster); the conditions say why.
    Blocked(String),
    /// Deletion finished (the finalizer was removed).
    Deleted,
}

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

/// A cluster held for a person is looked at again after 1 s, then twice as
/// long each time it is still held, up to `cap` (five converged polls); a
/// refused or blocked one (bad spec, a conflict, a snapshot that fails its
/// check) starts at `blocked_base` (the converged poll) and doubles the same
/// way. A new generation (the spec changed) starts again. `None` (and the
/// count forgotten) for any other outcome.
pub fn held_requeue(
    held: &std::sync::Mutex<std::collections::HashMap<String, (Option<i64>, u32)>>,
    outcome: &Outcome,
    cluster: &EtcdCluster,
    blocked_base: Duration,
    cap: Duration,
) -> Option<Duration> {
    let key = cluster_key(cluster);
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    let base = match outcome {
        Outcome::Held(_) => Duration::from_secs(1),
        Outcome::Blocked(_) => blocked_base,
        _ => {
            held.remove(&key);
            return None;
        }
    };
    let generation = cluster.metadata.generation;
    let attempt = match held.get(&key) {
        Some((g, n)) if *g == generation => n + 1,
        _ => 0,
    };
    held.insert(key, (generation, attempt));
    Some(held_delay(base, attempt, cap))
}

/// `base` × 2^attempt, at most `cap`.
pub fn held_delay(base: Duration, attempt: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << attempt.min(20)).min(cap)
}

/// `ns/name` of a cluster.
pub fn cluster_key(cluster: &EtcdCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// While an operation is in flight, look again soon: 100 ms after a step
/// (its effect is usually visible within that), then growing by half while the
/// planner waits, up to `requeue_progress`. `None` once the cluster is
/// converged, paused, blocked or gone (the slow poll applies).
pub fn in_flight_requeue(
    outcome: &Outcome,
    ctx: &Context,
    cluster: &EtcdCluster,
) -> Option<Duration> {
    let key = cluster_key(cluster);
    let mut in_flight = ctx.in_flight.lock().unwrap_or_else(|p| p.into_inner());
    let attempt = match outcome {
        Outcome::Acted(_) => 0,
        Outcome::Waiting(_) => in_flight.get(&key).map_or(0, |n| n + 1),
        _ => {
            in_flight.remove(&key);
            return None;
        }
    };
    in_flight.insert(key, attempt);
    Some(in_flight_delay(attempt, ctx.settings.requeue_progress))
}

/// 100 ms × 1.5^attempt, at most `cap`: growing slowly enough that a
/// member becoming healthy is seen within half the time waited so far.
pub fn in_flight_delay(attempt: u32, cap: Duration) -> Duration {
    Duration::from_millis(100)
        .mul_f64(1.5f64.powi(attempt.min(32) as i32))
        .min(cap)
}

/// Requeue policy: soon while something is in flight, slowly (with jitter) when converged.
pub fn requeue_for(
    outcome: &Outcome,
    settings: &ReconcilerSettings,
    cluster: &EtcdCluster,
) -> Action {
    match outcome {
        Outcome::Deleted => Action::await_change(),
        Outcome::Acted(_) => Action::requeue(Duration::from_millis(200)),
        Outcome::Waiting(_) => Action::requeue(settings.requeue_progress),
        Outcome::Converged | Outcome::Paused(_) | Outcome::Blocked(_) | Outcome::Held(_) => {
            Action::requeue(jitter(settings.requeue_converged, &cluster.name_any()))
        }
    }
}

/// Spreads periodic polls of many clusters over time (±20%, stable per cluster).
fn jitter(base: Duration, key: &str) -> Duration {
    let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    let permille = 800 + (h % 400);
    base * permille as u32 / 1000
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

impl Outcome {
    /// Short label of the outcome (trace attribute).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Converged => "converged",
            Outcome::Waiting(_) => "waiting",
            Outcome::Held(_) => "held",
            Outcome::Acted(_) => "acted",
            Outcome::Paused(_) => "paused",
            Outcome::Blocked(_) => "blocked",
            Outcome::Deleted => "deleted",
        }
    }
}

async fn reconcile_pipeline(cluster: &EtcdCluster, ctx: &Context, key: &str) -> Result<Outcome> {
    // Another stage's (or shard's) cluster: no read, no write.
    if let Some(owns) = &ctx.owner_filter
        && !owns(cluster)
    {
        return Ok(Outcome::Blocked(format!(
            "not owned by this controller: {}/{} is outside its namespaces or label selector",
            cluster.namespace().unwrap_or_default(),
            cluster.name_any()
        )));
    }
    let paused = cluster.spec.paused == Some(true);
    if cluster.meta().deletion_timestamp.is_some() {
        if paused && cluster.finalizers().iter().any(|f| f == FINALIZER) {
            // Paused means no write anywhere, cleanup included.
            return Ok(Outcome::Paused(Some(
                "clean up the workload cluster and release the finalizer".into(),
            )));
        }
        return traced(step_span("act", key), act::finalize(cluster, ctx)).await;
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

    // resolve
    let mut resolved = match traced(
        step_span("resolve", key),
        resolve::resolve_cluster(cluster, ctx, &mut report),
    )
    .await?
    {
        Some(r) => r,
        None => {
            report_step(&report, ctx, key).await?;
            return Ok(Outcome::Blocked(report.blocked_reason()));
        }
    };

    // connect
    let Some(location) = KubeconfigLocation::of(cluster) else {
        report.remote_unreachable(&ConnectError::NoClusterReference);
        report_step(&report, ctx, key).await?;
        return Ok(Outcome::Blocked(
            ConnectError::NoClusterReference.to_string(),
        ));
    };

    // identity: the etcd this resource manages stays the one it started
    // with; a spec that points elsewhere is refused before any workload I/O.
    let identity = etcdfleet_api::ManagedIdentity {
        kubeconfig_secret: format!("{}/{}", location.secret_name, location.key),
        workload_namespace: resolved.inputs.workload_namespace.clone(),
        tls: resolved.inputs.tls,
    };
    if let Some(message) = plan::identity_mismatch(
        cluster.status.as_ref().and_then(|s| s.identity.as_ref()),
        &identity,
    ) {
        report.refused(&plan::Refusal {
            reason: "IdentityChanged",
            message,
        });
        report.write(ctx).await?;
        return Ok(Outcome::Blocked(report.blocked_reason()));
    }
    let workload = match traced(
        step_span("connect", key),
        ctx.connector
            .connect_trusting(&location, ctx.settings.reread_after),
    )
    .await
    {
        Ok(w) => w,
        Err(e) => {
            let delay = ctx.connector.record_failure(&location, &e);
            report.remote_unreachable(&e);
            report_step(&report, ctx, key).await?;
            info!(cluster = %cluster.name_any(), reason = e.reason(), ?delay, "workload cluster not reachable");
            return Ok(Outcome::Blocked(e.to_string()));
        }
    };

    // observe
    let mut observed = match traced(
        step_span("observe", key),
        observe::observe(cluster, &resolved, &workload, ctx, &report),
    )
    .await
    {
        Ok(o) => o,
        Err(Error::WorkloadApi { server, source }) => {
            let e = ConnectError::from_workload(&server, &source);
            ctx.memo.forget(&cluster_key(cluster));
            ctx.connector.record_failure(&location, &e);
            report.remote_unreachable(&e);
            report_step(&report, ctx, key).await?;
            return Ok(Outcome::Blocked(e.to_string()));
        }
        Err(e) => return Err(e),
    };
    ctx.connector.record_success(&location);
    report.remote_reachable(&workload.server);
    report.observed(&observed);
    // A cluster restoring from a snapshot checks it before its first write:
    // no member volume may exist yet, and the object must verify. The
    // verified record is what the seeder is rendered from, from now on.
    if crate::restore::needed(cluster, &observed.planner) {
        let kept: Vec<String> = observed.pvcs.values().map(|p| p.name_any()).collect();
        let gate = match crate::restore::kept_volumes(&kept) {
            Some(refused) => refused,
            None => {
                let requested = resolved.inputs.version.clone();
                let verdict = traced(step_span("restore", key), async {
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
                    Ok(record) => {
                        report.record_restore(&record);
                        resolved.inputs.restore = Some(record);
                        plan::RestoreGate::Verified
                    }
                    Err(gate) => gate,
                }
            }
        };
        report.restore_checked(&gate);
        if let plan::RestoreGate::Refused(r) = &gate {
            publish(ctx, cluster, EventType::Warning, r.reason, &r.message).await;
        }
        observed.planner.restore = gate;
    }

    // plan
    let plan = {
        let span = step_span("plan", key);
        let _in_plan = span.enter();
        let plan = plan::plan_next_step(&observed.planner);
        span.record("outcome", plan_label(&plan));
        plan
    };
    ctx.metrics.observe_plan(&plan);
    let (memo_key, fingerprint) = &observed.memo_key;
    if matches!(plan, Plan::Converged) && !paused {
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
        report.refused(refusal);
        report.write(ctx).await?;
        return Ok(Outcome::Blocked(refusal.message.clone()));
    }
    report.no_conflict();
    if paused {
        let next = match &plan {
            Plan::Act(step) => Some(step.to_string()),
            _ => None,
        };
        report.paused(next.as_deref());
        report_step(&report, ctx, key).await?;
        return Ok(Outcome::Paused(next));
    }

    // Recorded before the first workload write: from now on this is the etcd
    // this resource manages.
    report.record_identity(&identity);

    // act
    let outcome = match plan {
        Plan::Converged => {
            report.converged();
            Outcome::Converged
        }
        Plan::Wait(why) => {
            report.waiting(&why);
            Outcome::Waiting(why)
        }
        Plan::Hold(why) => {
            report.held(&why);
            Outcome::Held(why)
        }
        Plan::Refuse(refusal) => {
            report.refused(&refusal);
            Outcome::Blocked(refusal.message)
        }
        Plan::Act(step) => {
            // The failure grace is judged again from the live object, not the
            // copy this reconcile started from (a cache may be behind).
            if let Step::RemoveMember {
                member_id,
                cause: plan::RemovalCause::Failed,
                ..
            } = &step
                && let Some(health) = &observed.health
            {
                let live = api
                    .get(&cluster.name_any())
                    .await
                    .map_err(Error::ManagementApi)?;
                let still_failed = status::Report::new(&live)
                    .failed_members(health, ctx.settings.member_failure_grace)
                    .contains(member_id);
                if !still_failed {
                    let why = format!(
                        "member {member_id:x} is not past its failure grace on the live object; not removed"
                    );
                    report.waiting(&why);
                    report.write(ctx).await?;
                    return Ok(Outcome::Waiting(why));
                }
            }
            let started = std::time::Instant::now();
            let span = info_span!(
                "step",
                otel.name = "act",
                step = "act",
                action = step.kind(),
                cluster = key,
                outcome = Empty,
                otel.status_code = Empty
            );
            let result = match &step {
                // Steps of a version change record into the status.
                Step::Version(v) => {
                    let act = version_change::act::execute(v, cluster, &observed, ctx, &mut report);
                    traced(span, act).await
                }
                _ => {
                    let act = act::execute(&step, cluster, &resolved, &observed, &workload, ctx);
                    traced(span, act).await
                }
            };
            ctx.metrics.observe_step(
                step.kind(),
                started.elapsed(),
                result.as_ref().err().map(Error::reason),
            );
            match result {
                Ok(()) => {
                    report.acted(&step, None);
                    publish(
                        ctx,
                        cluster,
                        EventType::Normal,
                        step.kind(),
                        &step.to_string(),
                    )
                    .await;
                    Outcome::Acted(step)
                }
                Err(e) => {
                    report.acted(&step, Some(&e));
                    publish(
                        ctx,
                        cluster,
                        EventType::Warning,
                        &format!("{}Failed", step.kind()),
                        &format!("{step}: {e}"),
                    )
                    .await;
                    report_step(&report, ctx, key).await?;
                    return Err(e);
                }
            }
        }
    };
    report_step(&report, ctx, key).await?;
    Ok(outcome)
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

/// Publishes an event about a cluster; a failure to publish is logged, never fatal.
pub async fn publish(
    ctx: &Context,
    cluster: &EtcdCluster,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: reason.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &cluster.object_ref(&())).await {
        warn!(error = %e, "failed to publish event");
    }
}

/// Current time as a Kubernetes `Time`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_cluster_backs_off_exponentially_until_its_spec_changes_or_it_moves() {
        let held = std::sync::Mutex::default();
        let (base, cap) = (Duration::from_secs(60), Duration::from_secs(300));
        let mut cluster = EtcdCluster::new("c", Default::default());
        cluster.metadata.namespace = Some("ns".into());
        cluster.metadata.generation = Some(1);
        let hold = Outcome::Held("quorum lost".into());
        let delays: Vec<u64> = (0..11)
            .map(|_| {
                held_requeue(&held, &hold, &cluster, base, cap)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        // A spec change (new generation) is looked at again soon.
        cluster.metadata.generation = Some(2);
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(2))
        );
        // Any other outcome forgets the count; the next hold starts again.
        assert_eq!(
            held_requeue(&held, &Outcome::Converged, &cluster, base, cap),
            None
        );
        assert!(held.lock().unwrap().is_empty());
        // Refused or blocked: from the converged poll, doubling to the cap.
        let blocked = Outcome::Blocked("ObjectOwnedElsewhere".into());
        let delays: Vec<u64> = (0..4)
            .map(|_| {
                held_requeue(&held, &blocked, &cluster, base, cap)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        assert_eq!(delays, [60, 120, 240, 300]);
        held_requeue(&held, &Outcome::Converged, &cluster, base, cap);
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn in_flight_requeues_start_at_100ms_and_grow_by_half_up_to_the_progress_poll() {
        let cap = Duration::from_secs(2);
        let delays: Vec<u64> = (0..10)
            .map(|n| in_flight_delay(n, cap).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            vec![100, 150, 225, 337, 506, 759, 1139, 1708, 2000, 2000]
        );
        assert_eq!(in_flight_delay(u32::MAX, cap), cap);
    }

    #[test]
    fn jitter_spreads_polls_within_twenty_percent_and_is_stable() {
        let base = Duration::from_secs(60);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..50 {
            let key = format!("cluster-{i}");
            let d = jitter(base, &key);
            assert!(d >= base * 8 / 10 && d < base * 12 / 10, "{d:?}");
            assert_eq!(d, jitter(base, &key), "stable per cluster");
            seen.insert(d);
        }
        assert!(seen.len() > 10, "spread: {seen:?}");
    }

    #[test]
    fn requeue_is_soon_while_acting_and_slow_when_converged() {
        let settings = ReconcilerSettings::default();
        let cluster = EtcdCluster::new("c", Default::default());
        let converged = requeue_for(&Outcome::Converged, &settings, &cluster);
        let acted = requeue_for(
            &Outcome::Acted(Step::AddLearner { ordinal: 1 }),
            &settings,
            &cluster,
        );
        assert_eq!(acted, Action::requeue(Duration::from_millis(200)));
        assert_eq!(
            requeue_for(&Outcome::Waiting("x".into()), &settings, &cluster),
            Action::requeue(settings.requeue_progress)
        );
        assert_ne!(converged, acted);
        assert_eq!(
            requeue_for(&Outcome::Deleted, &settings, &cluster),
            Action::await_change()
        );
    }
}
