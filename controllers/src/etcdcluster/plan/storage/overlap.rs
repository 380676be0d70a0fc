//! What a change of the volumes must not overlap: a recovery, an adoption,
//! and (unless it has begun) a change of version, a CA rotation or a roll.

use super::super::members::Members;

/// What comes before a storage change's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overlap {
    /// A change the storage change must not overlap, which an earlier rule
    /// drives (or which drives itself): the storage rule answers with this
    /// wait.
    Wait(String),
    /// A change a later rule drives (the takeover of an adoption, a roll, a
    /// CA rotation): the storage rule does not answer, so that rule can act.
    /// Answering with a wait would hold that change, and with it this one,
    /// forever.
    Yield,
}

/// What a storage change waits for before its next step: a change it must
/// not overlap that came first (`begun`: this one has begun, and the others
/// wait for it instead).
pub fn waits_for(m: &Members, begun: bool) -> Option<Overlap> {
    let obs = m.obs;
    if obs
        .recovery
        .record
        .as_ref()
        .is_some_and(|r| r.in_progress())
    {
        return Some(Overlap::Wait("a quorum-loss recovery is under way".into()));
    }
    if obs.adoption.is_some() {
        return Some(Overlap::Yield);
    }
    // Pods made from another template are rolled by a later rule, whatever
    // made the template new (a version's preflight, a configuration change,
    // an earlier re-creation of the StatefulSet).
    if !begun && obs.pods.keys().any(|o| m.outdated(*o)) {
        return Some(Overlap::Yield);
    }
    if !begun && let Some((from, to)) = &obs.version.minor_change {
        return Some(Overlap::Wait(format!(
            "the change of version {from} → {to} comes first"
        )));
    }
    if !begun
        && obs
            .ca_rotation
            .record
            .as_ref()
            .is_some_and(|r| r.in_progress())
    {
        return Some(Overlap::Yield);
    }
    None
}
