//! Stop work on a cluster before it moves. Every reconcile about a cluster
//! (the cluster's own, its backups', its schedules') enters the gate by the
//! cluster's key ([`super::assign::cluster_key`]) and holds a [`Pass`] until
//! it returns. Before this replica hands a cluster to another shard it
//! closes the cluster's gate: no new reconcile enters, and
//! [`Gate::close`] returns once every reconcile inside has left. Only then
//! is the move written; the new owner's watch sees the cluster only after.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    inside: BTreeMap<String, usize>,
    closed: BTreeSet<String>,
}

/// The gate of one replica. See the module docs.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<State>,
    left: Notify,
}

/// A reconcile inside the gate; leaves on drop.
#[derive(Debug)]
pub struct Pass {
    gate: Arc<Gate>,
    key: String,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        if let Some(n) = state.inside.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                state.inside.remove(&self.key);
            }
        }
        drop(state);
        self.gate.left.notify_waiters();
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pass for work on `key`, or `None` while its gate is closed.
    pub fn enter(self: &Arc<Self>, key: &str) -> Option<Pass> {
        let mut state = self.lock();
        if state.closed.contains(key) {
            return None;
        }
        *state.inside.entry(key.to_string()).or_default() += 1;
        Some(Pass {
            gate: self.clone(),
            key: key.to_string(),
        })
    }

    /// Closes `key`'s gate and waits until no reconcile of it is inside.
    pub async fn close(&self, key: &str) {
        self.lock().closed.insert(key.to_string());
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if !self.lock().inside.contains_key(key) {
                return;
            }
            left.await;
        }
    }

    /// Opens `key`'s gate again (the move was not written, or the cluster
    /// came back to this shard).
    pub fn open(&self, key: &str) {
        self.lock().closed.remove(key);
    }

    /// The keys whose gates are closed.
    pub fn closed(&self) -> Vec<String> {
        self.lock().closed.iter().cloned().collect()
    }

    /// How many reconciles are inside for `key`.
    pub fn inside(&self, key: &str) -> usize {
        self.lock().inside.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn close_waits_for_the_work_inside_and_refuses_new_work() {
        let gate = Arc::new(Gate::default());
        let pass = gate.enter("team-a/c1").expect("open");
        let other = gate.enter("team-a/c2").expect("open");
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close("team-a/c1").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !closing.is_finished(),
            "closed while a reconcile was inside"
        );
        assert!(gate.enter("team-a/c1").is_none(), "entered a closing gate");
        drop(pass);
        tokio::time::timeout(Duration::from_secs(1), closing)
            .await
            .expect("close returned once the reconcile left")
            .unwrap();
        assert!(gate.enter("team-a/c1").is_none());
        // Other clusters are not held up.
        assert_eq!(gate.inside("team-a/c2"), 1);
        drop(other);
        gate.open("team-a/c1");
        assert!(gate.enter("team-a/c1").is_some());
    }

    #[tokio::test]
    async fn close_returns_at_once_when_nothing_is_inside() {
        let gate = Arc::new(Gate::default());
        tokio::time::timeout(Duration::from_millis(100), gate.close("team-a/c1"))
            .await
            .expect("nothing inside");
        assert_eq!(gate.closed(), ["team-a/c1"]);
    }
}
