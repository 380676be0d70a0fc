//! Each selected cluster's record (`status.clusters[]`): which wave it is in
//! (fixed when it is first selected) and its state, judged again on every
//! reconcile from the cluster as it is now (level-triggered):
//!
//! ```text
//! Pending ──write──▶ InProgress ──converged──▶ Done ──(soak)
//!    │                   │  refused, alarm, deadline ──▶ Failed ──resume──▶ InProgress / Pending
//!    ├─ already matches ─────────────────────▶ Done
//!    └─ a person's edit, paused, deleted, no longer selected ──▶ Skipped
//! ```
//!
//! A record lost with a status write that never happened is found again
//! from `metadata.managedFields`: the rollout's own field manager owns the
//! fields with the rollout's values, so the cluster was written (and is
//! never written twice).

use std::collections::BTreeMap;
use std::time::Duration;

use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRolloutSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::view::{ClusterView, Edit};

/// Reason of a record whose cluster is no longer selected.
pub const NO_LONGER_SELECTED: &str = "NoLongerSelected";
/// Reason of a record a person's own edit took over.
pub const EDITED_BY_PERSON: &str = "EditedByPerson";

/// Sets a record's state, reason and message.
pub fn set(rec: &mut ClusterRolloutStatus, state: &str, reason: &str, message: impl Into<String>) {
    rec.state = state.to_string();
    rec.reason = Some(reason.to_string());
    rec.message = Some(etcdfleet_api::conditions::bounded(
        message.into(),
        etcdfleet_api::conditions::ROLLOUT_MESSAGE_LIMIT,
    ));
}

/// A change a rule's answer makes to one record. The rules only read the
/// judged records; the marks of the rule that answered are written into the
/// status (a rule that does not answer changes nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The record's index among the judged records.
    pub record: usize,
    pub state: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// The rollout takes the cluster now (writes it, or follows a change
    /// its spec already asks for): when, and the version it runs.
    pub taken: Option<(Timestamp, Option<String>)>,
}

impl Mark {
    pub fn new(
        record: usize,
        state: &'static str,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Mark {
            record,
            state,
            reason,
            message: message.into(),
            taken: None,
        }
    }

    pub fn taken(mut self, at: Timestamp, from_version: Option<String>) -> Self {
        self.taken = Some((at, from_version));
        self
    }

    /// Writes the mark into its record.
    pub fn write(&self, records: &mut [ClusterRolloutStatus]) {
        let rec = &mut records[self.record];
        if let Some((at, from_version)) = &self.taken {
            rec.changed_at = Some(time(*at));
            rec.from_version = from_version.clone();
        }
        set(rec, self.state, self.reason, self.message.clone());
    }
}

/// Whether a record is finished: done or skipped.
pub fn finished(rec: &ClusterRolloutStatus) -> bool {
    rec.state == DONE || rec.state == SKIPPED
}

/// A time for the status.
pub fn time(t: Timestamp) -> Time {
    Time(t)
}

/// Seconds from `since` to `now` (zero when `since` is later).
pub fn elapsed(since: Option<&Time>, now: Timestamp) -> Duration {
    since.map_or(Duration::ZERO, |t| {
        Duration::from_millis((now.as_millisecond() - t.0.as_millisecond()).max(0) as u64)
    })
}

/// The records in rollout order: the previous ones, then the clusters
/// selected for the first time. On the first reconcile the clusters (sorted
/// by `namespace/name`) are cut into waves: `canary`, then `wave_size` each;
/// a cluster selected later joins the last wave.
pub fn assign(
    previous: &[ClusterRolloutStatus],
    selected: &[ClusterView],
    canary: usize,
    wave_size: usize,
    admit_new: bool,
) -> Vec<ClusterRolloutStatus> {
    let mut records = previous.to_vec();
    let known: std::collections::BTreeSet<&str> =
        previous.iter().map(|r| r.name.as_str()).collect();
    let mut new: Vec<&ClusterView> = selected
        .iter()
        .filter(|v| !known.contains(v.key.as_str()))
        .collect();
    if !admit_new || new.is_empty() {
        return records;
    }
    new.sort_by(|a, b| a.key.cmp(&b.key));
    let last_wave = previous.iter().map(|r| r.wave).max();
    for (i, view) in new.into_iter().enumerate() {
        let wave = match last_wave {
            Some(w) => w,
            None if i < canary => 1,
            None => 2 + ((i - canary) / wave_size.max(1)) as i32,
        };
        records.push(ClusterRolloutStatus {
            name: view.key.clone(),
            wave,
            state: PENDING.to_string(),
            ..Default::default()
        });
    }
    records
}

/// Clusters this rollout changed in the current wave must stay `Available`,
/// without alarms and not `Degraded`, once converged: through the rest of
/// the wave and its soak. One that does not fails its gate (and every rule
/// after sees it failed: the rollout halts unless aborted).
pub fn judge_health_after_change(
    records: &mut [ClusterRolloutStatus],
    views: &BTreeMap<&str, &ClusterView>,
    current_wave: i32,
) {
    for rec in records.iter_mut() {
        if rec.wave != current_wave || rec.state != DONE || rec.changed_at.is_none() {
            continue;
        }
        let Some(view) = views.get(rec.name.as_str()) else {
            continue;
        };
        if let Some(why) = view.alarm().or_else(|| view.healthy().err()) {
            set(
                rec,
                FAILED,
                "UnhealthyAfterChange",
                format!("converged, then stopped being healthy before the wave finished: {why}"),
            );
        }
    }
}

