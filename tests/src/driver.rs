//! The test driver: runs the real reconciler against the fake management API
//! and reconciles until the planner has nothing left to do. The fake API has
//! no watch, so the driver is the controller loop: reconcile every cluster,
//! let the workload runtimes catch up, repeat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::connector::{
    ConnectorSettings, WorkloadClientFactory, WorkloadClusterConnector,
};
use etcdfleet_controllers::dialer::EtcdDialer;
use etcdfleet_controllers::etcd::Deadlines;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::etcdcluster::{Context, Outcome, ReconcilerSettings, reconcile_cluster};
use etcdfleet_controllers::metrics::Metrics;
use etcdfleet_controllers::render::RenderProfile;
use etcdfleet_controllers::tenancy::{Fence, TenancyConfig};
use kube::{Api, Client};

/// Settings for tests: short deadlines and a short failure grace.
pub fn fast_settings() -> ReconcilerSettings {
    ReconcilerSettings {
        member_failure_grace: Duration::from_secs(4),
        deletion_timeout: Duration::from_secs(5),
        etcd_deadlines: Deadlines {
            connect: Duration::from_secs(1),
            request: Duration::from_secs(2),
            health: Duration::from_millis(1500),
            reconfigure: Duration::from_secs(10),
            promote: Duration::from_secs(3),
            defragment: Duration::from_secs(30),
            snapshot: Duration::from_secs(60),
        },
        requeue_converged: Duration::from_secs(30),
        requeue_progress: Duration::from_millis(300),
        cert_renew_before: Duration::from_secs(30 * 86400),
        // Tests edit workload objects behind the controller's back and expect
        // the next reconcile to see it: nothing is trusted without a read.
        reread_after: Duration::ZERO,
        seeder_image: crate::runtime::SEEDER_IMAGE.to_string(),
        // No rotation on its own unless a test asks for one.
        ca_rotate_before: None,
        // A file system that grows only at a pod start is not waited for
        // long (the runtime never grows one online in that mode).
        resize_restart_after: Duration::from_secs(2),
        // A claim the runtime leaves unbound is reported soon.
        unbound_after: Duration::from_secs(2),
    }
}

/// One controller instance: its whole in-memory state is its `Context`, so
/// "killing the controller" is dropping this and building a new one.
pub struct TestController {
    pub ctx: Arc<Context>,
    management: Client,
    factory: Arc<dyn WorkloadClientFactory>,
    dialer: Arc<dyn EtcdDialer>,
    settings: ReconcilerSettings,
    /// The platform's fence ([`test_fence`] unless a test sets another).
    fence: Arc<Fence>,
}

impl TestController {
    pub fn new(
        management: Client,
        factory: Arc<dyn WorkloadClientFactory>,
        dialer: Arc<dyn EtcdDialer>,
        settings: ReconcilerSettings,
    ) -> Self {
        let fence = Arc::new(test_fence());
        let ctx = Self::context(
            (&management, &factory, &dialer),
            &settings,
            &fence,
            RenderProfile::default(),
        );
        TestController {
            ctx: Arc::new(ctx),
            management,
            factory,
            dialer,
            settings,
            fence,
        }
    }

    fn context(
        (management, factory, dialer): (
            &Client,
            &Arc<dyn WorkloadClientFactory>,
            &Arc<dyn EtcdDialer>,
        ),
        settings: &ReconcilerSettings,
        fence: &Arc<Fence>,
        profile: RenderProfile,
    ) -> Context {
        let connector = WorkloadClusterConnector::new(
            management.clone(),
            factory.clone(),
            ConnectorSettings {
                backoff_base: Duration::from_millis(100),
                backoff_max: Duration::from_secs(1),
                ..ConnectorSettings::default()
            },
        );
        let mut ctx = Context::new(
            management.clone(),
            connector,
            dialer.clone(),
            settings.clone(),
            Arc::new(Metrics::new()),
        );
        ctx.profile = profile;
        ctx.access.fence = fence.clone();
        ctx
    }

    /// Drops all controller state (client cache, backoff, event cache) and
    /// starts afresh, as a crashed and restarted controller would.
    pub fn restart(&mut self) {
        let profile = self.ctx.profile.clone();
        self.ctx = Arc::new(Self::context(
            (&self.management, &self.factory, &self.dialer),
            &self.settings,
            &self.fence,
            profile,
        ));
    }

    /// A controller of the next release: same state, different rendering.
    pub fn upgrade_to(&mut self, profile: RenderProfile) {
        self.ctx = Arc::new(Self::context(
            (&self.management, &self.factory, &self.dialer),
            &self.settings,
            &self.fence,
            profile,
        ));
    }

