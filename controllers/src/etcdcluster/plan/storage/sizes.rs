//! The sizes a storage change compares, in bytes: the spec's, the
//! StatefulSet's claim template's and each member claim's (requested and
//! had); what the storage rules, the version and CA rotation rules and the
//! status read of a growth.

use etcdfleet_api::quantity;

use super::super::observation::{ClaimSize, Observation};
use super::super::step::Refusal;

/// The sizes a storage change compares, in bytes.
pub(crate) struct Sizes<'a> {
    pub want: i64,
    pub template: Option<i64>,
    /// Member claims by ordinal (ordinals the StatefulSet runs), with their
    /// requested and current sizes.
    pub claims: Vec<(u32, &'a ClaimSize, Option<i64>, Option<i64>)>,
}

pub(crate) fn sizes(obs: &Observation) -> Result<Sizes<'_>, Refusal> {
    let bad = |what: &str, e: String| Refusal {
        reason: "StorageSizeInvalid",
        message: format!("{what}: {e}; nothing is written"),
    };
    let want = quantity::bytes(&obs.storage.size).map_err(|e| bad("spec.storage.size", e))?;
    let of = |q: &Option<String>| q.as_deref().and_then(|q| quantity::bytes(q).ok());
    let template = obs.storage.template.as_ref().and_then(|(_, s)| of(s));
    let replicas = obs.statefulset.as_ref().map_or(u32::MAX, |s| s.replicas);
    let claims = (obs.pvcs.iter())
        .filter(|(o, p)| **o < replicas && !p.deleting)
        .map(|(o, p)| (*o, &p.size, of(&p.size.requested), of(&p.size.capacity)))
        .collect();
    Ok(Sizes {
        want,
        template,
        claims,
    })
}

impl Sizes<'_> {
    /// The largest size a member volume or the claim template already has.
    pub fn largest(&self) -> i64 {
        let claims = self.claims.iter().filter_map(|c| c.2);
        claims.chain(self.template).max().unwrap_or(0)
    }
    /// A claim still asks for less than the spec: a follower's first, the
    /// leader's (`leader`: its ordinal) last, as a restart may follow.
    pub fn claim_to_expand_but(&self, leader: Option<u32>) -> Option<u32> {
        let mut short: Vec<u32> = (self.claims.iter())
            .filter(|c| c.2.is_some_and(|r| r < self.want))
            .map(|c| c.0)
            .collect();
        short.sort_by_key(|o| Some(*o) == leader);
        short.first().copied()
    }
    pub fn claim_to_expand(&self) -> Option<u32> {
        self.claim_to_expand_but(None)
    }
    /// A claim to expand, or a volume not yet at its size.
    pub fn claims_growing(&self) -> bool {
        self.claim_to_expand().is_some()
            || self
                .claims
                .iter()
                .any(|c| c.3.is_some_and(|c| c < self.want))
    }
    /// Every volume has grown; the claim template has not.
    pub fn template_left(&self) -> bool {
        !self.claims_growing() && self.template.is_some_and(|t| t < self.want)
    }
    /// The growth has started: a claim already asks for more than the
    /// StatefulSet's claim template.
    pub fn started(&self) -> bool {
        let template = self.template.unwrap_or(i64::MAX);
        self.claims
            .iter()
            .any(|c| c.2.is_some_and(|r| r > template))
    }
    /// The volumes' part has started and is not done.
    pub fn begun(&self) -> bool {
        self.claims_growing() && self.started()
    }
}

/// The size every member's volume has (the smallest capacity of their
/// claims), once every member's claim reports one.
pub fn volume_size(obs: &Observation) -> Option<String> {
    let sizes = sizes(obs).ok()?;
    let mut least: Option<(i64, &String)> = None;
    for (_, claim, _, capacity) in &sizes.claims {
        let (Some(bytes), Some(text)) = (capacity, claim.capacity.as_ref()) else {
            return None;
        };
        if least.is_none_or(|(b, _)| *bytes < b) {
            least = Some((*bytes, text));
        }
    }
    least.map(|(_, text)| text.clone())
}

/// The volumes' part of a growth has begun and is not finished: what a
/// change of version or a CA rotation waits for.
pub fn growth_under_way(obs: &Observation) -> bool {
    sizes(obs).is_ok_and(|s| s.begun())
}

/// Every volume has grown and the StatefulSet is to be created again with
/// the new claim template: a StatefulSet write is pending, which a change
/// of version's preflight comes before.
pub fn recreate_pending(obs: &Observation) -> bool {
    sizes(obs).is_ok_and(|s| s.template_left())
}
