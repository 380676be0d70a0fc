//! `etcdfleet run`: the controller process. Wires the management client, the
//! HTTP endpoints, leader election and one kube-runtime `Controller` per
//! watched scope, and owns the process lifecycle:
//!
//! - every wait (client configuration, reaching the API server, acquiring and
//!   holding the Lease, the first list, the controllers) races the shutdown
//!   signal, so SIGTERM stops the process within `shutdownGraceSeconds` in
//!   every state; a watchdog thread enforces that bound even if a wait forgets
//!   to, and a second SIGTERM/SIGINT exits at once;
//! - readiness and liveness follow what the process actually did (see
//!   `crate::http`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::{EtcdCluster, EtcdFleetRollout};
use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::ControllerConfig;
use crate::connector::{ConnectorSettings, KubeconfigClientFactory, WorkloadClusterConnector};
use crate::etcdcluster::{self, Context, ReconcilerSettings};
use crate::http::{Health, serve_http};
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::rollout;
pub use crate::shutdown::Shutdown;
use crate::shutdown::drain_if_started;

/// How long one attempt to reach the API server may take before it counts as
/// failed (a server that accepts and never answers must not stall start-up).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between attempts to reach the API server.
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Exit code after a second signal (128 + SIGTERM), as a shell reports it.
const EXIT_FORCED: i32 = 143;

/// Where the management cluster's client configuration comes from.
#[derive(Debug, Clone, Default)]
pub struct ClientSource {
    /// A kubeconfig file; `None`: in-cluster or `$KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
}

async fn client_config(source: &ClientSource) -> Result<kube::Config, String> {
    match &source.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string()),
    }
}

/// Installs the SIGTERM/SIGINT handling: the first signal requests shutdown
/// and arms a watchdog that ends the process `grace` later whatever is still
/// running; a second signal exits at once.
fn handle_signals(shutdown: Shutdown, health: Arc<Health>, grace: Duration) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (term, int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                // Without our handlers the default disposition (exit) stays.
                warn!(error = %e, "cannot handle SIGTERM/SIGINT; they will end the process at once");
                return;
            }
        };
        let (mut term, mut int) = (term, int);
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            info!(
                signal = name,
                grace_seconds = grace.as_secs(),
                "shutdown requested; stopping (a second signal exits at once)"
            );
            health.set_stopping();
            shutdown.request();
            arm_watchdog(grace);
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            warn!(signal = name, "second signal: exiting at once");
            std::process::exit(EXIT_FORCED);
        });
    }
    #[cfg(not(unix))]
    {
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            info!("shutdown requested");
            health.set_stopping();
            shutdown.request();
            arm_watchdog(grace);
            let _ = tokio::signal::ctrl_c().await;
            std::process::exit(EXIT_FORCED);
        });
    }
}

/// A plain thread, so that it fires even if the async runtime is wedged.
fn arm_watchdog(grace: Duration) {
    // One second past the grace period the orderly path had its chance.
    let limit = grace + Duration::from_secs(1);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!(
            "etcdfleet: still running {}s after the shutdown request; exiting",
            limit.as_secs()
        );
        std::process::exit(1);
    });
}

/// Lists EtcdClusters once in every watched scope (limit 1) until one round
/// succeeds: proves the API server is reachable, the CRD installed and the
/// RBAC sufficient, and names the server when it is not.
async fn reach_api_server(
    apis: &[Api<EtcdCluster>],
    selector: Option<&str>,
    server: &str,
    shutdown: &Shutdown,
) -> bool {
    let mut params = ListParams::default().limit(1);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut backoff = Duration::from_millis(500);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let round = async {
            for api in apis {
                match tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&params)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                        return Err(format!(
                            "the EtcdCluster CRD is not installed (404 {}); apply config/crd first",
                            e.message
                        ));
                    }
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => {
                        return Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs()));
                    }
                }
            }
            Ok(())
        };
        match shutdown.race(round).await {
            None => return false,
            Some(Ok(())) => {
                info!(api_server = %server, "reached the management API server");
                return true;
            }
            Some(Err(e)) => {
                error!(
                    api_server = %server,
                    attempt,
                    retry_in_ms = backoff.as_millis() as u64,
                    "cannot reach the management API server {server}: {e}"
                );
            }
        }
        if shutdown.race(tokio::time::sleep(backoff)).await.is_none() {
            return false;
        }
        backoff = (backoff * 2).min(PROBE_BACKOFF_MAX);
    }
}

