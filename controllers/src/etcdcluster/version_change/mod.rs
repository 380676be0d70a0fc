//! Changes of etcd minor version, beyond the rolling restart every version
//! change shares: the preflight before a change of minor starts
//! ([`preupgrade`]) and etcd's online downgrade ([`downgrade`]). Both are
//! pure functions of the planner's [`Observation`] that answer a plan or
//! nothing; [`act`] takes their steps.
//!
//! They are seated in `plan::plan_next_step` by one call each, before the
//! workload objects are written: the StatefulSet write is what starts a
//! roll, so whatever must come before the first member moves (a snapshot,
//! etcd's `downgrade enable`) comes before that write.

pub mod act;
pub mod downgrade;
pub mod preupgrade;

use std::fmt;

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::version::VersionChange;
use k8s_openapi::api::core::v1::Pod;

use super::plan::{ObjectKind, Observation, Plan, Step};

/// What a version rule answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// This is the plan.
    Take(Plan),
    /// The StatefulSet must not be written yet (`why`); every other rule
    /// plans as usual, and a cluster otherwise converged waits.
    HoldStatefulSet(String),
}

/// The version rules seated in the planner: the preflight, then the
/// downgrade, decide or hold the StatefulSet; `rest` (the other rules)
/// plans otherwise; a converged cluster that ran an acknowledged downgrade
/// forgets its acknowledgement.
pub fn gate(obs: &Observation, rest: impl Fn(&Observation) -> Plan) -> Plan {
    match preupgrade::preflight(obs).or_else(|| downgrade::next(obs)) {
        Some(Gate::Take(plan)) => plan,
        Some(Gate::HoldStatefulSet(why)) => {
            let mut held = obs.clone();
            held.stale_objects.retain(|k| *k != ObjectKind::StatefulSet);
            match rest(&held) {
                Plan::Converged => Plan::Wait(why),
                other => other,
            }
        }
        None => match rest(obs) {
            Plan::Converged => downgrade::forget_acknowledgement(obs)
                .map_or(Plan::Converged, |step| Plan::Act(Step::Version(step))),
            other => other,
        },
    }
}

/// What the version rules see beyond the rest of the observation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionObservation {
    /// The change of minor the spec asks for and the policy accepted
    /// (`from` is `status.currentVersion`), if any.
    pub minor_change: Option<(semver::Version, semver::Version)>,
    /// The cluster's backup destination, as a person reads it, if it has one.
    pub backup_destination: Option<String>,
    /// `status.versionChangeSnapshot` records a snapshot for `minor_change`.
    pub snapshot_taken: bool,
    /// Member pods whose etcd runs with the v2 store enabled.
    pub v2_enabled: Vec<String>,
}

/// A step of a version change (see [`act`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionStep {
    /// Stream a snapshot from a healthy member to the backup destination,
    /// verify it and record it in `status.versionChangeSnapshot`.
    SnapshotBefore { from: String, to: String },
    /// `etcdctl downgrade validate <target>`, then `enable <target>`.
    EnableDowngrade { target: String },
    /// `etcdctl downgrade cancel`: the spec no longer asks for the enabled
    /// downgrade. The acknowledgement is withdrawn with it.
    CancelDowngrade { target: String },
    /// Remove `etcdfleet.dev/allow-downgrade` once the cluster runs the
    /// version it acknowledged.
    ForgetAcknowledgement { version: String },
}

impl VersionStep {
    /// Short name for events, metrics and `status.lastOperation.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            VersionStep::SnapshotBefore { .. } => "SnapshotBeforeVersionChange",
            VersionStep::EnableDowngrade { .. } => "EnableDowngrade",
            VersionStep::CancelDowngrade { .. } => "CancelDowngrade",
            VersionStep::ForgetAcknowledgement { .. } => "ForgetDowngradeAcknowledgement",
        }
    }
}

impl fmt::Display for VersionStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionStep::SnapshotBefore { from, to } => write!(
                f,
                "take a snapshot to the backup destination before moving from {from} to {to}"
            ),
            VersionStep::EnableDowngrade { target } => {
                write!(f, "validate and enable etcd's online downgrade to {target}")
            }
            VersionStep::CancelDowngrade { target } => write!(
                f,
                "cancel etcd's downgrade to {target}: the spec no longer asks for it"
            ),
            VersionStep::ForgetAcknowledgement { version } => write!(
                f,
                "remove the downgrade acknowledgement: the cluster runs {version}"
            ),
        }
    }
}

