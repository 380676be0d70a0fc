//! The rollout planner on small fleets made by hand, and a simulated fleet
//! driven to completion (every cluster written once, waves in order, never
//! more in flight than allowed, the soak kept).

use std::collections::BTreeMap;
use std::time::Duration;

use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::rollout::{MaintenanceWindow, RolloutStrategy, phase};
use etcdfleet_api::{
    ClusterRolloutStatus, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus, TemplateKind, TemplateRef,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::*;

const NAME: &str = "r";

fn t0() -> Timestamp {
    "2026-11-22T10:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(secs)).unwrap()
}

fn cond(status: &str, reason: &str) -> Option<ConditionView> {
    Some(ConditionView {
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason} message"),
        observed_generation: Some(1),
    })
}

/// A converged, healthy cluster at `version`, created and written by
/// `kubectl` before the rollout.
fn cluster(key: &str, version: &str) -> ClusterView {
    ClusterView {
        key: key.into(),
        resource_version: Some("1".into()),
        generation: Some(1),
        created: Some(at(-3600)),
        version: Some(version.into()),
        version_owners: vec![owner("kubectl", -3600)],
        reported: ReportedState {
            observed_generation: Some(1),
            current_version: Some(version.into()),
            available: cond("True", "QuorumHealthy"),
            degraded: cond("False", "AllMembersHealthy"),
            progressing: cond("False", "Converged"),
            version_accepted: cond("True", "Current"),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn owner(manager: &str, secs: i64) -> FieldOwner {
    FieldOwner {
        manager: manager.into(),
        operation: "Apply".into(),
        time: Some(at(secs)),
    }
}

/// What the API server and the cluster reconciler make of a cluster the
/// rollout wrote at `secs`: our manager owns the version, a new
/// generation, not converged yet.
fn written(mut c: ClusterView, version: &str, secs: i64) -> ClusterView {
    c.version = Some(version.into());
    c.version_owners = vec![owner(&manager_of(NAME), secs)];
    c.generation = Some(2);
    c.resource_version = Some("2".into());
    c.reported.progressing = cond("True", "RestartMember");
    c
}

/// The cluster reconciler finished the upgrade.
fn converged(mut c: ClusterView) -> ClusterView {
    for cond in [
        &mut c.reported.available,
        &mut c.reported.degraded,
        &mut c.reported.progressing,
        &mut c.reported.version_accepted,
    ]
    .into_iter()
    .flatten()
    {
        cond.observed_generation = c.generation;
    }
    c.reported.progressing = Some(ConditionView {
        observed_generation: c.generation,
        ..cond("False", "Converged").unwrap()
    });
    c.reported.observed_generation = c.generation;
    c.reported.current_version = c.version.clone();
    c
}

fn spec(version: &str) -> EtcdFleetRolloutSpec {
    EtcdFleetRolloutSpec {
        version: Some(version.into()),
        strategy: RolloutStrategy {
            canary: Some(1),
            wave_size: Some(2),
            max_in_flight: Some(1),
            soak: Some("60s".into()),
            progress_deadline: Some("600s".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn plan(
    spec: &EtcdFleetRolloutSpec,
    previous: &EtcdFleetRolloutStatus,
    clusters: &[ClusterView],
    now: Timestamp,
) -> Decision {
    plan_rollout(&RolloutInput {
        name: NAME,
        generation: Some(1),
        spec,
        previous,
        resume: None,
        now,
        clusters,
        poll: Duration::from_secs(5),
    })
}

fn record<'a>(d: &'a Decision, key: &str) -> &'a ClusterRolloutStatus {
    d.status
        .clusters
        .iter()
        .find(|r| r.name == key)
        .unwrap_or_else(|| panic!("no record of {key}: {:#?}", d.status.clusters))
}

fn applied(d: &Decision) -> Option<&str> {
    match &d.outcome.action {
        Action::Apply { cluster, .. } => Some(cluster),
        _ => None,
    }
}

fn fleet(n: usize, version: &str) -> Vec<ClusterView> {
    (0..n)
        .map(|i| cluster(&format!("ns/c{i:02}"), version))
        .collect()
}

#[test]
fn the_first_reconcile_cuts_waves_in_a_stable_order_and_writes_the_canary() {
    let mut clusters = fleet(5, "3.5.21");
    clusters.reverse();
    let d = plan(&spec("3.5.35"), &Default::default(), &clusters, t0());
    let waves: Vec<(String, i32)> = d
        .status
        .clusters
        .iter()
        .map(|r| (r.name.clone(), r.wave))
        .collect();
    assert_eq!(
        waves,
        [
            ("ns/c00", 1),
            ("ns/c01", 2),
            ("ns/c02", 2),
            ("ns/c03", 3),
            ("ns/c04", 3)
        ]
        .map(|(n, w)| (n.to_string(), w))
    );
    assert_eq!(applied(&d), Some("ns/c00"));
    assert_eq!(record(&d, "ns/c00").state, IN_PROGRESS);
    assert_eq!(record(&d, "ns/c00").from_version.as_deref(), Some("3.5.21"));
    assert_eq!(d.status.phase.as_deref(), Some(phase::PROGRESSING));
    assert_eq!(d.status.current_wave.as_deref(), Some("1/3"));
    assert_eq!(d.status.progress.as_deref(), Some("0/5"));
    assert_eq!(d.status.started_at.as_ref().map(|t| t.0), Some(t0()));
}

#[test]
fn a_cluster_in_flight_is_never_written_again_while_the_cache_lags() {
    let clusters = fleet(3, "3.5.21");
    let s = spec("3.5.35");
    let first = plan(&s, &Default::default(), &clusters, t0());
    // The cache still shows the old object: the record says it was written.
    let second = plan(&s, &first.status, &clusters, at(1));
    assert_eq!(applied(&second), None, "{:?}", second.outcome);
    // The status write was lost, the cache caught up: managedFields say so.
    let mut now = clusters.clone();
    now[0] = written(now[0].clone(), "3.5.35", 0);
    let lost = plan(&s, &Default::default(), &now, at(2));
    assert_eq!(applied(&lost), None, "{:?}", lost.outcome);
    assert_eq!(record(&lost, "ns/c00").state, IN_PROGRESS);
    assert_eq!(
        record(&lost, "ns/c00").changed_at.as_ref().map(|t| t.0),
        Some(t0())
    );
}

#[test]
fn a_wave_soaks_after_its_last_cluster_converged_before_the_next_starts() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    clusters[0] = converged(written(clusters[0].clone(), "3.5.35", 0));
    let done = plan(&s, &first.status, &clusters, at(30));
    assert_eq!(record(&done, "ns/c00").state, DONE);
    assert_eq!(done.status.phase.as_deref(), Some(phase::SOAKING));
    assert_eq!(applied(&done), None);
    assert_eq!(done.outcome.wake, Some(Duration::from_secs(5)));
    let soaking = plan(&s, &done.status, &clusters, at(89));
    assert_eq!(
        applied(&soaking),
        None,
        "60 s soak from 30 s: not before 90 s"
    );
    let next = plan(&s, &soaking.status, &clusters, at(90));
    assert_eq!(applied(&next), Some("ns/c01"));
    assert_eq!(next.status.current_wave.as_deref(), Some("2/2"));
}

#[test]
fn a_cluster_that_already_matches_is_done_without_a_write() {
    let s = spec("3.5.35");
    let clusters = vec![cluster("ns/a", "3.5.35"), cluster("ns/b", "3.5.21")];
    let d = plan(&s, &Default::default(), &clusters, t0());
    assert_eq!(record(&d, "ns/a").state, DONE);
    assert_eq!(record(&d, "ns/a").reason.as_deref(), Some("AlreadyMatched"));
    assert_eq!(
        applied(&d),
        Some("ns/b"),
        "the canary matched; wave 2 starts"
    );
}

#[test]
fn a_version_refused_in_wave_two_halts_before_the_wave_writes_anything() {
    let s = spec("3.5.35");
    let mut clusters = fleet(5, "3.5.21");
    clusters[2] = cluster("ns/c02", "3.6.16");
    let mut status = plan(&s, &Default::default(), &clusters, t0()).status;
    clusters[0] = converged(written(clusters[0].clone(), "3.5.35", 0));
    status = plan(&s, &status, &clusters, at(10)).status;
    let d = plan(&s, &status, &clusters, at(100));
    assert_eq!(applied(&d), None, "{:?}", d.outcome);
    assert_eq!(d.status.phase.as_deref(), Some(phase::HALTED));
    let refused = record(&d, "ns/c02");
    assert_eq!(
        (refused.state.as_str(), refused.reason.as_deref()),
        (FAILED, Some("VersionRefused"))
    );
    assert!(refused.message.as_deref().unwrap().contains("Downgrade"));
    for other in ["ns/c01", "ns/c03", "ns/c04"] {
        assert_eq!(record(&d, other).state, PENDING, "{other} untouched");
    }
    let halted = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Halted")
        .unwrap();
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "VersionRefused")
    );
    // Still halted later: nothing is written.
    let later = plan(&s, &d.status, &clusters, at(500));
    assert_eq!(applied(&later), None);
    assert_eq!(later.status.phase.as_deref(), Some(phase::HALTED));
}

#[test]
fn an_upgrade_not_finished_within_the_deadline_fails_and_halts() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    clusters[0] = written(clusters[0].clone(), "3.5.35", 0);
    let waiting = plan(&s, &first.status, &clusters, at(600));
    assert_eq!(record(&waiting, "ns/c00").state, IN_PROGRESS);
    let late = plan(&s, &waiting.status, &clusters, at(601));
    let rec = record(&late, "ns/c00");
    assert_eq!(
        (rec.state.as_str(), rec.reason.as_deref()),
        (FAILED, Some("ProgressDeadlineExceeded"))
    );
    assert!(
        rec.message
            .as_deref()
            .unwrap()
            .contains("RestartMember message")
    );
    assert_eq!(late.status.phase.as_deref(), Some(phase::HALTED));
    assert_eq!(applied(&late), None);
}

#[test]
fn a_refused_version_or_an_alarm_after_the_write_fails_at_once() {
    let s = spec("3.5.35");
    let mut clusters = fleet(2, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    let mut refused = written(clusters[0].clone(), "3.5.35", 0);
    refused.reported.version_accepted = Some(ConditionView {
        observed_generation: Some(2),
        ..cond("False", "Downgrade").unwrap()
    });
    clusters[0] = refused;
    let d = plan(&s, &first.status, &clusters, at(5));
    assert_eq!(
        record(&d, "ns/c00").reason.as_deref(),
        Some("VersionRefused")
    );
    let mut alarmed = written(cluster("ns/c00", "3.5.21"), "3.5.35", 0);
    alarmed.reported.degraded = cond("True", "AlarmNOSPACE");
    clusters[0] = alarmed;
    let d = plan(&s, &first.status, &clusters, at(5));
    assert_eq!(record(&d, "ns/c00").reason.as_deref(), Some("Alarm"));
    assert_eq!(d.status.phase.as_deref(), Some(phase::HALTED));
}

#[test]
fn a_persons_edit_wins_and_is_never_written_again() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    // After the rollout wrote c00, a person set it back.
    let mut edited = written(clusters[0].clone(), "3.5.35", 0);
    edited.version = Some("3.5.21".into());
    edited.version_owners = vec![owner("kubectl-patch", 3)];
    clusters[0] = edited;
    let d = plan(&s, &first.status, &clusters, at(5));
    let rec = record(&d, "ns/c00");
    assert_eq!(
        (rec.state.as_str(), rec.reason.as_deref()),
        (SKIPPED, Some("EditedByPerson"))
    );
    assert!(rec.message.as_deref().unwrap().contains("kubectl-patch"));
    assert_eq!(applied(&d), Some("ns/c01"), "the wave goes on");
    // A pending cluster a person edited after the start is left alone too.
    clusters[2].version = Some("3.5.30".into());
    clusters[2].version_owners = vec![owner("kubectl-edit", 4)];
    let d = plan(&s, &d.status, &clusters, at(6));
    assert_eq!(
        record(&d, "ns/c02").reason.as_deref(),
        Some("EditedByPerson")
    );
    // ...but not an edit from before the rollout started.
    clusters[2].version_owners = vec![owner("kubectl-edit", -5)];
    let d = plan(&s, &Default::default(), &clusters, t0());
    assert_eq!(record(&d, "ns/c02").state, PENDING);
}

#[test]
fn pause_abort_and_the_maintenance_window_write_nothing() {
    let clusters = fleet(3, "3.5.21");
    let mut paused = spec("3.5.35");
    paused.paused = Some(true);
    let d = plan(&paused, &Default::default(), &clusters, t0());
    assert_eq!(
        (applied(&d), d.status.phase.as_deref()),
        (None, Some(phase::PAUSED))
    );
    let resumed = plan(&spec("3.5.35"), &d.status, &clusters, at(1));
    assert_eq!(applied(&resumed), Some("ns/c00"));

    let mut aborted = spec("3.5.35");
    aborted.abort = Some(true);
    let d = plan(&aborted, &resumed.status, &clusters, at(2));
    assert_eq!(
        (applied(&d), d.status.phase.as_deref()),
        (None, Some(phase::ABORTED))
    );
    assert_eq!(
        record(&d, "ns/c00").state,
        IN_PROGRESS,
        "changed stays changed"
    );
    assert_eq!(
        record(&d, "ns/c01").state,
        PENDING,
        "untouched stays untouched"
    );
    // Aborted stays aborted even if the spec no longer says so.
    let d = plan(&spec("3.5.35"), &d.status, &clusters, at(3));
    assert_eq!(
        (applied(&d), d.status.phase.as_deref()),
        (None, Some(phase::ABORTED))
    );

    let mut windowed = spec("3.5.35");
    windowed.strategy.maintenance_window = Some(MaintenanceWindow {
        schedule: "0 22 * * *".into(),
        duration: "2h".into(),
    });
    let d = plan(&windowed, &Default::default(), &clusters, t0());
    assert_eq!(d.status.phase.as_deref(), Some(phase::WAITING_FOR_WINDOW));
    assert_eq!(d.outcome.wake, Some(Duration::from_secs(12 * 3600)));
    let d = plan(&windowed, &d.status, &clusters, at(12 * 3600));
    assert_eq!(applied(&d), Some("ns/c00"));
}

#[test]
fn a_halt_lifts_when_the_failed_cluster_is_excluded_or_resumed_once_fixed() {
    let s = spec("3.5.35");
    let mut clusters = fleet(2, "3.5.21");
    clusters[0].reported.degraded = cond("True", "MemberUnhealthy");
    let d = plan(&s, &Default::default(), &clusters, t0());
    assert_eq!(
        record(&d, "ns/c00").reason.as_deref(),
        Some("NotHealthyBeforeChange")
    );
    assert_eq!(d.status.phase.as_deref(), Some(phase::HALTED));
    // Excluded: no longer selected, the rollout goes on.
    let excluded = plan(&s, &d.status, &clusters[1..], at(1));
    assert_eq!(record(&excluded, "ns/c00").state, SKIPPED);
    assert_eq!(applied(&excluded), Some("ns/c01"));
    // Or fixed, and resumed with the annotation.
    clusters[0].reported.degraded = cond("False", "AllMembersHealthy");
    let still = plan(&s, &d.status, &clusters, at(1));
    assert_eq!(
        still.status.phase.as_deref(),
        Some(phase::HALTED),
        "fixed is not resumed"
    );
    let input = RolloutInput {
        name: NAME,
        generation: Some(1),
        spec: &s,
        previous: &d.status,
        resume: Some("now"),
        now: at(2),
        clusters: &clusters,
        poll: Duration::from_secs(5),
    };
    let resumed = plan_rollout(&input);
    assert_eq!(resumed.outcome.action, Action::AcknowledgeResume);
    assert_eq!(record(&resumed, "ns/c00").state, PENDING);
    assert_eq!(resumed.status.last_resume.as_deref(), Some("now"));
    let next = plan(&s, &resumed.status, &clusters, at(3));
    assert_eq!(applied(&next), Some("ns/c00"));
}

#[test]
fn a_changed_cluster_that_turns_unhealthy_during_the_soak_halts() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    clusters[0] = converged(written(clusters[0].clone(), "3.5.35", 0));
    let soaking = plan(&s, &first.status, &clusters, at(10));
    assert_eq!(soaking.status.phase.as_deref(), Some(phase::SOAKING));
    clusters[0].reported.available = cond("False", "QuorumLost");
    let d = plan(&s, &soaking.status, &clusters, at(20));
    assert_eq!(
        record(&d, "ns/c00").reason.as_deref(),
        Some("UnhealthyAfterChange")
    );
    assert_eq!(d.status.phase.as_deref(), Some(phase::HALTED));
}

