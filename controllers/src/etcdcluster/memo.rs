//! What a converged reconcile may skip reading again.
//!
//! Once a reconcile found a cluster converged, the objects it only checks
//! for presence and identity (namespace, Services, TLS Secrets, PDB,
//! members ConfigMap) matched inputs whose fingerprint is remembered here,
//! with the PKI read from the management Secret. The next reconciles with
//! the same fingerprint skip those reads for `reread_after`; everything that
//! changes on its own (StatefulSet, pods, PVCs, etcd itself) is read every
//! time. A change of inputs (spec, template, controller release, workload
//! API server) changes the fingerprint, and any reconcile that is not
//! converged forgets the entry. A reconcile whose plan on the remembered
//! observation is a step forgets it and observes again before acting
//! (`pipeline`), so every write is made on objects read, owner included, in
//! the same reconcile: an object another owner took meanwhile is refused,
//! never overwritten. What is not caught: someone deleting or editing one
//! of those objects by hand on a cluster that stays converged is noticed up
//! to `reread_after` later instead of at the next poll.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::access::Pki;
use crate::render::RenderInputs;

/// Most clusters remembered; beyond it the memo starts over (a bound, not
/// a working-set size: a fleet of this many clusters per replica is twice
/// what the controller is sized for).
const CAPACITY: usize = 10_000;

#[derive(Clone)]
pub struct Remembered {
    pub pki: Option<Pki>,
}

struct Entry {
    fingerprint: u64,
    pki: Option<Pki>,
    at: Instant,
}

#[derive(Default)]
pub struct ObservationMemo {
    entries: Mutex<HashMap<String, Entry>>,
}

/// The inputs the skipped objects are rendered from, and where they live.
pub fn fingerprint(inputs: &RenderInputs, server: &str) -> u64 {
    let mut h = DefaultHasher::new();
    server.hash(&mut h);
    inputs.tls.hash(&mut h);
    inputs.workload_namespace.hash(&mut h);
    for kind in [
        "ServerTlsSecret",
        "PeerTlsSecret",
        "PeerService",
        "ClientService",
        "PodDisruptionBudget",
    ] {
        inputs.identity_hash(kind).hash(&mut h);
    }
    h.finish()
}

impl ObservationMemo {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Only a cache: after a panic elsewhere, keep using it.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The remembered observation of `key`, if it is younger than `ttl` and
    /// was made for the same fingerprint.
    pub fn recall(&self, key: &str, fingerprint: u64, ttl: Duration) -> Option<Remembered> {
        if ttl.is_zero() {
            return None;
        }
        let entries = self.lock();
        let entry = entries.get(key)?;
        (entry.fingerprint == fingerprint && entry.at.elapsed() < ttl).then(|| Remembered {
            pki: entry.pki.clone(),
        })
    }

    /// Remembers a converged observation. A still-valid entry keeps its
    /// time, so objects are re-read at least every `ttl`.
    pub fn remember(&self, key: &str, fingerprint: u64, pki: Option<Pki>, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.lock();
        if let Some(e) = entries.get(key)
            && e.fingerprint == fingerprint
            && e.at.elapsed() < ttl
        {
            return;
        }
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(
            key.to_string(),
            Entry {
                fingerprint,
                pki,
                at: Instant::now(),
            },
        );
    }

    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_is_recalled_only_for_the_same_fingerprint_within_its_ttl() {
        let memo = ObservationMemo::default();
        let ttl = Duration::from_secs(60);
        memo.remember("ns/a", 1, None, ttl);
        assert!(memo.recall("ns/a", 1, ttl).is_some());
        assert!(memo.recall("ns/a", 2, ttl).is_none(), "inputs changed");
        assert!(memo.recall("ns/b", 1, ttl).is_none());
        assert!(memo.recall("ns/a", 1, Duration::ZERO).is_none());
        memo.forget("ns/a");
        assert!(memo.recall("ns/a", 1, ttl).is_none());
    }

    #[test]
    fn a_zero_ttl_remembers_nothing() {
        let memo = ObservationMemo::default();
        memo.remember("ns/a", 1, None, Duration::ZERO);
        assert!(memo.is_empty());
    }

    #[test]
    fn remembering_again_does_not_extend_the_ttl() {
        let memo = ObservationMemo::default();
        let ttl = Duration::from_millis(50);
        memo.remember("ns/a", 1, None, ttl);
        std::thread::sleep(Duration::from_millis(30));
        memo.remember("ns/a", 1, None, ttl);
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            memo.recall("ns/a", 1, ttl).is_none(),
            "re-read at least every ttl"
        );
    }
}
