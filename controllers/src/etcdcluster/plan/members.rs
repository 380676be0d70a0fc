//! The running cluster as the membership rules see it: a StatefulSet
//! exists and members answer. Helpers shared by those rules (which ordinal a
//! member sits at, whom to hand leadership to) live here.

use crate::etcd::ClusterHealth;

use super::observation::{EtcdObservation, Observation, PvcObservation, StatefulSetObservation};
use super::step::Step;

/// What the rules after bootstrap decide from: the observation, with the
/// StatefulSet and etcd's answers known to be there.
pub struct Members<'a> {
    pub obs: &'a Observation,
    pub sts: &'a StatefulSetObservation,
    pub health: &'a ClusterHealth,
}

impl<'a> Members<'a> {
    /// `None` until a StatefulSet exists and some member answers (the
    /// bootstrap rules decide until then).
    pub fn of(obs: &'a Observation) -> Option<Self> {
        let sts = obs.statefulset.as_ref()?;
        let EtcdObservation::Observed(health) = &obs.etcd else {
            return None;
        };
        Some(Members { obs, sts, health })
    }

    /// The ordinal a member runs at, from its peer URL (`None`: not ours).
    pub fn ordinal_of(&self, id: u64) -> Option<u32> {
        self.health
            .member(id)
            .and_then(|m| m.member.peer_urls.first())
            .and_then(|u| self.obs.names.ordinal_of_peer_url(u))
    }

    /// The member whose peer URL names this ordinal.
    pub fn member_at(&self, ordinal: u32) -> Option<u64> {
        self.health
            .members()
            .iter()
            .find(|m| {
                m.member
                    .peer_urls
                    .iter()
                    .any(|u| self.obs.names.ordinal_of_peer_url(u) == Some(ordinal))
            })
            .map(|m| m.member.id)
    }

    /// A voter whose pod the kubelet does not report Ready, though etcd
    /// answers for it (a member just restarted, whose readiness probe has
    /// not passed yet: the real kubelet probes every 10 s): the next
    /// disruption waits for it, as a StatefulSet's rolling update waits for
    /// Ready pods, so clients of the client Service never see two members
    /// gone. While an alarm is raised, a probe that is etcd's own health
    /// check fails on every member (etcd's `/health` reports alarms), so
    /// readiness says nothing then and is not waited for.
    pub fn unready_voter(&self) -> Option<u32> {
        let alarmed = !self.obs.alarms.is_empty();
        self.health
            .voters()
            .filter_map(|mo| self.ordinal_of(mo.member.id))
            .find(|o| {
                self.obs.pods.get(o).is_some_and(|p| {
                    let says_nothing = alarmed && p.ready_means_etcd_healthy;
                    !(p.ready || p.deleting || says_nothing)
                })
            })
    }

    /// The pod at `ordinal` was made from another pod template than the
    /// StatefulSet's. The template hash covers every input (flags,
    /// resources, image, pod overrides); the image is compared only for
    /// StatefulSets written before the hash was stamped. An admission
    /// webhook that rewrites images (mirror, digest) changes no hash.
    pub fn outdated(&self, ordinal: u32) -> bool {
        self.obs
            .pods
            .get(&ordinal)
            .is_some_and(|p| match &self.sts.template_hash {
                Some(h) => p.template_hash.as_ref() != Some(h),
                None => p.image != self.sts.image,
            })
    }

    /// A member as a person reads it: its pod's name, or its id when it is
    /// not at one of this cluster's ordinals.
    pub fn describe(&self, id: u64) -> String {
        self.ordinal_of(id)
            .map_or_else(|| format!("{id:x}"), |o| self.obs.names.pod(o))
    }

    /// The first volume `wanted` says needs its annotations (re)written (see
    /// [`record_pvc_step`]).
    pub fn record_pvc_step(
        &self,
        wanted: impl Fn(&PvcObservation, Option<&String>) -> bool,
    ) -> Option<Step> {
        record_pvc_step(self.obs, self.health, &|id| self.ordinal_of(id), wanted)
    }

    /// A healthy voter to hand leadership to (see [`pick_new_leader`]).
    pub fn pick_new_leader(&self, eligible: &dyn Fn(u32) -> bool, from: u64) -> Option<u64> {
        pick_new_leader(self.health, eligible, &|id| self.ordinal_of(id), from)
    }
}

/// The first volume `wanted` says needs its annotations (re)written: one
/// whose member runs in a started pod and holds that member's data (a volume
/// recorded for another member is stale storage, handled on its own).
fn record_pvc_step(
    obs: &Observation,
    health: &ClusterHealth,
    ordinal_of: &dyn Fn(u64) -> Option<u32>,
    wanted: impl Fn(&PvcObservation, Option<&String>) -> bool,
) -> Option<Step> {
    health.members().iter().find_map(|m| {
        let running = m
            .status
            .as_ref()
            .map(|s| s.version.clone())
            .filter(|v| !v.is_empty());
        let ordinal = ordinal_of(m.member.id)?;
        let pvc = obs.pvcs.get(&ordinal)?;
        let ours = pvc.member_id.is_none_or(|id| id == m.member.id);
        (ours && obs.pods.get(&ordinal).is_some_and(|p| p.running) && wanted(pvc, running.as_ref()))
            .then_some(Step::RecordPvcMember {
                ordinal,
                member_id: m.member.id,
                version: running,
            })
    })
}

/// A healthy voter (other than `from`, passing `eligible` on its ordinal) to
/// hand leadership to: the one with the highest raft index, lowest ordinal on ties.
fn pick_new_leader(
    health: &ClusterHealth,
    eligible: &dyn Fn(u32) -> bool,
    ordinal_of: &dyn Fn(u64) -> Option<u32>,
    from: u64,
) -> Option<u64> {
    health
        .voters()
        .filter(|m| m.healthy && m.member.id != from)
        .filter_map(|m| {
            let o = ordinal_of(m.member.id)?;
            eligible(o).then(|| {
                (
                    m.status.as_ref().map_or(0, |s| s.raft_index),
                    o,
                    m.member.id,
                )
            })
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, _, id)| id)
}