#[test]
fn a_rebase_writes_the_template_and_is_done_once_the_template_is_applied() {
    let target = TemplateRef {
        kind: TemplateKind::ClusterEtcdTemplate,
        name: "ha-3-v2".into(),
    };
    let s = EtcdFleetRolloutSpec {
        version: None,
        template_ref: Some(target.clone()),
        ..spec("3.5.35")
    };
    let mut c = cluster("ns/a", "3.5.21");
    c.target_template_generation = Some(4);
    let d = plan(&s, &Default::default(), std::slice::from_ref(&c), t0());
    assert_eq!(applied(&d), Some("ns/a"));
    c.template_ref = Some(target);
    c.template_owners = vec![owner(&manager_of(NAME), 0)];
    c.rebase_pending = true;
    c.generation = Some(2);
    let waiting = plan(&s, &d.status, std::slice::from_ref(&c), at(1));
    assert_eq!(
        record(&waiting, "ns/a").state,
        IN_PROGRESS,
        "rebase not done yet"
    );
    c.rebase_pending = false;
    c.reported.applied_template = Some(("ClusterEtcdTemplate".into(), "ha-3-v2".into(), Some(4)));
    let c = converged(c);
    let done = plan(&s, &waiting.status, std::slice::from_ref(&c), at(2));
    assert_eq!(record(&done, "ns/a").state, DONE);
}

