//! What a rollout reconcile runs with: the access shared with the cluster
//! reconciler (management client, events, metrics, which clusters this
//! controller owns), the cluster cache, which rollouts this controller
//! reconciles, and how often it looks again.

use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::EtcdFleetRollout;

use super::observe::ClusterCache;
use crate::access::{Access, SharedAccess};

/// Decides whether this controller reconciles a rollout (its configured
/// label selector, as for its clusters).
pub type RolloutFilter = Arc<dyn Fn(&EtcdFleetRollout) -> bool + Send + Sync>;

/// Tunables of the rollout reconciler.
#[derive(Debug, Clone)]
pub struct RolloutSettings {
    /// How often a rollout is looked at while clusters converge or soak
    /// (clusters' changes do not trigger it: it reads them from the cache).
    pub poll: Duration,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings {
            poll: Duration::from_secs(5),
        }
    }
}

/// Everything a rollout reconcile needs, shared by all of them.
pub struct Context {
    shared: SharedAccess,
    pub cache: ClusterCache,
    pub settings: RolloutSettings,
    owns: Option<RolloutFilter>,
}

impl Context {
    pub fn new<C: AsRef<Access> + Send + Sync + 'static>(
        shared: Arc<C>,
        cache: ClusterCache,
        settings: RolloutSettings,
    ) -> Self {
        Context {
            shared,
            cache,
            settings,
            owns: None,
        }
    }

    /// Restricts the reconciler to the rollouts `owns` accepts.
    pub fn with_filter(mut self, owns: RolloutFilter) -> Self {
        self.owns = Some(owns);
        self
    }

    pub fn access(&self) -> &Access {
        (*self.shared).as_ref()
    }

    /// Whether this controller reconciles the rollout.
    pub fn owns(&self, rollout: &EtcdFleetRollout) -> bool {
        self.owns.as_ref().is_none_or(|owns| owns(rollout))
    }
}

/// Failures of a rollout reconcile (a cluster that fails its gate is not
/// one: it is recorded in the rollout's status).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("management API: {0}")]
    ManagementApi(#[from] kube::Error),
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ManagementApi(_) => "ManagementAPIError",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
