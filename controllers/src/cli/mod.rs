//! The offline subcommands of the `etcdfleet` binary, as pure functions, a
//! file each: [`manifests`] (reading the YAML a person gives), [`validate`]
//! (each object as the API server would check it), [`render`] (what the
//! controller would write for a cluster, and where each value came from)
//! and [`plan`] (what it would do next, and why). They read manifests only
//! — no cluster, no network — so a platform engineer can ask "what happens
//! if I apply this?" and tests can answer it from YAML fixtures.
//!
//! `plan` runs the controller's own decisions on the controller's own
//! observation: the resolution source and the template resolution
//! (`etcdcluster::resolve`), the version policy, and the planner on the
//! observation the controller's assembler (`etcdcluster::observe::assemble`)
//! makes from readings taken from the status.

pub mod drill;
pub mod manifests;
pub mod plan;
pub mod render;
pub mod validate;

pub use manifests::{CliError, InvalidObject, Manifests};
pub use plan::{
    ClusterPlan, EXIT_BLOCKED, EXIT_CHANGES, EXIT_INPUT_ERROR, EXIT_NO_CHANGE, PlanOutcome,
    ResolutionBasis, VersionVerdict, describe_plan, plan_all, plan_cluster, plan_exit_code,
};
pub use render::{RenderReport, render_cluster};
pub use validate::validate_offline;

#[cfg(test)]
mod tests;