/// The simulated cluster reconciler: a written cluster converges `delay`
/// seconds after the write.
struct Sim {
    clusters: Vec<ClusterView>,
    written_at: BTreeMap<String, i64>,
    writes: Vec<(i64, String)>,
}

impl Sim {
    fn step(&mut self, now: i64, delay: i64, target: &str) {
        for c in &mut self.clusters {
            if let Some(w) = self.written_at.get(&c.key)
                && now >= w + delay
                && c.reported.current_version.as_deref() != Some(target)
            {
                *c = converged(c.clone());
            }
        }
    }

    fn write(&mut self, key: &str, now: i64, target: &str) {
        let c = self.clusters.iter_mut().find(|c| c.key == key).unwrap();
        *c = written(c.clone(), target, now);
        self.written_at.insert(key.to_string(), now);
        self.writes.push((now, key.to_string()));
    }
}

#[test]
fn a_simulated_fleet_is_rolled_out_once_per_cluster_in_waves_within_the_limits() {
    let mut s = spec("3.5.35");
    s.strategy = RolloutStrategy {
        canary: Some(2),
        wave_percent: Some(30),
        max_in_flight: Some(3),
        soak: Some("20s".into()),
        progress_deadline: Some("600s".into()),
        ..Default::default()
    };
    let mut sim = Sim {
        clusters: fleet(23, "3.5.21"),
        written_at: BTreeMap::new(),
        writes: Vec::new(),
    };
    let mut status = EtcdFleetRolloutStatus::default();
    let mut max_in_flight = 0;
    let mut now = 0;
    while status.phase.as_deref() != Some(phase::COMPLETE) {
        assert!(now < 10_000, "not complete: {status:#?}");
        sim.step(now, 7, "3.5.35");
        let d = plan(&s, &status, &sim.clusters, at(now));
        if let Some(key) = applied(&d) {
            sim.write(key, now, "3.5.35");
        }
        max_in_flight = max_in_flight.max(d.status.counts.in_progress);
        status = d.status;
        now += 1;
    }
    let keys: Vec<&str> = sim.writes.iter().map(|(_, k)| k.as_str()).collect();
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((keys.len(), unique.len()), (23, 23), "each written once");
    assert!(max_in_flight <= 3, "{max_in_flight} in flight");
    // Waves: 2, then 7 each (30 % of 23, rounded up): 2 + 7 + 7 + 7.
    let sizes: Vec<i32> = status.waves.iter().map(|w| w.clusters).collect();
    assert_eq!(sizes, [2, 7, 7, 7]);
    // No write of a wave before the previous one converged and soaked.
    let wave_of = |key: &str| status.clusters.iter().find(|r| r.name == key).unwrap().wave;
    let soaked = |wave: i32| {
        status
            .clusters
            .iter()
            .filter(|r| r.wave == wave)
            .filter_map(|r| r.converged_at.as_ref())
            .map(|t| t.0)
            .max()
            .unwrap()
            .checked_add(SignedDuration::from_secs(20))
            .unwrap()
    };
    let starts: Vec<(Timestamp, Timestamp)> = sim
        .writes
        .windows(2)
        .filter(|pair| wave_of(&pair[1].1) > wave_of(&pair[0].1))
        .map(|pair| (at(pair[1].0), soaked(wave_of(&pair[0].1))))
        .collect();
    assert_eq!(starts.len(), 3, "three waves after the canary");
    assert!(
        starts.iter().all(|(start, soaked)| start >= soaked),
        "{starts:?}"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    );
    assert_eq!(status.progress.as_deref(), Some("23/23"));
}

