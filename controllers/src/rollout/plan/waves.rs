//! Waves as the records say they are: a wave is done once each of its
//! clusters is done or skipped and the soak after the last of them
//! converged has passed; the current wave is the first that is not done.
//! Everything here is computed from the records (their states and
//! `convergedAt`), so a soak survives a controller restart.

use std::time::Duration;

use etcdfleet_api::ClusterRolloutStatus;
use etcdfleet_api::rollout::cluster_state::PENDING;
use etcdfleet_api::rollout::wave_state;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::records::finished;

/// One wave, as computed from its records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wave {
    pub wave: i32,
    pub clusters: usize,
    pub finished: usize,
    /// `wave_state::*`.
    pub state: &'static str,
    /// While soaking: when it ends.
    pub soak_until: Option<Timestamp>,
}

/// Every wave from 1 to the highest one a record is in.
pub fn waves(records: &[ClusterRolloutStatus], soak: Duration, now: Timestamp) -> Vec<Wave> {
    let last = records.iter().map(|r| r.wave).max().unwrap_or(0);
    (1..=last)
        .map(|wave| {
            let of: Vec<&ClusterRolloutStatus> =
                records.iter().filter(|r| r.wave == wave).collect();
            let done = of.iter().filter(|r| finished(r)).count();
            // The soak counts from the last convergence of a cluster this
            // rollout changed; a wave it changed nothing in has no soak.
            let soak_until = of
                .iter()
                .filter(|r| r.changed_at.is_some())
                .filter_map(|r| r.converged_at.as_ref())
                .map(|t| t.0)
                .max()
                .and_then(|t| t.checked_add(SignedDuration::try_from(soak).ok()?).ok());
            let state = if done == of.len() {
                match soak_until {
                    Some(until) if until > now => wave_state::SOAKING,
                    _ => wave_state::DONE,
                }
            } else if of.iter().all(|r| r.state == PENDING) {
                wave_state::PENDING
            } else {
                wave_state::IN_PROGRESS
            };
            Wave {
                wave,
                clusters: of.len(),
                finished: done,
                state,
                soak_until: soak_until.filter(|_| state == wave_state::SOAKING),
            }
        })
        .collect()
}

/// The first wave that is not done.
pub fn current(waves: &[Wave]) -> Option<&Wave> {
    waves.iter().find(|w| w.state != wave_state::DONE)
}
