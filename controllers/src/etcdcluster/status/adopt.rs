//! The takeover of a running etcd in status: `status.adoption` (the
//! existing members recorded when it started, those removed, the phase, the
//! old objects nothing uses any more) and the `Adopted` condition, from
//! where the planner says the takeover stands.

use etcdfleet_api::adopt::{ADOPTED, AdoptedMember, AdoptionStatus, phase, reason};

use super::super::plan::adopt::{AdoptionState, adoption_state};
use super::super::plan::observation::{EtcdObservation, Observation};
use super::Builder;
use crate::etcd::ClusterHealth;

impl Builder {
    /// Records where the takeover stands. Returns the event to publish when
    /// its phase or refusal changed: `(warning, reason, note)`.
    pub(super) fn adoption(&mut self, obs: &Observation) -> Option<(bool, &'static str, String)> {
        let state = adoption_state(obs)?;
        let before = self.adopted_reason();
        let (event_reason, _, message) = match &state {
            AdoptionState::Refused(r) => {
                self.set(ADOPTED, false, r.reason, r.message.clone());
                (r.reason, false, r.message.clone())
            }
            AdoptionState::Ready => {
                self.record_existing(obs);
                self.adopted(false, reason::JOINING, "every preflight check passed; etcdfleet's members join the existing cluster as learners, one at a time")
            }
            AdoptionState::Joining => {
                self.phase(phase::JOINING);
                self.adopted(
                    false,
                    reason::JOINING,
                    "etcdfleet's members are joining the existing cluster, one at a time",
                )
            }
            AdoptionState::Retiring => {
                self.phase(phase::RETIRING);
                self.adopted(false, reason::RETIRING, "etcdfleet's members hold the cluster; the old members are removed from the membership one at a time (their pods and volumes are left to their owner)")
            }
            AdoptionState::Halted(why) => {
                self.phase(phase::HALTED);
                self.set(ADOPTED, false, reason::MEMBERSHIP_CHANGED, why.clone());
                (reason::MEMBERSHIP_CHANGED, false, why.clone())
            }
            AdoptionState::Completed => self.completed(obs),
            AdoptionState::Unknown => return None,
        };
        let warning = matches!(state, AdoptionState::Refused(_) | AdoptionState::Halted(_));
        (before.as_deref() != Some(event_reason)).then_some((warning, event_reason, message))
    }

    /// Records, before it is made, that old member `member_id` is removed:
    /// a member gone afterwards is known to be etcdfleet's doing.
    pub(super) fn record_retirement(&mut self, member_id: u64) {
        if let Some(a) = self.new.adoption.as_mut() {
            let id = format!("{member_id:x}");
            if !a.retired.contains(&id) {
                a.retired.push(id);
            }
        }
    }

    fn adopted_reason(&self) -> Option<String> {
        etcdfleet_api::conditions::find(&self.new.conditions, ADOPTED).map(|c| c.reason.clone())
    }

    fn adopted(
        &mut self,
        status: bool,
        reason: &'static str,
        message: &str,
    ) -> (&'static str, bool, String) {
        self.set(ADOPTED, status, reason, message);
        (reason, status, message.to_string())
    }

    /// Before the first change: the existing membership as it is now.
    fn record_existing(&mut self, obs: &Observation) {
        let EtcdObservation::Observed(health) = &obs.etcd else {
            return;
        };
        let adoption = self
            .new
            .adoption
            .get_or_insert_with(AdoptionStatus::default);
        adoption.phase = phase::JOINING.to_string();
        adoption.cluster_id = cluster_id(health);
        adoption.existing_members = health
            .members()
            .iter()
            .map(|m| AdoptedMember {
                id: format!("{:x}", m.member.id),
                name: m.member.name.clone(),
                peer_urls: m.member.peer_urls.clone(),
                client_urls: m.member.client_urls.clone(),
            })
            .collect();
        adoption.retired.clear();
    }

    fn phase(&mut self, phase: &str) {
        let now = super::now();
        let adoption = self
            .new
            .adoption
            .get_or_insert_with(AdoptionStatus::default);
        adoption.phase = phase.to_string();
        adoption.started_time.get_or_insert(now);
    }

    fn completed(&mut self, obs: &Observation) -> (&'static str, bool, String) {
        self.phase(phase::COMPLETED);
        let deletable = (obs.adoption.as_ref())
            .map(|a| a.deletable.clone())
            .unwrap_or_default();
        let adoption = self
            .new
            .adoption
            .get_or_insert_with(AdoptionStatus::default);
        adoption.completed_time.get_or_insert(super::now());
        adoption.deletable_objects = deletable.clone();
        let id = adoption.cluster_id.clone().unwrap_or_default();
        let objects = match deletable.is_empty() {
            true => "none were found by the names their URLs give".to_string(),
            false => deletable.join(", "),
        };
        let message = format!(
            "the existing cluster (ID {id}) is managed by etcdfleet: every old member left the \
             membership. Their objects are no longer used and may be deleted by their owner \
             (etcdfleet never does): {objects}"
        );
        self.set(ADOPTED, true, reason::TAKEN_OVER, message.clone());
        (reason::TAKEN_OVER, true, message)
    }
}

/// The cluster ID the members report (hexadecimal).
fn cluster_id(health: &ClusterHealth) -> Option<String> {
    health
        .members()
        .iter()
        .filter_map(|m| m.status.as_ref())
        .map(|s| s.cluster_id)
        .find(|id| *id != 0)
        .map(|id| format!("{id:x}"))
}
