//! What the resolve stage hands the stages after it: the cluster resolved
//! and ready to render. A leaf, so the stages that read it (observe, act)
//! need nothing of the stage that made it.

use etcdfleet_api::template::Resolution;
use etcdfleet_api::version::VersionChange;

use crate::render::RenderInputs;

/// The resolved cluster, ready to render.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resolution: Resolution,
    /// What to render with: the resolved spec, except the version and image
    /// stay at the running version while a version change is rejected.
    pub inputs: RenderInputs,
    /// `None` when the requested version change was rejected.
    pub version_change: Option<VersionChange>,
}

impl Resolved {
    /// While a version change is rejected the StatefulSet is left exactly as it is.
    pub fn hold_statefulset(&self) -> bool {
        self.version_change.is_none()
    }
}
