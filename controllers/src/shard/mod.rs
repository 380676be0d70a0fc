//! Sharding: N replicas of one Deployment share a fleet, each reconciling
//! the clusters labelled with its shard name (`etcdfleet.dev/shard`).
//!
//! - [`assign`]: which live shard owns a cluster (rendezvous hashing).
//! - [`gate`]: work on a cluster stops before it moves.
//! - [`lease`]: which shards are live, from their Leases.
//! - [`plan`]: the rules for moving a cluster's label (pure).
//! - [`run`]: the round that does the I/O.

pub mod assign;
pub mod gate;
pub mod lease;
pub mod plan;
pub mod run;

/// The label naming the shard that reconciles a cluster.
pub const SHARD_LABEL: &str = "etcdfleet.dev/shard";
