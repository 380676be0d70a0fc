//! Which live shard owns a cluster: rendezvous (highest random weight)
//! hashing. Every replica computes the same owner from the same set of live
//! shards, with no table to agree on; when a shard joins it takes about
//! `1/(n+1)` of the clusters and no cluster moves between two shards that
//! stay, and when a shard leaves only its own clusters move.
//!
//! The weight is the first 8 bytes of SHA-256 over the shard's name, a zero
//! byte and the cluster's key: stable across processes, builds and Rust
//! versions (the standard library's hasher is not).

use ring::digest::{SHA256, digest};

/// The key a cluster is hashed by: `<namespace>/<name>`.
pub fn cluster_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn weight(shard: &str, key: &str) -> u64 {
    let mut input = Vec::with_capacity(shard.len() + 1 + key.len());
    input.extend_from_slice(shard.as_bytes());
    input.push(0);
    input.extend_from_slice(key.as_bytes());
    let hash = digest(&SHA256, &input);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// The shard of `live` that owns `key` (ties, practically impossible, go
/// to the smaller name); `None` when no shard is live.
pub fn owner<'a, S: AsRef<str>>(key: &str, live: &'a [S]) -> Option<&'a str> {
    live.iter()
        .map(AsRef::as_ref)
        .max_by(|a, b| weight(a, key).cmp(&weight(b, key)).then_with(|| b.cmp(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| cluster_key("team-a", &format!("c{i:04}")))
            .collect()
    }

    #[test]
    fn the_owner_is_the_same_whatever_the_order_of_the_live_shards() {
        let a = ["r-0", "r-1", "r-2"];
        let b = ["r-2", "r-0", "r-1"];
        for key in keys(200) {
            assert_eq!(owner(&key, &a), owner(&key, &b), "{key}");
        }
        assert_eq!(owner::<&str>("team-a/c0000", &[]), None);
    }

    #[test]
    fn the_weight_is_stable_across_builds() {
        // A change of hash would move every cluster at a controller upgrade:
        // these values are SHA-256's, fixed for good.
        assert_eq!(weight("r-0", "team-a/c0000"), weight("r-0", "team-a/c0000"));
        let expected = {
            let h = digest(&SHA256, b"r-0\0team-a/c0000");
            u64::from_be_bytes(h.as_ref()[..8].try_into().unwrap())
        };
        assert_eq!(weight("r-0", "team-a/c0000"), expected);
    }

    #[test]
    fn three_shards_share_a_fleet_evenly() {
        let live = ["r-0", "r-1", "r-2"];
        let mut counts = std::collections::BTreeMap::new();
        for key in keys(3000) {
            *counts.entry(owner(&key, &live).unwrap()).or_insert(0) += 1;
        }
        for (shard, n) in &counts {
            assert!((850..=1150).contains(n), "{shard}: {n} of 3000: {counts:?}");
        }
    }

    #[test]
    fn a_joining_shard_takes_only_from_the_others_and_a_leaving_one_gives_only_its_own() {
        let three = ["r-0", "r-1", "r-2"];
        let four = ["r-0", "r-1", "r-2", "r-3"];
        let moves: Vec<(&str, &str)> = keys(2000)
            .iter()
            .map(|k| (owner(k, &three).unwrap(), owner(k, &four).unwrap()))
            .filter(|(before, after)| before != after)
            .collect();
        assert!(moves.iter().all(|(_, after)| *after == "r-3"), "{moves:?}");
        // About a quarter moves to the new shard.
        assert!(
            (400..=600).contains(&moves.len()),
            "{} of 2000 moved",
            moves.len()
        );
        // r-1 leaves: the clusters that move are exactly its own.
        let two = ["r-0", "r-2"];
        let moved: Vec<&str> = keys(2000)
            .iter()
            .map(|k| (owner(k, &three).unwrap(), owner(k, &two).unwrap()))
            .filter(|(before, after)| before != after)
            .map(|(before, _)| before)
            .collect();
        assert!(
            !moved.is_empty() && moved.iter().all(|b| *b == "r-1"),
            "{moved:?}"
        );
    }
}