/// What every record is judged against.
pub struct Judge<'a> {
    pub spec: &'a EtcdFleetRolloutSpec,
    /// The rollout's field manager.
    pub manager: &'a str,
    pub now: Timestamp,
    /// When the rollout started: edits after it are a person's own.
    pub started_at: Option<Timestamp>,
    pub progress_deadline: Duration,
    /// A person asked to resume after a halt: failed clusters are judged again.
    pub resume: bool,
}

impl Judge<'_> {
    /// The record's next state, from its cluster now (`None`: the cluster
    /// is no longer selected: excluded, relabelled, deleted, not owned).
    pub fn track(&self, rec: &mut ClusterRolloutStatus, view: Option<&ClusterView>) {
        let open = matches!(rec.state.as_str(), PENDING | IN_PROGRESS | FAILED);
        let Some(view) = view else {
            if open {
                let message = format!(
                    "no longer selected (excluded, relabelled, deleted, or outside this \
                     controller's namespaces and labels) while {}; not changed further",
                    rec.state
                );
                set(rec, SKIPPED, NO_LONGER_SELECTED, message);
            }
            return;
        };
        if rec.state == SKIPPED && rec.reason.as_deref() == Some(NO_LONGER_SELECTED) {
            // Selected again: judged afresh (its change, if any, is found
            // again from managedFields).
            set(rec, PENDING, "Selected", "selected again");
        }
        if view.deleting && open {
            set(rec, SKIPPED, "Deleted", "the EtcdCluster is being deleted");
            return;
        }
        match rec.state.as_str() {
            PENDING => self.pending(rec, view),
            IN_PROGRESS => self.in_progress(rec, view),
            FAILED if self.resume => self.resumed(rec, view),
            DONE => {
                let edit = rec
                    .changed_at
                    .as_ref()
                    .and_then(|t| view.changed_after_write(self.spec, self.manager, t.0));
                if let Some(edit) = edit {
                    self.edited(rec, &edit, "after it converged");
                }
            }
            _ => {}
        }
    }

    fn pending(&self, rec: &mut ClusterRolloutStatus, view: &ClusterView) {
        if let Some(at) = view.written_by(self.spec, self.manager) {
            // Written by this rollout, the record lost (a restart between
            // the write and the status write): found from managedFields.
            let at = if at == Timestamp::default() {
                self.now
            } else {
                at
            };
            rec.changed_at = Some(time(at));
            set(
                rec,
                IN_PROGRESS,
                "Changed",
                "changed by this rollout (found from the cluster's managedFields)",
            );
            return self.in_progress(rec, view);
        }
        if view.already_matches(self.spec) {
            set(
                rec,
                DONE,
                "AlreadyMatched",
                "the cluster already runs the change; not written",
            );
            return;
        }
        if let Some(edit) = view.edited_since(self.spec, self.manager, self.started_at) {
            self.edited(rec, &edit, "after this rollout started");
        }
    }

    fn in_progress(&self, rec: &mut ClusterRolloutStatus, view: &ClusterView) {
        let written = rec.changed_at.as_ref().map_or(self.now, |t| t.0);
        if let Some(edit) = view.changed_after_write(self.spec, self.manager, written) {
            return self.edited(rec, &edit, "after this rollout changed it");
        }
        if !view.spec_matches(self.spec) {
            // The cache has not seen the write yet.
            return;
        }
        if view.converged(self.spec) {
            rec.converged_at = Some(time(self.now));
            let from = rec.from_version.as_deref().unwrap_or("?");
            let to = view.reported.current_version.as_deref().unwrap_or("?");
            return set(
                rec,
                DONE,
                "Converged",
                format!("converged: {from} → {to}, healthy"),
            );
        }
        if let Some((reason, message)) = view.refusal() {
            return set(rec, FAILED, reason, message);
        }
        if let Some(alarm) = view.alarm() {
            return set(rec, FAILED, "Alarm", alarm);
        }
        let took = elapsed(rec.changed_at.as_ref(), self.now);
        if took > self.progress_deadline {
            let last = view
                .reported
                .progressing
                .as_ref()
                .map_or_else(String::new, |p| format!("; last report: {}", p.message));
            let health = view
                .healthy()
                .err()
                .map_or_else(String::new, |h| format!("; {h}"));
            return set(
                rec,
                FAILED,
                "ProgressDeadlineExceeded",
                format!(
                    "not converged {}s after the change (deadline {}s){last}{health}",
                    took.as_secs(),
                    self.progress_deadline.as_secs()
                ),
            );
        }
        if let Some(p) = view.reported.progressing.as_ref().filter(|p| p.is_true()) {
            rec.message = Some(etcdfleet_api::conditions::bounded(
                p.message.clone(),
                etcdfleet_api::conditions::ROLLOUT_MESSAGE_LIMIT,
            ));
        }
    }

    /// After a resume: a failed cluster that now converged is done; one
    /// never written is judged again at its turn; one written gets its
    /// deadline again.
    fn resumed(&self, rec: &mut ClusterRolloutStatus, view: &ClusterView) {
        if rec.changed_at.is_none() {
            set(
                rec,
                PENDING,
                "Resumed",
                "judged again at its turn after the resume",
            );
            return self.pending(rec, view);
        }
        rec.changed_at = Some(time(self.now));
        set(
            rec,
            IN_PROGRESS,
            "Resumed",
            "resumed: its progress deadline counts again from now",
        );
        self.in_progress(rec, view);
    }

    fn edited(&self, rec: &mut ClusterRolloutStatus, edit: &Edit, when: &str) {
        let by = if edit.by.is_empty() {
            "someone".to_string()
        } else {
            edit.by.join(", ")
        };
        set(
            rec,
            SKIPPED,
            EDITED_BY_PERSON,
            format!(
                "{} was set to {:?} by {by} {when}: a person's own edit wins; the rollout \
                 does not write this cluster again",
                edit.field.path(),
                edit.value
            ),
        );
    }
}