/// Runs the controller until shutdown; the process's exit code.
pub async fn run(config: ControllerConfig, source: ClientSource) -> ExitCode {
    match run_until_stopped(config, source).await {
        Ok(code) | Err(code) => code,
    }
}

/// The phases of a run; `Err` is an exit before the controller ran.
async fn run_until_stopped(
    config: ControllerConfig,
    source: ClientSource,
) -> Result<ExitCode, ExitCode> {
    // Every TLS client of the process (management, workload, etcd) uses ring;
    // an error only means a provider was installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let shutdown = Shutdown::default();
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let health = Arc::new(if config.leader_election.enabled {
        Health::with_leader_election(config.leader_election.lease_duration())
    } else {
        Health::default()
    });
    handle_signals(shutdown.clone(), health.clone(), grace);
    info!(
        scope = %config.describe_scope(),
        leader_election = config.leader_election.enabled,
        max_concurrent_reconciles = config.max_concurrent_reconciles,
        "starting etcdfleet controller"
    );

    // Endpoints first: a replica that cannot reach the API server still
    // answers, alive and not ready.
    let metrics = Arc::new(Metrics::new());
    let listener = match tokio::net::TcpListener::bind(&config.metrics_address).await {
        Ok(l) => l,
        Err(e) => {
            error!(address = %config.metrics_address, error = %e, "cannot listen");
            return Err(ExitCode::from(1));
        }
    };
    tokio::spawn(serve_http(listener, metrics.clone(), health.clone()));
    tokio::spawn(return_free_memory());

    let (client, server) = management_client(&source, &shutdown).await?;
    let apis: Vec<Api<EtcdCluster>> = if config.namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        config
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    if !reach_api_server(&apis, config.label_selector.as_deref(), &server, &shutdown).await {
        return Err(stopped("before the API server was reached"));
    }
    // That was the first list of this controller's EtcdClusters, in every
    // watched scope, with its identity: the API, the CRD and the RBAC work.
    health.set_listed();
    info!("first list of EtcdClusters succeeded; ready");

    if config.sharding.enabled {
        let world = Running {
            config: &config,
            client,
            server,
            metrics,
            health,
            shutdown,
        };
        return run_sharded(world, apis).await;
    }
    let elector = lead(&config, &client, &server, &health, &shutdown).await?;
    let ctx = reconciler_context(&config, client, metrics, &shutdown, None);
    let (loops, _) = start_controllers(apis, &config, ctx, &server, &shutdown, true);
    info!("controller running");
    let electors: Vec<&LeaderElector> = elector.as_deref().into_iter().collect();
    Ok(wait_and_drain(loops, &shutdown, &health, grace, &electors).await)
}

/// What a run has once the API server answered.
struct Running<'a> {
    config: &'a ControllerConfig,
    client: Client,
    server: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: Shutdown,
}

