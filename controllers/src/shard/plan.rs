//! The shard rules, pure: what one replica does with one cluster it sees,
//! given the live shards. An ordered list of named rules ([`RULES`]); the
//! first that answers decides.
//!
//! Two duties write the shard label, and never on the same cluster at once:
//! - the **owner** (the shard the label names, alive) hands over a cluster
//!   that now hashes to another live shard, after it stopped all work on it
//!   ([`Move::Release`]);
//! - the **sharder** (one replica, holding the group's leader Lease) labels
//!   clusters that have no owner: unlabelled, or labelled with a shard whose
//!   Lease lapsed ([`Move::Assign`]). A shard that loses its Lease stops
//!   before anyone may see it lapse (it exits within its renew deadline,
//!   shorter than the lease duration), so the sharder never moves a
//!   cluster away from a replica still working on it.
//!
//! A cluster labelled with another live shard is that shard's to move.

use super::assign::owner;

/// What a replica knows of its group when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Shards<'a> {
    /// This replica's shard name.
    pub me: &'a str,
    /// Every shard whose Lease is live, this one included.
    pub live: &'a [String],
    /// Whether this replica is the group's sharder.
    pub sharder: bool,
}

/// One cluster: its key ([`super::assign::cluster_key`]) and shard label.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub key: &'a str,
    pub label: Option<&'a str>,
}

/// A change of a cluster's shard label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// Ours, and it hashes to another live shard: stop work on it, then
    /// label it `to`.
    Release { to: String },
    /// No live owner (`from` is the lapsed shard, or none): label it `to`.
    Assign { from: Option<String>, to: String },
}

type Rule = fn(&Shards, &Seen) -> Option<Move>;

/// The rules, in order.
pub const RULES: &[(&str, Rule)] = &[
    ("ReleaseToItsOwner", release_to_its_owner),
    ("AssignUnlabelled", assign_unlabelled),
    ("AssignFromLapsedShard", assign_from_lapsed_shard),
];

/// The first rule of [`RULES`] that answers, with its name. Pure.
pub fn next_move(shards: &Shards, seen: &Seen) -> Option<(&'static str, Move)> {
    RULES
        .iter()
        .find_map(|(name, rule)| rule(shards, seen).map(|m| (*name, m)))
}

fn release_to_its_owner(shards: &Shards, seen: &Seen) -> Option<Move> {
    if seen.label != Some(shards.me) || !shards.live.iter().any(|s| s == shards.me) {
        return None;
    }
    let to = owner(seen.key, shards.live)?;
    (to != shards.me).then(|| Move::Release { to: to.to_string() })
}

fn assign_unlabelled(shards: &Shards, seen: &Seen) -> Option<Move> {
    if !shards.sharder || seen.label.is_some() {
        return None;
    }
    let to = owner(seen.key, shards.live)?.to_string();
    Some(Move::Assign { from: None, to })
}

fn assign_from_lapsed_shard(shards: &Shards, seen: &Seen) -> Option<Move> {
    let lapsed = seen.label?;
    if !shards.sharder || shards.live.iter().any(|s| s == lapsed) {
        return None;
    }
    let to = owner(seen.key, shards.live)?.to_string();
    Some(Move::Assign {
        from: Some(lapsed.to_string()),
        to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::assign::cluster_key;

    fn live(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// A key owned by `shard` among `live` (searched).
    fn key_of(shard: &str, live: &[String]) -> String {
        (0..)
            .map(|i| cluster_key("team-a", &format!("c{i}")))
            .find(|k| owner(k, live) == Some(shard))
            .unwrap()
    }

    #[test]
    fn an_owner_keeps_what_hashes_to_it_and_hands_over_the_rest() {
        let three = live(&["r-0", "r-1", "r-2"]);
        let shards = Shards {
            me: "r-0",
            live: &three,
            sharder: false,
        };
        let mine = key_of("r-0", &three);
        let theirs = key_of("r-1", &three);
        let ours = Some("r-0");
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: &mine,
                    label: ours
                }
            ),
            None
        );
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: &theirs,
                    label: ours
                }
            ),
            Some(("ReleaseToItsOwner", Move::Release { to: "r-1".into() }))
        );
    }

    #[test]
    fn nobody_touches_a_cluster_another_live_shard_owns() {
        let three = live(&["r-0", "r-1", "r-2"]);
        // Even when it hashes to this replica (r-1 hands it over itself).
        let key = key_of("r-0", &three);
        for sharder in [false, true] {
            let shards = Shards {
                me: "r-0",
                live: &three,
                sharder,
            };
            let seen = Seen {
                key: &key,
                label: Some("r-1"),
            };
            assert_eq!(next_move(&shards, &seen), None, "sharder={sharder}");
        }
    }

    #[test]
    fn the_sharder_assigns_unlabelled_clusters_and_those_of_a_lapsed_shard() {
        let two = live(&["r-0", "r-2"]);
        let shards = Shards {
            me: "r-0",
            live: &two,
            sharder: true,
        };
        let key = key_of("r-2", &two);
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: &key,
                    label: None
                }
            ),
            Some((
                "AssignUnlabelled",
                Move::Assign {
                    from: None,
                    to: "r-2".into()
                }
            ))
        );
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: &key,
                    label: Some("r-1")
                }
            ),
            Some((
                "AssignFromLapsedShard",
                Move::Assign {
                    from: Some("r-1".into()),
                    to: "r-2".into()
                }
            ))
        );
        // Only the sharder does.
        let replica = Shards {
            sharder: false,
            ..shards
        };
        assert_eq!(
            next_move(
                &replica,
                &Seen {
                    key: &key,
                    label: Some("r-1")
                }
            ),
            None
        );
        assert_eq!(
            next_move(
                &replica,
                &Seen {
                    key: &key,
                    label: None
                }
            ),
            None
        );
    }

    #[test]
    fn a_replica_that_is_not_live_itself_hands_over_nothing() {
        // Its Lease is not (or no longer) among the live ones: it is about
        // to stop, and the sharder moves its clusters once the Lease lapsed.
        let others = live(&["r-1", "r-2"]);
        let shards = Shards {
            me: "r-0",
            live: &others,
            sharder: false,
        };
        let key = key_of("r-1", &others);
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: &key,
                    label: Some("r-0")
                }
            ),
            None
        );
    }

    #[test]
    fn with_no_live_shard_nothing_moves() {
        let none: Vec<String> = Vec::new();
        let shards = Shards {
            me: "r-0",
            live: &none,
            sharder: true,
        };
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: "team-a/c0",
                    label: None
                }
            ),
            None
        );
        assert_eq!(
            next_move(
                &shards,
                &Seen {
                    key: "team-a/c0",
                    label: Some("r-1")
                }
            ),
            None
        );
    }

    #[test]
    fn every_rule_has_a_unique_name() {
        let names: std::collections::BTreeSet<&str> = RULES.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), RULES.len());
    }
}