// Judged once, when `Work` is built: the rules only read what follows.

fn input<'a>(
    spec: &'a EtcdFleetRolloutSpec,
    previous: &'a EtcdFleetRolloutStatus,
    clusters: &'a [ClusterView],
    now: Timestamp,
) -> RolloutInput<'a> {
    RolloutInput {
        name: NAME,
        generation: Some(1),
        spec,
        previous,
        resume: None,
        now,
        clusters,
        poll: Duration::from_secs(5),
    }
}

fn judged<'a>(work: &'a Work, key: &str) -> &'a ClusterRolloutStatus {
    work.records.iter().find(|r| r.name == key).unwrap()
}

fn marked(marks: &[Mark], work: &Work) -> Vec<(String, &'static str, &'static str)> {
    marks
        .iter()
        .map(|m| (work.records[m.record].name.clone(), m.state, m.reason))
        .collect()
}

#[test]
fn a_changed_cluster_of_the_current_wave_that_turns_unhealthy_fails_when_work_is_built() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    let first = plan(&s, &Default::default(), &clusters, t0());
    clusters[0] = converged(written(clusters[0].clone(), "3.5.35", 0));
    let soaking = plan(&s, &first.status, &clusters, at(10));
    clusters[0].reported.degraded = cond("True", "AlarmNOSPACE");
    let unhealthy = input(&s, &soaking.status, &clusters, at(20));
    let work = Work::new(&unhealthy);
    let rec = judged(&work, "ns/c00");
    assert_eq!(
        (rec.state.as_str(), rec.reason.as_deref()),
        (FAILED, Some("UnhealthyAfterChange"))
    );
    assert!(rec.message.as_deref().unwrap().contains("AlarmNOSPACE"));
    // Once its wave is done (soaked), the cluster is no longer watched.
    clusters[0].reported.degraded = cond("False", "AllMembersHealthy");
    let next = plan(&s, &soaking.status, &clusters, at(71));
    assert_eq!(applied(&next), Some("ns/c01"));
    clusters[0].reported.degraded = cond("True", "AlarmNOSPACE");
    let later = input(&s, &next.status, &clusters, at(72));
    assert_eq!(judged(&Work::new(&later), "ns/c00").state, DONE);
}