/// Sharded mode (docs/sharding.md): this replica holds its shard's Lease
/// before it reconciles anything and exits when it loses it; it reconciles
/// the clusters labelled with its shard, hands over those that hash to
/// another live shard, and while it holds the group's leader Lease labels
/// the clusters with no live shard and runs the fleet rollouts.
async fn run_sharded(run: Running<'_>, apis: Vec<Api<EtcdCluster>>) -> Result<ExitCode, ExitCode> {
    let config = run.config;
    let me = config.sharding.shard();
    let lease_config = config.sharding.lease(&config.leader_election);
    let lease = Arc::new(LeaderElector::new(
        run.client.clone(),
        &lease_config,
        me.clone(),
    ));
    if run.shutdown.race(lease.acquire()).await.is_none() {
        return Err(stopped("while waiting for the shard Lease"));
    }
    hold_or_exit(lease.clone(), &run.health, &run.shutdown, "shard");
    let shard = Arc::new(crate::shard::run::Shard::new(
        run.client.clone(),
        &me,
        &config.sharding.lease_prefix,
        &config.leader_election.lease_namespace,
        run.metrics.clone(),
    ));
    let ctx = reconciler_context(
        config,
        run.client.clone(),
        run.metrics.clone(),
        &run.shutdown,
        Some(&shard),
    );
    let mut own = config.clone();
    let only_mine = format!("{}={me}", crate::shard::SHARD_LABEL);
    own.label_selector = Some(match &config.label_selector {
        Some(s) => format!("{s},{only_mine}"),
        None => only_mine,
    });
    let (loops, own_stores) = start_controllers(
        apis.clone(),
        &own,
        ctx.clone(),
        &run.server,
        &run.shutdown,
        false,
    );
    let observed = run.health.clone();
    let leader = Arc::new(
        LeaderElector::new(run.client.clone(), &config.leader_election, me.clone())
            .with_observer(Arc::new(move |answered| observed.observe_lease(answered))),
    );
    let group = Arc::new(std::sync::Mutex::new(Vec::new()));
    tokio::spawn(lead_group(
        leader.clone(),
        apis,
        group.clone(),
        config.clone(),
        ctx.clone(),
        run.server.clone(),
        run.health.clone(),
        run.shutdown.clone(),
    ));
    tokio::spawn(shard_rounds(shard, own_stores, group, run.shutdown.clone()));
    info!(shard = %me, "controller running, sharded");
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    Ok(wait_and_drain(loops, &run.shutdown, &run.health, grace, &[&lease, &leader]).await)
}

/// The shard rounds ([`crate::shard::run::Shard::round`]) until shutdown.
async fn shard_rounds(
    shard: Arc<crate::shard::run::Shard>,
    own: Vec<Store<EtcdCluster>>,
    group: Arc<std::sync::Mutex<Vec<Store<EtcdCluster>>>>,
    shutdown: Shutdown,
) {
    let rounds = async {
        loop {
            tokio::time::sleep(crate::shard::run::ROUND).await;
            let group: Vec<Store<EtcdCluster>> =
                group.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let group = (!group.is_empty()).then_some(group.as_slice());
            if let Err(e) = shard.round(&own, group).await {
                warn!(error = %e, "shard round failed; trying again");
            }
        }
    };
    shutdown.race(rounds).await;
}

/// The group's leader (sharded mode): waits for the leader Lease, then
/// watches every cluster of the controller's scope for the sharder's
/// duty (published in `group`) and runs the fleet rollouts over them;
/// exits when it loses the Lease.
#[allow(clippy::too_many_arguments)]
async fn lead_group(
    leader: Arc<LeaderElector>,
    apis: Vec<Api<EtcdCluster>>,
    group: Arc<std::sync::Mutex<Vec<Store<EtcdCluster>>>>,
    config: ControllerConfig,
    ctx: Arc<Context>,
    server: String,
    health: Arc<Health>,
    shutdown: Shutdown,
) {
    if shutdown.race(leader.acquire()).await.is_none() {
        return;
    }
    health.set_leader(true);
    hold_or_exit(leader, &health, &shutdown, "leader");
    let mut watch_config = watcher::Config::default();
    if let Some(selector) = &config.label_selector {
        watch_config = watch_config.labels(selector);
    }
    let mut stores = Vec::new();
    for api in apis {
        let (store, writer) = kube::runtime::reflector::store();
        let stream = kube::runtime::reflector(writer, watcher(api, watch_config.clone()))
            .for_each(|_| futures::future::ready(()));
        let shutdown = shutdown.clone();
        tokio::spawn(async move { shutdown.race(stream).await });
        stores.push(store);
    }
    *group.lock().unwrap_or_else(|e| e.into_inner()) = stores.clone();
    run_rollouts(stores, config, ctx, server, shutdown).await;
}

/// Holds a Lease in the background; when it is lost, stops the process
/// before another replica may take over (see [`lead`]).
fn hold_or_exit(
    elector: Arc<LeaderElector>,
    health: &Arc<Health>,
    shutdown: &Shutdown,
    what: &'static str,
) {
    let (health, shutdown) = (health.clone(), shutdown.clone());
    let span = info_span!("lease", lease = %elector.lease_name());
    tokio::spawn(
        async move {
            let why = elector.hold().await;
            error!(error = %why, role = what, "lost the Lease; stopping the controller");
            health.set_leader(false);
            health.set_stopping();
            shutdown.request();
            // Never reconcile after another replica may have taken over:
            // leave before the Lease can expire for the others, whatever
            // is still in flight.
            tokio::time::sleep(elector.exit_grace()).await;
            std::process::exit(1);
        }
        .instrument(span),
    );
}

