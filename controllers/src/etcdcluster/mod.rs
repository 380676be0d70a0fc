//! The EtcdCluster reconciler. One reconcile is a pipeline of seven stages
//! ([`pipeline`]):
//!
//! ```text
//! admit    → the admission rules (pure, `admission::RULES`)
//! resolve  → template chain + materialization (pure, plus one apply, once)
//! connect  → kubeconfig Secret → workload client (cached; direct GET)
//! observe  → workload objects + etcd members and health (read only)
//! plan     → at most one next step (pure, `plan::plan_next_step`)
//! act      → execute that step (idempotent, deterministic names, preconditions)
//! report   → the status composed from what the stages learned, events, metrics
//! ```
//!
//! Everything that decides lives in two rule lists, [`admission::RULES`]
//! and [`plan::RULES`] (and in `etcdfleet_api`); this module and its
//! siblings only move data between the APIs and those pure functions.
//! [`context`] holds what a reconcile runs with and answers;
//! [`cluster_object`] makes every write to the EtcdCluster itself;
//! [`status`] composes the status from what a reconcile learned;
//! [`requeue`] says when a cluster is looked at again.

pub mod act;
pub mod admission;
pub mod cluster_object;
pub mod context;
pub mod memo;
pub mod observe;
pub mod pipeline;
pub mod plan;
pub mod requeue;
pub mod resolve;
pub mod resolved;
pub mod status;

pub use crate::access::OwnerFilter;
pub use context::{
    Context, Error, FINALIZER, Outcome, ReconcilerSettings, Result, cluster_key, now,
};
pub use pipeline::{error_policy, publish, reconcile, reconcile_cluster};
pub use requeue::{held_delay, held_requeue, in_flight_delay, in_flight_requeue, requeue_for};
