//! Step 5 of the bench: a rollout over the whole stand-in fleet, for
//! [`ROLLOUT_WAVES`] waves, then aborted; what it cost the controller.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use etcdfleet_api::rollout::{FleetSelector, RolloutStrategy};
use etcdfleet_api::{EtcdFleetRollout, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus};
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::scenario::{NS, cluster};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::management::Management;
use super::measure::{histogram_max, sample};

/// Clusters per wave after the canary of the bench's rollout.
const ROLLOUT_WAVE: i32 = 10;
/// Waves the bench's rollout runs before it is aborted.
pub const ROLLOUT_WAVES: usize = 3;

/// What the bench's rollout cost the controller.
pub struct RolloutCost {
    waves: usize,
    clusters_changed: usize,
    took: Duration,
    plan_mean_ms: f64,
    plan_max_ms: f64,
    plans: u64,
    /// B's management API calls about the rollout: GETs and status writes
    /// of the rollout, writes of clusters under its field manager.
    rollout_calls: usize,
    cluster_writes: usize,
    /// Lists or watches of EtcdClusters opened during the rollout.
    cluster_lists_or_watches: usize,
}

impl RolloutCost {
    pub fn summary(&self) -> String {
        format!(
            " rollout_plan_ms={:.2} rollout_calls_per_wave={:.1}",
            self.plan_mean_ms,
            self.rollout_calls as f64 / self.waves as f64
        )
    }
}

impl std::fmt::Display for RolloutCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fleet_rollout waves={} clusters_changed={} took_s={:.1} plans={} plan_mean_ms={:.2} plan_max_ms<={:.2} calls={} calls_per_wave={:.1} cluster_writes={} cluster_lists_or_watches={}",
            self.waves,
            self.clusters_changed,
            self.took.as_secs_f64(),
            self.plans,
            self.plan_mean_ms,
            self.plan_max_ms,
            self.rollout_calls,
            self.rollout_calls as f64 / self.waves as f64,
            self.cluster_writes,
            self.cluster_lists_or_watches
        )
    }
}

async fn rollout_status(api: &Api<EtcdFleetRollout>) -> Result<EtcdFleetRolloutStatus> {
    Ok(api.get("bench").await?.status.unwrap_or_default())
}

/// Step 5: a rollout over the fleet, for [`ROLLOUT_WAVES`] waves, then
/// aborted; what it cost controller B.
pub async fn rollout_cost(
    fleet: &Fleet,
    management: &Management,
    controller: &ControllerProcess,
    tokens: &BTreeSet<String>,
    management_token: &str,
) -> Result<RolloutCost> {
    let api: Api<EtcdFleetRollout> = Api::all(fleet.management_direct());
    let mut rollout = EtcdFleetRollout::new(
        "bench",
        EtcdFleetRolloutSpec {
            selector: FleetSelector {
                namespaces: vec![NS.to_string()],
                ..Default::default()
            },
            version: Some("3.5.21".into()),
            strategy: RolloutStrategy {
                canary: Some(1),
                wave_size: Some(ROLLOUT_WAVE),
                max_in_flight: Some(ROLLOUT_WAVE),
                soak: Some("1s".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    rollout.metadata.labels = cluster("x", "x", 1, "3.5.1").metadata.labels;
    let mark = management.mark(fleet)?;
    let started = Instant::now();
    api.create(&PostParams::default(), &rollout).await?;
    let deadline = started
        + Duration::from_secs(
            std::env::var("ETCDFLEET_BENCH_ROLLOUT_TIMEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        );
    let status = loop {
        let status = rollout_status(&api).await?;
        let done = status
            .waves
            .iter()
            .take(ROLLOUT_WAVES)
            .all(|w| w.state == "Done");
        if status.waves.len() >= ROLLOUT_WAVES && done {
            break status;
        }
        if Instant::now() > deadline {
            let log = controller.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            bail!(
                "the bench's rollout did not finish {ROLLOUT_WAVES} waves: {:?} {:?}; controller log (last lines first):\n{}",
                status.phase,
                status.waves,
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let took = started.elapsed();
    let patch = serde_json::json!({ "spec": { "abort": true } });
    api.patch("bench", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let ops: Vec<_> = management
        .calls_since(fleet, mark, tokens, management_token)?
        .into_iter()
        .filter(|op| op.cluster == MANAGEMENT)
        .collect();
    let cluster_writes = ops
        .iter()
        .filter(|o| o.resource == "etcdclusters" && o.is_write())
        .filter(|o| {
            o.query_param("fieldManager")
                .is_some_and(|m| m.starts_with(etcdfleet_api::rollout::FIELD_MANAGER_PREFIX))
        })
        .count();
    let rollout_calls = ops
        .iter()
        .filter(|o| o.resource == "etcdfleetrollouts")
        .count()
        + cluster_writes;
    let cluster_lists_or_watches = ops
        .iter()
        .filter(|o| o.resource == "etcdclusters" && (o.verb == "list" || o.verb == "watch"))
        .count();
    let metric = "etcdfleet_rollout_plan_duration_seconds";
    let plans = sample(controller, &format!("{metric}_count")).unwrap_or(0.0);
    let sum = sample(controller, &format!("{metric}_sum")).unwrap_or(0.0);
    Ok(RolloutCost {
        waves: ROLLOUT_WAVES,
        clusters_changed: status
            .clusters
            .iter()
            .filter(|c| c.changed_at.is_some())
            .count(),
        took,
        plan_mean_ms: if plans > 0.0 {
            sum / plans * 1000.0
        } else {
            0.0
        },
        plan_max_ms: histogram_max(controller, metric).unwrap_or(f64::NAN) * 1000.0,
        plans: plans as u64,
        rollout_calls,
        cluster_writes,
        cluster_lists_or_watches,
    })
}
