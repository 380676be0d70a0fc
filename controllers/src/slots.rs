//! A namespace's share of the reconcile slots. In all-namespaces mode one
//! controller serves every tenant with `maxConcurrentReconciles` slots; a
//! tenant whose clusters each hold a slot for long (a workload API server
//! that trickles its answers, up to its deadline per call) would otherwise
//! take them all, and every other tenant's clusters would wait. Here each
//! namespace holds at most its share at once; a reconcile past it gives its
//! slot back at once and comes again shortly ([`RETRY`]). Namespaced mode
//! runs a controller, and its slots, per namespace, and needs no share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How soon a reconcile refused for its namespace's share comes again.
pub const RETRY: Duration = Duration::from_secs(1);

/// The reconciles in flight per namespace, and the most one may hold
/// (`None`: no bound).
#[derive(Debug, Default)]
pub struct Shares {
    limit: Option<usize>,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One reconcile's hold on its namespace's share, given back on drop.
#[derive(Debug)]
pub struct Share {
    held: Arc<Mutex<HashMap<String, usize>>>,
    namespace: String,
}

impl Shares {
    /// Shares of at most `limit` reconciles per namespace (`None`: no bound).
    pub fn new(limit: Option<usize>) -> Self {
        Shares {
            limit,
            held: Default::default(),
        }
    }

    /// A hold for one reconcile in `namespace`, or `None` while the
    /// namespace holds its whole share.
    pub fn take(&self, namespace: &str) -> Option<Share> {
        let mut held = self.held.lock().expect("shares lock poisoned");
        let count = held.entry(namespace.to_string()).or_insert(0);
        if self.limit.is_some_and(|limit| *count >= limit) {
            return None;
        }
        *count += 1;
        Some(Share {
            held: self.held.clone(),
            namespace: namespace.to_string(),
        })
    }

    /// Reconciles in flight in `namespace`.
    pub fn in_flight(&self, namespace: &str) -> usize {
        let held = self.held.lock().expect("shares lock poisoned");
        held.get(namespace).copied().unwrap_or(0)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.held.lock().expect("shares lock poisoned");
        if let Some(count) = held.get_mut(&self.namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_holds_at_most_its_share_and_another_tenant_still_gets_a_slot() {
        let shares = Shares::new(Some(2));
        let a1 = shares.take("tenant-a").expect("first");
        let _a2 = shares.take("tenant-a").expect("second");
        assert!(
            shares.take("tenant-a").is_none(),
            "a third is past the share"
        );
        let b = shares
            .take("tenant-b")
            .expect("another tenant is not held up");
        assert_eq!(shares.in_flight("tenant-a"), 2);
        drop(a1);
        assert!(
            shares.take("tenant-a").is_some(),
            "a slot given back is taken again"
        );
        drop(b);
        assert_eq!(shares.in_flight("tenant-b"), 0);
        let unbounded = Shares::default();
        let held: Vec<Share> = (0..100).filter_map(|_| unbounded.take("a")).collect();
        assert_eq!(held.len(), 100);
    }
}