/// `MAJOR.MINOR` of a version etcd reports (`3.6.16`, `3.5.0`); `None` for
/// anything else (an empty storage version of a 3.5 member).
pub fn minor_of(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether etcd's command line or environment enables the v2 store
/// (`--enable-v2`, `ETCD_ENABLE_V2=true`): what etcd's 3.6 upgrade guide
/// asks to check with `etcdutl check v2store` before upgrading.
pub fn v2_store_enabled(args: &[String], env: &[(String, String)]) -> bool {
    let flag = args.iter().any(|a| {
        let a = a.trim_start_matches('-');
        a == "enable-v2" || a.strip_prefix("enable-v2=").is_some_and(|v| v != "false")
    });
    flag || env
        .iter()
        .any(|(k, v)| k == "ETCD_ENABLE_V2" && v.eq_ignore_ascii_case("true"))
}

/// The version rules' view of `cluster`: the accepted change and what the
/// member pods run with. Read only.
pub fn observe(
    cluster: &EtcdCluster,
    change: Option<&VersionChange>,
    pods: &[&Pod],
) -> VersionObservation {
    let minor_change = change
        .and_then(VersionChange::crosses_minor)
        .map(|(from, to)| (from.clone(), to.clone()));
    let destination = cluster
        .spec
        .config
        .backup
        .as_ref()
        .and_then(|b| b.destination.as_ref());
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.version_change_snapshot.as_ref());
    let snapshot_taken = match (&minor_change, recorded) {
        (Some((from, to)), Some(r)) => r.from == from.to_string() && r.to == to.to_string(),
        _ => false,
    };
    let v2_enabled = pods
        .iter()
        .filter(|pod| {
            let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
                return false;
            };
            let env: Vec<(String, String)> = c
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect();
            v2_store_enabled(c.args.as_deref().unwrap_or_default(), &env)
        })
        .filter_map(|pod| pod.metadata.name.clone())
        .collect();
    VersionObservation {
        minor_change,
        backup_destination: destination.map(describe_destination),
        snapshot_taken,
        v2_enabled,
    }
}

/// `s3://bucket/prefix` or the directory, for messages.
pub fn describe_destination(d: &etcdfleet_api::ObjectStoreDestination) -> String {
    let prefix = d.prefix.as_deref().unwrap_or_default();
    match (&d.bucket, &d.path) {
        (Some(bucket), _) => format!("s3://{bucket}/{prefix}"),
        (None, Some(path)) => format!("{path}/{prefix}"),
        (None, None) => "an incomplete destination".to_string(),
    }
    .trim_end_matches('/')
    .to_string()
}

/// The observation of a converged cluster has no version change: used by
/// callers that plan from stored status only.
pub fn none() -> VersionObservation {
    VersionObservation::default()
}