/// The management cluster's client and its API server URL. Client
/// configuration may run an exec credential plugin: it races shutdown too.
async fn management_client(
    source: &ClientSource,
    shutdown: &Shutdown,
) -> Result<(Client, String), ExitCode> {
    let kube_config = match shutdown.race(client_config(source)).await {
        None => return Err(stopped("before the client configuration was loaded")),
        Some(Ok(c)) => c,
        Some(Err(e)) => {
            error!(error = %e, "cannot load the management cluster's client configuration");
            return Err(ExitCode::from(1));
        }
    };
    let server = kube_config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    match Client::try_from(kube_config) {
        Ok(c) => Ok((c, server)),
        Err(e) => {
            error!(api_server = %server, error = %e, "cannot build the management cluster client");
            Err(ExitCode::from(1))
        }
    }
}

/// Leader election: a standby waits here (ready while it reads the Lease);
/// the leader holds the Lease in the background and exits when it loses it.
async fn lead(
    config: &ControllerConfig,
    client: &Client,
    server: &str,
    health: &Arc<Health>,
    shutdown: &Shutdown,
) -> Result<Option<Arc<LeaderElector>>, ExitCode> {
    let elector = config.leader_election.enabled.then(|| {
        let observed = health.clone();
        Arc::new(
            LeaderElector::new(
                client.clone(),
                &config.leader_election,
                LeaderElector::default_identity(),
            )
            .with_observer(Arc::new(move |answered| observed.observe_lease(answered))),
        )
    });
    if let Some(elector) = &elector {
        let span =
            info_span!("leader_election", api_server = %server, lease = %elector.lease_name());
        if shutdown
            .race(elector.acquire().instrument(span.clone()))
            .await
            .is_none()
        {
            return Err(stopped("while waiting for the leader Lease"));
        }
        health.set_leader(true);
        hold_or_exit(elector.clone(), health, shutdown, "leader");
    }
    Ok(elector)
}

/// The reconcilers' context, with idle clients dropped every minute.
fn reconciler_context(
    config: &ControllerConfig,
    client: Client,
    metrics: Arc<Metrics>,
    shutdown: &Shutdown,
    shard: Option<&Arc<crate::shard::run::Shard>>,
) -> Arc<Context> {
    let connector = WorkloadClusterConnector::new(
        client.clone(),
        Arc::new(KubeconfigClientFactory::default()),
        ConnectorSettings::default(),
    );
    let owner = config.clone();
    let mut ctx = Context::new(
        client.clone(),
        connector,
        config.dialer.build(),
        ReconcilerSettings::from_config(config),
        metrics.clone(),
    )
    .with_owner_filter(Arc::new(move |c: &EtcdCluster| owner.owns(c)))
    .with_shutdown(shutdown.clone());
    // One controller for every namespace shares its slots among them.
    let share = config
        .namespaces
        .is_empty()
        .then(|| usize::from(config.max_reconciles_per_namespace));
    ctx.access.shares = Arc::new(crate::slots::Shares::new(share));
    ctx.access.fence = Arc::new(crate::tenancy::Fence::new(
        &config.tenancy,
        crate::tenancy::WorkloadIdentity::from_env(),
    ));
    if let Some(shard) = shard {
        // Ours: in scope and labelled with this shard; the scope alone is
        // what the rollouts plan over.
        let (scope, me) = (config.clone(), shard.me.clone());
        ctx.access.owner_filter = Some(Arc::new(move |c: &EtcdCluster| {
            scope.owns(c) && c.labels().get(crate::shard::SHARD_LABEL) == Some(&me)
        }));
        let scope = config.clone();
        ctx.access.scope_filter = Some(Arc::new(move |c: &EtcdCluster| scope.owns(c)));
        ctx.access.shard_gate = Some(shard.gate.clone());
    }
    let ctx = Arc::new(ctx);
    tokio::spawn({
        let ctx = ctx.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let evicted = ctx.connector.evict_idle();
                if evicted > 0 {
                    info!(evicted, "dropped idle workload cluster clients");
                }
                let evicted = ctx.etcd_clients.evict_idle();
                if evicted > 0 {
                    info!(evicted, "dropped idle etcd clients");
                }
            }
        }
    });
    ctx
}

