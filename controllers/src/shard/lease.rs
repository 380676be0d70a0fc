//! Which shards are live. Every replica of a sharded group holds a Lease
//! named `<prefix><shard>` in the lease namespace, renewed by
//! [`crate::leader::LeaderElector`] like the leader Lease. A shard is live
//! while its Lease has a holder and has changed within its duration, judged
//! by when *this* replica saw it change (its own clock, never another's),
//! as client-go judges leader Leases. A replica that starts watching counts
//! every held Lease as live for one duration: it cannot know better yet.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One Lease of the group, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    pub name: String,
    pub resource_version: Option<String>,
    pub holder: Option<String>,
    pub duration: Duration,
}

#[derive(Debug, Clone)]
struct Seen {
    resource_version: Option<String>,
    holder: Option<String>,
    at: Instant,
}

/// What this replica has seen of the group's Leases.
#[derive(Debug, Default)]
pub struct LiveShards {
    seen: BTreeMap<String, Seen>,
}

impl LiveShards {
    /// Feeds one list of the lease namespace's Leases, seen at `now`;
    /// returns the live shards' names (sorted). Leases whose name lacks
    /// `prefix` are not the group's.
    pub fn observe(&mut self, prefix: &str, leases: &[LeaseState], now: Instant) -> Vec<String> {
        let mut live = Vec::new();
        let mut listed = BTreeMap::new();
        for lease in leases {
            let Some(shard) = lease.name.strip_prefix(prefix).filter(|s| !s.is_empty()) else {
                continue;
            };
            let seen = match self.seen.remove(&lease.name) {
                Some(s)
                    if s.resource_version == lease.resource_version && s.holder == lease.holder =>
                {
                    s
                }
                _ => Seen {
                    resource_version: lease.resource_version.clone(),
                    holder: lease.holder.clone(),
                    at: now,
                },
            };
            let held = lease.holder.as_deref().is_some_and(|h| !h.is_empty());
            if held && now.duration_since(seen.at) < lease.duration {
                live.push(shard.to_string());
            }
            listed.insert(lease.name.clone(), seen);
        }
        // A Lease no longer listed was deleted: its shard is gone.
        self.seen = listed;
        live.sort();
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, rv: &str, holder: Option<&str>) -> LeaseState {
        LeaseState {
            name: name.into(),
            resource_version: Some(rv.into()),
            holder: holder.map(Into::into),
            duration: Duration::from_secs(15),
        }
    }

    const P: &str = "etcdfleet-shard-";

    #[test]
    fn a_renewed_lease_stays_live_and_an_unrenewed_one_lapses_after_its_duration() {
        let mut shards = LiveShards::default();
        let t0 = Instant::now();
        let a = |rv| lease("etcdfleet-shard-a", rv, Some("a"));
        let b = lease("etcdfleet-shard-b", "7", Some("b"));
        assert_eq!(shards.observe(P, &[a("1"), b.clone()], t0), ["a", "b"]);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(shards.observe(P, &[a("2"), b.clone()], t1), ["a", "b"]);
        // b unchanged for 15 s (by this replica's clock): lapsed.
        let t2 = t0 + Duration::from_secs(15);
        assert_eq!(shards.observe(P, &[a("3"), b.clone()], t2), ["a"]);
        // b renews again: live again.
        let b2 = lease("etcdfleet-shard-b", "8", Some("b"));
        assert_eq!(shards.observe(P, &[a("3"), b2], t2), ["a", "b"]);
    }

    #[test]
    fn a_released_or_deleted_lease_is_not_live_at_once() {
        let mut shards = LiveShards::default();
        let t0 = Instant::now();
        let a = lease("etcdfleet-shard-a", "1", Some("a"));
        let b = lease("etcdfleet-shard-b", "1", Some("b"));
        assert_eq!(shards.observe(P, &[a.clone(), b], t0), ["a", "b"]);
        let released = lease("etcdfleet-shard-b", "2", None);
        assert_eq!(shards.observe(P, &[a.clone(), released], t0), ["a"]);
        assert_eq!(shards.observe(P, &[a], t0), ["a"]);
    }

    #[test]
    fn other_leases_of_the_namespace_are_not_shards() {
        let mut shards = LiveShards::default();
        let t0 = Instant::now();
        let leader = lease("etcdfleet-controller", "1", Some("a"));
        let bare = lease("etcdfleet-shard-", "1", Some("x"));
        assert!(shards.observe(P, &[leader, bare], t0).is_empty());
    }
}
