//! What a change of the volumes must not overlap: a recovery, an adoption,
//! and (unless it has begun) a change of version, a CA rotation or a roll.

use super::super::members::Members;

/// What a storage change waits for before its next step: a change it must
/// not overlap that came first (`begun`: this one has begun, and the others
/// wait for it instead).
pub fn waits_for(m: &Members, begun: bool) -> Option<String> {
    let obs = m.obs;
    if obs
        .recovery
        .record
        .as_ref()
        .is_some_and(|r| r.in_progress())
    {
        return Some("a quorum-loss recovery is under way".into());
    }
    if obs.adoption.is_some() {
        return Some("the takeover of the running etcd is not complete".into());
    }
    if !begun && let Some((from, to)) = &obs.version.minor_change {
        return Some(format!("the change of version {from} → {to} comes first"));
    }
    if !begun
        && obs
            .ca_rotation
            .record
            .as_ref()
            .is_some_and(|r| r.in_progress())
    {
        return Some("the CA rotation under way comes first".into());
    }
    if !begun && obs.pods.keys().any(|o| m.outdated(*o)) {
        return Some("members are being rolled onto the StatefulSet's template".into());
    }
    None
}