/// One EtcdCluster controller per watched scope, and the backup controllers.
/// Returns the loops and the cluster controllers' caches; `rollouts`: the
/// rollout controller runs over those caches (unsharded).
fn start_controllers(
    apis: Vec<Api<EtcdCluster>>,
    config: &ControllerConfig,
    ctx: Arc<Context>,
    server: &str,
    shutdown: &Shutdown,
    rollouts: bool,
) -> (tokio::task::JoinSet<()>, Vec<Store<EtcdCluster>>) {
    let mut watch_config = watcher::Config::default();
    if let Some(selector) = &config.label_selector {
        watch_config = watch_config.labels(selector);
    }
    let controller_config = controller::Config::default()
        .concurrency(config.max_concurrent_reconciles)
        .debounce(Duration::from_millis(config.debounce_milliseconds));
    let mut loops = tokio::task::JoinSet::new();
    let mut stores = Vec::new();
    for api in apis {
        let controller = Controller::new(api, watch_config.clone())
            .with_config(controller_config.clone())
            .graceful_shutdown_on(shutdown.wait());
        let store = controller.store();
        stores.push(store.clone());
        let server = server.to_string();
        let run = controller
            .run(
                etcdcluster::reconcile,
                etcdcluster::error_policy,
                ctx.clone(),
            )
            .for_each(move |result| {
                log_controller_error(result.err(), &server);
                futures::future::ready(())
            });
        loops.spawn(drain_if_started(run, store, shutdown.wait()));
    }
    if rollouts {
        loops.spawn(run_rollouts(
            stores.clone(),
            config.clone(),
            ctx.clone(),
            server.to_string(),
            shutdown.clone(),
        ));
    }
    // Backups and schedules share the cluster reconciler's context (clients,
    // dialer, metrics) and end on the same shutdown.
    {
        let (ctx, namespaces, shutdown) =
            (ctx.clone(), config.namespaces.clone(), shutdown.clone());
        let drills = crate::backup::drill::DrillSettings {
            seeder_image: config.seeder_image.clone(),
            max_concurrent: usize::from(config.max_concurrent_drills),
            timeout: std::time::Duration::from_secs(config.drill_timeout_seconds),
            ..Default::default()
        };
        loops.spawn(async move {
            let stop = move || {
                let shutdown = shutdown.clone();
                async move { shutdown.wait().await }
            };
            crate::backup::run(ctx, &namespaces, drills, stop).await;
        });
    }
    (loops, stores)
}

/// The fleet rollout controller: every EtcdFleetRollout this controller's
/// label selector takes, planned over the cluster controllers' own caches
/// (`stores`), so a rollout over any number of clusters adds no list or
/// watch of clusters. It starts once those caches hold their first list:
/// an empty cache would look like a fleet without clusters.
async fn run_rollouts(
    stores: Vec<Store<EtcdCluster>>,
    config: ControllerConfig,
    ctx: Arc<Context>,
    server: String,
    shutdown: Shutdown,
) {
    let ready = async {
        for store in &stores {
            cache_ready(store).await.then_some(())?;
        }
        Some(())
    };
    // Both may be ready at once: a shutdown asked for while the caches
    // filled starts no controller that must then be drained.
    if shutdown.race(ready).await.flatten().is_none() || shutdown.is_requested() {
        return;
    }
    info!("rollout controller running over the EtcdCluster caches");
    let client = ctx.management.clone();
    let cache: rollout::ClusterCache =
        Arc::new(move || stores.iter().flat_map(|s| s.state()).collect());
    let owner = config.clone();
    let rollouts = Arc::new(
        rollout::Context::new(ctx, cache, rollout::RolloutSettings::default())
            .with_filter(Arc::new(move |r: &EtcdFleetRollout| owner.owns_rollout(r))),
    );
    let mut watch_config = watcher::Config::default();
    if let Some(selector) = &config.label_selector {
        watch_config = watch_config.labels(selector);
    }
    let controller = Controller::new(Api::<EtcdFleetRollout>::all(client), watch_config)
        .graceful_shutdown_on(shutdown.wait());
    let store = controller.store();
    let run = controller
        .run(rollout::reconcile, rollout::error_policy, rollouts)
        .for_each(move |result| {
            if let Err(e) = result {
                match e {
                    controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {}
                    controller::Error::QueueError(e) => {
                        warn!(api_server = %server, error = %e, "cannot list or watch EtcdFleetRollouts; retrying");
                    }
                    e => warn!(error = %e, "rollout controller error"),
                }
            }
            futures::future::ready(())
        });
    drain_if_started(run, store, shutdown.wait()).await;
}