    /// The same controller behind another fence (a platform that changed
    /// its configuration and restarted the controller).
    pub fn set_fence(&mut self, fence: Fence) {
        self.fence = Arc::new(fence);
        self.restart();
    }

    /// Reads the cluster and reconciles it once.
    pub async fn reconcile(&self, namespace: &str, name: &str) -> Result<Outcome> {
        let api: Api<EtcdCluster> = Api::namespaced(self.management.clone(), namespace);
        let cluster = api.get(name).await?;
        // On a task of its own, as the controller's runtime runs it: a
        // reconcile polled under a test's own futures (converge loops, a
        // takeover's phases) on the test thread's 2 MiB stack overflowed it
        // in debug builds.
        let ctx = self.ctx.clone();
        let reconcile = tokio::spawn(async move { reconcile_cluster(&cluster, &ctx).await });
        Ok(reconcile.await??)
    }
}

/// The fence of the test world: its tests keep snapshots in directories
/// of their own (`destination.path`) in every namespace, which the platform
/// allows by its configuration, never by default. Lends no workload
/// identity.
pub fn test_fence() -> Fence {
    let config = TenancyConfig {
        local_destination_namespaces: vec!["*".into()],
        ..Default::default()
    };
    Fence::new(&config, None)
}

/// What [`converge`] saw.
#[derive(Debug, Default)]
pub struct ConvergeLog {
    pub steps: Vec<(String, Step)>,
    pub last: Vec<(String, Outcome)>,
    pub errors: Vec<String>,
    /// The last waiting reason printed per cluster.
    pub last_said: std::collections::BTreeMap<String, String>,
}

impl ConvergeLog {
    /// The kinds of the recovery steps taken, in order.
    pub fn recovery_kinds(&self) -> Vec<&'static str> {
        (self.steps.iter())
            .filter_map(|(_, s)| match s {
                Step::Recovery(r) => Some(r.kind()),
                _ => None,
            })
            .collect()
    }

    pub fn steps_of(&self, cluster: &str) -> Vec<&Step> {
        self.steps
            .iter()
            .filter(|(c, _)| c == cluster)
            .map(|(_, s)| s)
            .collect()
    }
}

/// Reconciles `clusters` (namespace, name) round-robin until each one is
/// converged or blocked, calling `between` after every round (the workload
/// runtimes' sync) and `after_step` after every step taken. Fails after
/// `timeout` with the last outcome of every cluster.
pub async fn converge<B, BF, A>(
    controller: &mut TestController,
    clusters: &[(&str, &str)],
    timeout: Duration,
    mut between: B,
    mut after_step: A,
) -> Result<ConvergeLog>
where
    B: FnMut() -> BF,
    BF: std::future::Future<Output = Result<()>>,
    A: FnMut(&str, &Step, &mut TestController) -> Result<()>,
{
    let deadline = Instant::now() + timeout;
    let mut log = ConvergeLog::default();
    loop {
        between().await?;
        let mut done = true;
        log.last.clear();
        for (ns, name) in clusters {
            let key = format!("{ns}/{name}");
            match controller.reconcile(ns, name).await {
                Ok(Outcome::Acted(step)) => {
                    eprintln!("[{} {key}] {step}", k8s_openapi::jiff::Timestamp::now());
                    after_step(&key, &step, controller)?;
                    log.steps.push((key.clone(), step.clone()));
                    log.last.push((key, Outcome::Acted(step)));
                    done = false;
                }
                Ok(outcome @ (Outcome::Waiting(_) | Outcome::Held(_))) => {
                    // Each new reason once: a failing test's log says what
                    // the controller waited for, and when.
                    let said = format!("{outcome:?}");
                    if log.last_said.get(&key) != Some(&said) {
                        eprintln!("[{} {key}] {said}", k8s_openapi::jiff::Timestamp::now());
                        log.last_said.insert(key.clone(), said);
                    }
                    log.last.push((key, outcome));
                    done = false;
                }
                Ok(outcome) => log.last.push((key, outcome)),
                Err(e) => {
                    eprintln!("[{key}] error: {e}");
                    log.errors.push(format!("{key}: {e}"));
                    done = false;
                }
            }
        }
        if done {
            return Ok(log);
        }
        if Instant::now() > deadline {
            bail!(
                "not converged after {timeout:?}; last outcomes: {:#?}; recent errors: {:?}",
                log.last,
                log.errors.iter().rev().take(5).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// Convenience for tests that need no per-step hook.
pub fn no_hook(_: &str, _: &Step, _: &mut TestController) -> Result<()> {
    Ok(())
}

/// The outcome of one cluster in a converge log, or an error.
pub fn outcome_of<'a>(log: &'a ConvergeLog, key: &str) -> Result<&'a Outcome> {
    log.last
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, o)| o)
        .ok_or_else(|| anyhow!("{key} not in the log"))
}
