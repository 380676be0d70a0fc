//! What a backup reconcile runs with: the shared access to the clusters,
//! the clock, the clusters with a backup in flight, and the error.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;

use super::drill::settings::{DrillSettings, DrillSlots};
use crate::access::Access;

/// The time source of the backup reconcilers (tests move it forward).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Wall-clock time.
pub fn system_clock() -> Clock {
    Arc::new(Timestamp::now)
}

/// What the backup reconcilers reach the clusters through: the management
/// client, the workload connector, the etcd dialer and deadlines, metrics,
/// the event recorder and ownership ([`Access`]; the cluster reconciler's
/// context is one).
pub use crate::access::SharedAccess;

/// Everything a backup reconcile needs.
pub struct Context {
    shared: SharedAccess,
    pub clock: Clock,
    /// How restore drills run.
    pub drills: DrillSettings,
    /// The drills running in this process.
    pub(super) drill_slots: DrillSlots,
    /// Clusters (`namespace/name`) with a backup streaming in this process.
    busy_clusters: Mutex<HashSet<String>>,
}

impl Context {
    pub fn new<C: AsRef<Access> + Send + Sync + 'static>(shared: Arc<C>) -> Self {
        Self::with_clock(shared, system_clock())
    }

    pub fn with_clock<C: AsRef<Access> + Send + Sync + 'static>(
        shared: Arc<C>,
        clock: Clock,
    ) -> Self {
        Context {
            shared,
            clock,
            drills: DrillSettings::default(),
            drill_slots: DrillSlots::default(),
            busy_clusters: Mutex::new(HashSet::new()),
        }
    }

    /// The same context, running drills as `drills` says.
    pub fn with_drills(mut self, drills: DrillSettings) -> Self {
        self.drills = drills;
        self
    }

    /// How the clusters are reached.
    pub fn access(&self) -> &Access {
        (*self.shared).as_ref()
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    pub(super) fn is_busy(&self, key: &str) -> bool {
        self.busy_clusters
            .lock()
            .expect("backup lock poisoned")
            .contains(key)
    }

    /// Marks a cluster busy until the guard drops; `None` if it already is.
    pub(super) fn claim(&self, key: &str) -> Option<BusyGuard<'_>> {
        let mut busy = self.busy_clusters.lock().expect("backup lock poisoned");
        busy.insert(key.to_string()).then(|| BusyGuard {
            ctx: self,
            key: key.to_string(),
        })
    }
}

pub(super) struct BusyGuard<'a> {
    ctx: &'a Context,
    key: String,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.ctx.busy_clusters.lock() {
            busy.remove(&self.key);
        }
    }
}

/// Failures of a reconcile itself (a failed backup attempt is not one: it
/// is recorded in the backup's status and retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("management API: {0}")]
    ManagementApi(#[source] kube::Error),
    #[error("restore drill: {0}")]
    Drill(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