/// Whether a cluster controller's cache got its first list (false: its
/// writer is gone). `Store::wait_until_ready` wakes only the last task that
/// polled it (kube-runtime's `DelayedInit` is a oneshot channel with one
/// waker), and the controller's own applier waits on the same store, so a
/// second waiter would sleep forever: it is polled again every 200 ms.
async fn cache_ready(store: &Store<EtcdCluster>) -> bool {
    loop {
        let attempt = tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready());
        if let Ok(outcome) = attempt.await {
            return outcome.is_ok();
        }
    }
}

/// Waits for shutdown (or a loop that died), lets in-flight reconciles
/// finish within the grace period, and hands the Lease over.
async fn wait_and_drain(
    mut loops: tokio::task::JoinSet<()>,
    shutdown: &Shutdown,
    health: &Health,
    grace: Duration,
    electors: &[&LeaderElector],
) -> ExitCode {
    // The loops end only on shutdown; one ending earlier is a dead controller.
    let mut died = false;
    tokio::select! {
        ended = loops.join_next() => {
            // A loop that ends because shutdown was just asked for (both
            // branches ready at once) has not died.
            if !shutdown.is_requested() {
                let why = match ended {
                    Some(Err(e)) if e.is_panic() => "a controller loop panicked".to_string(),
                    _ => "a controller loop stopped on its own".to_string(),
                };
                error!(reason = %why, "controller loop died; exiting");
                health.set_dead(why);
                shutdown.request();
                died = true;
            }
        }
        () = shutdown.wait() => {}
    }
    // Graceful: the controllers stop taking work and finish in-flight
    // reconciles, for at most the grace period.
    let drain = async { while loops.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        warn!(
            grace_seconds = grace.as_secs(),
            "in-flight reconciles did not finish within the grace period; exiting anyway"
        );
        loops.abort_all();
    }
    for elector in electors.iter().filter(|_| !died) {
        // Hand over at once rather than after the lease duration (a
        // Lease this replica does not hold is left alone).
        if tokio::time::timeout(Duration::from_secs(2), elector.release())
            .await
            .is_err()
        {
            warn!(lease = %elector.lease_name(), "could not release the Lease in time");
        }
    }
    info!("stopped");
    if died {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn stopped(when: &str) -> ExitCode {
    info!("stopped {when}");
    ExitCode::SUCCESS
}

fn log_controller_error(
    error: Option<controller::Error<etcdcluster::Error, watcher::Error>>,
    server: &str,
) {
    match error {
        None => {}
        // error_policy logged it, with the cluster and the reason.
        Some(controller::Error::ReconcilerFailed(..)) => {}
        // A trigger for a cluster deleted meanwhile: expected.
        Some(controller::Error::ObjectNotFound(_)) => {}
        Some(controller::Error::QueueError(e)) => {
            warn!(api_server = %server, error = %e, "cannot list or watch EtcdClusters on the management API server {server}; retrying");
        }
        Some(e) => warn!(error = %e, "controller error"),
    }
}

/// Hands freed heap pages back to the operating system every 30 s.
/// A fleet's connections close and reopen all the time (idle workload API
/// connections after 10 s, tunnels of evicted etcd clients), and glibc keeps
/// the pages they freed inside its arenas unless asked: the process would
/// hold the most it ever used rather than what it uses. `malloc_trim`
/// releases free pages anywhere in the heap, not only at its end; a pass
/// over a few hundred MiB takes milliseconds.
async fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        // SAFETY: malloc_trim only reads and adjusts glibc's own heap
        // bookkeeping under its locks; it takes no pointers from us.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