#[test]
fn the_version_gate_is_judged_with_the_work_and_written_only_when_it_answers() {
    let s = spec("3.5.35");
    let mut clusters = fleet(3, "3.5.21");
    clusters[2] = cluster("ns/c02", "3.6.16");
    let mut status = plan(&s, &Default::default(), &clusters, t0()).status;
    clusters[0] = converged(written(clusters[0].clone(), "3.5.35", 0));
    status = plan(&s, &status, &clusters, at(10)).status;
    let gated = input(&s, &status, &clusters, at(100));
    let work = Work::new(&gated);
    assert_eq!(
        marked(&work.refused, &work),
        [("ns/c02".to_string(), FAILED, "VersionRefused")]
    );
    assert_eq!(
        judged(&work, "ns/c02").state,
        PENDING,
        "judged, not written"
    );
    // Paused answers before the gate: its marks are not written.
    let mut paused = s.clone();
    paused.paused = Some(true);
    let d = plan(&paused, &status, &clusters, at(100));
    assert_eq!(d.status.phase.as_deref(), Some(phase::PAUSED));
    assert_eq!(record(&d, "ns/c02").state, PENDING);
    assert!(d.outcome.marks.is_empty());
}

#[test]
fn the_turn_skips_paused_follows_what_is_asked_already_and_writes_the_next() {
    let mut s = spec("3.5.35");
    s.strategy.canary = Some(4);
    s.strategy.max_in_flight = Some(2);
    let mut clusters = fleet(4, "3.5.21");
    clusters[0].paused = true;
    // c01's spec already asks for the target (a person's edit before the start).
    clusters[1].version = Some("3.5.35".into());
    clusters[1].version_owners = vec![owner("kubectl", -60)];
    let none = EtcdFleetRolloutStatus::default();
    let first = input(&s, &none, &clusters, t0());
    let work = Work::new(&first);
    assert_eq!(
        marked(&work.turn.marks, &work),
        [
            ("ns/c00".to_string(), SKIPPED, "ClusterPaused"),
            ("ns/c01".to_string(), IN_PROGRESS, "AlreadyRequested"),
            ("ns/c02".to_string(), IN_PROGRESS, "Changed"),
        ]
    );
    assert!(matches!(&work.turn.end, turn::TurnEnd::Write { cluster, .. } if cluster == "ns/c02"));
    assert!(
        work.records.iter().all(|r| r.state == PENDING),
        "judged, not written"
    );
    let d = plan_rollout(&first);
    assert_eq!(applied(&d), Some("ns/c02"));
    assert_eq!(
        record(&d, "ns/c01").changed_at.as_ref().map(|t| t.0),
        Some(t0())
    );
    assert_eq!(
        record(&d, "ns/c03").state,
        PENDING,
        "two in flight: the limit"
    );

    // One in flight allowed: the followed cluster fills it, nothing is written,
    // and the wait that answers carries the turn's marks.
    s.strategy.max_in_flight = Some(1);
    let d = plan(&s, &Default::default(), &clusters, t0());
    assert_eq!(applied(&d), None);
    assert_eq!(d.rule, "next cluster");
    assert_eq!(d.outcome.message, "wave 1: waiting for ns/c01 to converge");
    assert_eq!(record(&d, "ns/c00").state, SKIPPED);
    assert_eq!(record(&d, "ns/c02").state, PENDING);
}
