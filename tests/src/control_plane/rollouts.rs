//! Building blocks of the `real_rollout` suite: the rollout reconciler as
//! `etcdfleet run` builds it (planned over a reflector of the EtcdClusters,
//! the controller's own cache, with the controller's ServiceAccount), a
//! loop that drives it and the cluster reconciler together, and the audit
//! log's count of what the rollout wrote.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use etcdfleet_api::rollout::field_manager;
use etcdfleet_api::{EtcdCluster, EtcdFleetRollout, EtcdFleetRolloutStatus};
use etcdfleet_controllers::access::Access;
use etcdfleet_controllers::rollout::{self, ClusterCache, Reconciled, RolloutSettings};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use super::KubeWorld;
use super::scenario::{NS, STAGE_LABEL};
use crate::driver::TestController;

/// The user the in-process controller acts as (its ServiceAccount).
pub const CONTROLLER_USER: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-controller";

/// An EtcdFleetRollout of every cluster in [`NS`] to `version`, with
/// `strategy` (YAML lines under `strategy:`, indented four spaces) and
/// `extra` spec lines (indented two spaces), as a platform team writes it.
pub fn rollout_yaml(name: &str, version: &str, strategy: &str, extra: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdFleetRollout
metadata:
  name: {name}
  labels:
    {STAGE_LABEL}: dev
spec:
  selector:
    namespaces: [{NS}]
  version: {version}
  strategy:
{strategy}
{extra}"
    )
}

/// The rollout reconciler of one controller process: its reflector of the
/// EtcdClusters in [`NS`] and its context. [`RolloutDriver::restart`]
/// drops both, as a controller that dies and starts again does.
pub struct RolloutDriver {
    ctx: Arc<rollout::Context>,
    reflector: tokio::task::JoinHandle<()>,
}

impl RolloutDriver {
    /// Starts the reflector over `ctl`'s client and waits for its first list.
    pub async fn start(ctl: &TestController) -> Result<RolloutDriver> {
        let access: &Access = ctl.ctx.as_ref().as_ref();
        let (reader, writer) = reflector::store::<EtcdCluster>();
        let api: Api<EtcdCluster> = Api::namespaced(access.management.clone(), NS);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .applied_objects();
        let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
        tokio::time::timeout(Duration::from_secs(30), reader.wait_until_ready()).await??;
        let cache: ClusterCache = Arc::new(move || reader.state());
        let settings = RolloutSettings {
            poll: Duration::from_millis(500),
        };
        Ok(RolloutDriver {
            ctx: Arc::new(rollout::Context::new(ctl.ctx.clone(), cache, settings)),
            reflector: task,
        })
    }

    /// A new controller: a new cache and context (`ctl` restarted first).
    pub async fn restart(&mut self, ctl: &TestController) -> Result<()> {
        self.reflector.abort();
        *self = RolloutDriver::start(ctl).await?;
        Ok(())
    }

    pub async fn reconcile(&self, name: &str) -> Result<Reconciled> {
        Ok(rollout::reconcile_rollout(name, &self.ctx).await?)
    }
}

impl Drop for RolloutDriver {
    fn drop(&mut self) {
        self.reflector.abort();
    }
}

pub async fn rollout_of(world: &KubeWorld, name: &str) -> Result<EtcdFleetRollout> {
    let api: Api<EtcdFleetRollout> = Api::all(world.management.admin_client().await?);
    Ok(api.get(name).await?)
}

/// One line of progress: phase, done/total, wave, each cluster's state.
pub fn describe(status: &EtcdFleetRolloutStatus) -> String {
    let clusters: Vec<String> = status
        .clusters
        .iter()
        .map(|c| format!("{}:w{}:{}", c.name, c.wave, c.state))
        .collect();
    format!(
        "{} {} wave {} [{}]",
        status.phase.as_deref().unwrap_or("-"),
        status.progress.as_deref().unwrap_or("-"),
        status.current_wave.as_deref().unwrap_or("-"),
        clusters.join(" ")
    )
}

/// Reconciles the rollout once and each of `clusters` (in [`NS`]) once,
/// round after round, until the rollout's status satisfies `done`; returns
/// that status. Fails after `timeout` with the last status.
pub async fn drive_until(
    world: &KubeWorld,
    ctl: &TestController,
    driver: &RolloutDriver,
    rollout: &str,
    clusters: &[&str],
    timeout: Duration,
    done: impl Fn(&EtcdFleetRolloutStatus) -> bool,
) -> Result<EtcdFleetRolloutStatus> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        if let Reconciled::Retry(why) = driver.reconcile(rollout).await? {
            eprintln!("[rollout {rollout}] retry: {why}");
        }
        for name in clusters {
            match ctl.reconcile(NS, name).await {
                Ok(etcdfleet_controllers::etcdcluster::Outcome::Acted(step)) => {
                    eprintln!("[{NS}/{name}] {step}");
                }
                Ok(_) => {}
                Err(e) => eprintln!("[{NS}/{name}] error: {e}"),
            }
        }
        let status = rollout_of(world, rollout).await?.status.unwrap_or_default();
        let line = describe(&status);
        if line != last {
            eprintln!("[rollout {rollout}] {line}");
            last = line;
        }
        if done(&status) {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("rollout {rollout} not there after {timeout:?}: {status:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Successful writes of EtcdClusters under the rollout's field manager, by
/// cluster name, from the management API server's audit log.
pub fn rollout_writes(world: &KubeWorld, rollout: &str) -> Result<BTreeMap<String, usize>> {
    let manager = format!("fieldManager={}", field_manager(rollout));
    let mut out = BTreeMap::new();
    for event in world.management.audit()?.by(CONTROLLER_USER) {
        let Some(object) = &event.object_ref else {
            continue;
        };
        let written = event.stage == "ResponseComplete"
            && event.is_write()
            && event.code() < 300
            && object.resource == "etcdclusters"
            && object.subresource.is_empty()
            && event.request_uri.contains(&manager);
        if written {
            *out.entry(object.name.clone()).or_default() += 1;
        }
    }
    Ok(out)
}