/// Whether the StatefulSet still has to be (re)written: the roll of a
/// version change has not started.
fn statefulset_pending(obs: &Observation) -> bool {
    obs.stale_objects.contains(&ObjectKind::StatefulSet)
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Observations of a converged cluster on a version, and the edits the
    //! version rules' tests make to them.
    use std::collections::BTreeSet;
    use std::time::Duration;

    use crate::etcd::{ClusterHealth, Member, MemberObservation, MemberStatus};
    use crate::etcdcluster::plan::{
        EtcdObservation, FailedStep, ObjectKind, Observation, PodObservation, PvcObservation,
        RestoreGate, StatefulSetObservation,
    };
    use crate::render::Names;

    fn member(names: &Names, ordinal: u32, version: &str) -> MemberObservation {
        let id = 100 + u64::from(ordinal);
        MemberObservation {
            member: Member {
                id,
                name: names.pod(ordinal),
                peer_urls: vec![names.peer_url(ordinal, true)],
                client_urls: vec![names.client_url(ordinal, true)],
                is_learner: false,
            },
            status: Some(MemberStatus {
                member_id: id,
                version: version.into(),
                leader: 100,
                raft_index: 50,
                raft_term: 2,
                raft_applied_index: 50,
                db_size: 1,
                db_size_in_use: 1,
                is_learner: false,
                errors: vec![],
                storage_version: String::new(),
                downgrade_target: None,
            }),
            healthy: true,
            error: None,
        }
    }

    /// `n` healthy members on `version`, the spec asking for it, converged.
    pub fn cluster(version: &str, n: u32) -> Observation {
        let names = Names::new("c", "etcd-system");
        let image = format!("etcd:v{version}");
        let pod = PodObservation {
            image: image.clone(),
            template_hash: None,
            running: true,
            ready: true,
            restart_count: 0,
            deleting: false,
            ready_means_etcd_healthy: false,
        };
        let pvc = |o: u32| PvcObservation {
            member_id: Some(100 + u64::from(o)),
            owner_recorded: true,
            etcd_version: Some(version.into()),
        };
        Observation {
            tls: true,
            desired_replicas: n,
            stale_objects: vec![],
            statefulset: Some(StatefulSetObservation {
                replicas: n,
                image,
                template_hash: None,
            }),
            pods: (0..n).map(|o| (o, pod.clone())).collect(),
            pvcs: (0..n).map(|o| (o, pvc(o))).collect(),
            etcd: EtcdObservation::Observed(ClusterHealth::new(
                (0..n).map(|o| member(&names, o, version)).collect(),
            )),
            names,
            failed_members: BTreeSet::new(),
            failed_long_ago: BTreeSet::new(),
            alarms: vec![],
            conflicts: vec![],
            pki_lost: false,
            storage_change: None,
            requested_version: Some(version.into()),
            downgrade_acknowledged: None,
            version: super::VersionObservation::default(),
            known_voters: n,
            last_failure: None,
            restore: RestoreGate::NotNeeded,
        }
    }

    /// The spec asks for `to`, a minor away; the StatefulSet is not
    /// rewritten yet.
    pub fn minor_change(mut obs: Observation, to: &str) -> Observation {
        let from = obs.requested_version.clone().unwrap();
        obs.requested_version = Some(to.into());
        obs.version.minor_change = Some((from.parse().unwrap(), to.parse().unwrap()));
        obs.stale_objects = vec![ObjectKind::StatefulSet];
        obs
    }

    /// A downgrade to `to`, acknowledged or not.
    pub fn downgrade_to(obs: Observation, to: &str, acknowledged: bool) -> Observation {
        let mut obs = minor_change(obs, to);
        obs.downgrade_acknowledged = acknowledged.then(|| to.to_string());
        obs
    }

    /// Member `ordinal` does not answer.
    pub fn sick(obs: Observation, ordinal: u32) -> Observation {
        set(obs, |o, m| {
            if o == ordinal {
                m.status = None;
                m.healthy = false;
                m.error = Some("connection refused".into());
            }
        })
    }

    /// Edits what every member's status says.
    pub fn set_members(obs: Observation, edit: impl Fn(u32, &mut MemberStatus)) -> Observation {
        set(obs, |o, m| {
            if let Some(s) = m.status.as_mut() {
                edit(o, s);
            }
        })
    }

    fn set(mut obs: Observation, edit: impl Fn(u32, &mut MemberObservation)) -> Observation {
        let EtcdObservation::Observed(health) = &obs.etcd else {
            return obs;
        };
        let members = health
            .members()
            .iter()
            .cloned()
            .map(|mut m| {
                edit((m.member.id - 100) as u32, &mut m);
                m
            })
            .collect();
        obs.etcd = EtcdObservation::Observed(ClusterHealth::new(members));
        obs
    }

    /// The last step failed `failures` times, `age_secs` ago.
    pub fn failed(kind: &str, failures: u32, age_secs: u64, message: &str) -> FailedStep {
        FailedStep {
            kind: kind.into(),
            failures,
            age: Duration::from_secs(age_secs),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_v2_store_counts_as_enabled_only_when_a_flag_or_env_says_so() {
        let env = |v: &str| vec![("ETCD_ENABLE_V2".to_string(), v.to_string())];
        assert!(!v2_store_enabled(&strings(&["--name=a"]), &[]));
        assert!(v2_store_enabled(&strings(&["--enable-v2"]), &[]));
        assert!(v2_store_enabled(&strings(&["--enable-v2=true"]), &[]));
        assert!(!v2_store_enabled(&strings(&["--enable-v2=false"]), &[]));
        assert!(v2_store_enabled(&[], &env("true")));
        assert!(!v2_store_enabled(&[], &env("false")));
    }

    #[test]
    fn minors_of_versions_etcd_reports() {
        assert_eq!(minor_of("3.6.16"), Some((3, 6)));
        assert_eq!(minor_of("3.5.0"), Some((3, 5)));
        assert_eq!(minor_of(""), None);
    }

    #[test]
    fn destinations_read_as_a_person_writes_them() {
        let d = etcdfleet_api::ObjectStoreDestination {
            bucket: Some("backups".into()),
            prefix: Some("prod".into()),
            ..Default::default()
        };
        assert_eq!(describe_destination(&d), "s3://backups/prod");
        let d = etcdfleet_api::ObjectStoreDestination {
            path: Some("/srv/snapshots".into()),
            ..Default::default()
        };
        assert_eq!(describe_destination(&d), "/srv/snapshots");
    }
}
