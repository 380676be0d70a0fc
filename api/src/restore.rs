//! Restore: `EtcdCluster.spec.bootstrap.restore`, which seeds a new cluster
//! from a snapshot, and the pure decision whether a cluster may be
//! bootstrapped from it. No I/O: the controller observes the backup and the
//! object, this module judges what it saw.
//!
//! A restore is part of a cluster's identity: it is honoured only when the
//! cluster is first bootstrapped (no StatefulSet exists yet) and the field is
//! immutable (it can be neither added to nor changed on an existing cluster;
//! the CEL rule lives on `EtcdClusterSpec`).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::EtcdBackupStatus;
use crate::backup::phase;
use crate::destination::ObjectStoreDestination;

/// How a new cluster starts: empty (no field), from a snapshot
/// (`restore`), or by joining and taking over an etcd that runs already
/// (`join`, see [`crate::adopt`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.restore) && has(self.join))").message("bootstrap takes restore or join, not both"))]
pub struct BootstrapSpec {
    /// Seed the first member from a snapshot instead of starting empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreSource>,
    /// Join a running etcd cluster and take it over, member by member,
    /// keeping its data, its cluster ID and its CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<crate::adopt::JoinSpec>,
}

/// The snapshot a new cluster starts from: an `EtcdBackup` in the cluster's
/// namespace (`backupName`), or an object named directly (`destination` +
/// `objectKey` + `sha256`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.backupName) != has(self.objectKey)").message("exactly one of backupName (an EtcdBackup) or objectKey (with destination and sha256) must be set"))]
#[x_kube(validation = Rule::new("!has(self.objectKey) || (has(self.destination) && has(self.sha256))").message("objectKey needs destination and sha256"))]
#[x_kube(validation = Rule::new("!has(self.backupName) || (!has(self.destination) && !has(self.sha256) && !has(self.sizeBytes))").message("with backupName, destination, sha256 and sizeBytes come from the EtcdBackup's status"))]
pub struct RestoreSource {
    /// A `Succeeded` `EtcdBackup` in the cluster's namespace; its status names
    /// the object, its size and SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("backupName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub backup_name: Option<String>,
    /// Where the object is (as in backups; credentials from the Secret it names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ObjectStoreDestination>,
    /// Key of the snapshot object inside the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("objectKey must not be empty"))]
    pub object_key: Option<String>,
    /// Hex SHA-256 the object must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("sha256 must be 64 lowercase hex digits"))]
    pub sha256: Option<String>,
    /// Bytes the object must hold (optional with `objectKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("sizeBytes must be positive"))]
    pub size_bytes: Option<i64>,
    /// Image of the init container that fetches, verifies and restores the
    /// snapshot (it runs `etcdfleet restore-seed`). Default: the controller's
    /// own image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeder_image: Option<String>,
}

/// Condition type on an `EtcdCluster` whose restore was refused.
pub const RESTORE_FAILED: &str = "RestoreFailed";

/// Reasons of `RestoreFailed`.
pub mod reason {
    /// The named `EtcdBackup` does not exist.
    pub const BACKUP_NOT_FOUND: &str = "BackupNotFound";
    /// `backupName` is no object name (nothing is read).
    pub const INVALID_REFERENCE: &str = "InvalidReference";
    /// The named `EtcdBackup` has not succeeded (yet, or ever).
    pub const BACKUP_NOT_SUCCEEDED: &str = "BackupNotSucceeded";
    /// The `EtcdBackup`'s status lacks the object, size or checksum.
    pub const BACKUP_INCOMPLETE: &str = "BackupIncomplete";
    /// The snapshot object does not exist.
    pub const OBJECT_NOT_FOUND: &str = "ObjectNotFound";
    /// The object's size differs (truncated or grown).
    pub const SIZE_MISMATCH: &str = "SizeMismatch";
    /// The object's SHA-256 differs.
    pub const CHECKSUM_MISMATCH: &str = "ChecksumMismatch";
    /// The destination cannot be opened or read (credentials, network).
    pub const OBJECT_STORE_ERROR: &str = "ObjectStoreError";
    /// The snapshot was written by a newer etcd minor than `spec.version`:
    /// restoring it would downgrade the data.
    pub const SNAPSHOT_VERSION_TOO_NEW: &str = "SnapshotVersionTooNew";
    /// The snapshot was written by an etcd minor more than one below
    /// `spec.version`: restoring it would skip a minor.
    pub const SNAPSHOT_VERSION_TOO_OLD: &str = "SnapshotVersionTooOld";
    /// Nothing tells which etcd wrote the snapshot.
    pub const SNAPSHOT_VERSION_UNKNOWN: &str = "SnapshotVersionUnknown";
}

/// A snapshot a restore will use, once resolved: where, which key, and what
/// it must be.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRestore {
    pub destination: ObjectStoreDestination,
    pub object_key: String,
    pub sha256: String,
    /// `None`: only the checksum is checked (an object named directly without a size).
    pub size_bytes: Option<u64>,
    /// The etcd version of the member the snapshot was taken from, as its
    /// `EtcdBackup` recorded it (`None` for an object named directly).
    pub etcd_version: Option<String>,
}

/// The snapshot a cluster was bootstrapped from, recorded in
/// `status.restore` when the controller verified it, before the first
/// workload write. The seeder is rendered from this record, not from the
/// spec, so the pod template never changes because the `EtcdBackup` is pruned
/// later or the controller's default seeder image moves on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRecord {
    /// The `EtcdBackup` it came from, when named by `backupName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_name: Option<String>,
    /// Where the object is.
    pub destination: ObjectStoreDestination,
    /// Key of the snapshot object.
    pub object_key: String,
    /// Hex SHA-256 the object had when verified.
    pub sha256: String,
    /// Bytes the object held when verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Image of the init container that copies the seeder into the member pod.
    pub seeder_image: String,
    /// When the controller verified the object (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_time: Option<String>,
}

impl RestoreRecord {
    /// What the seeder must find (destination, key, checksum, size).
    pub fn expected(&self) -> ResolvedRestore {
        ResolvedRestore {
            destination: self.destination.clone(),
            object_key: self.object_key.clone(),
            sha256: self.sha256.clone(),
            size_bytes: self.size_bytes.and_then(|s| u64::try_from(s).ok()),
            etcd_version: None,
        }
    }
}

/// Why a restore source cannot be resolved (before any object is read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// One of [`reason`].
    pub reason: &'static str,
    /// Human message naming the backup or object and why.
    pub message: String,
}

/// Resolves `source` against the named `EtcdBackup` (as observed:
/// `Some(None)` = it exists without status, `None` = it does not exist).
/// Pure: the caller fetched the backup.
pub fn resolve_source(
    source: &RestoreSource,
    backup: Option<Option<&EtcdBackupStatus>>,
) -> Result<ResolvedRestore, Refusal> {
    if let Some(name) = &source.backup_name {
        let Some(status) = backup else {
            return Err(Refusal {
                reason: reason::BACKUP_NOT_FOUND,
                message: format!("EtcdBackup {name} does not exist"),
            });
        };
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if phase != phase::SUCCEEDED {
            return Err(Refusal {
                reason: reason::BACKUP_NOT_SUCCEEDED,
                message: format!("EtcdBackup {name} is {phase}, not {}", phase::SUCCEEDED),
            });
        }
        let s = status.cloned().unwrap_or_default();
        let etcd_version = s.etcd_version.filter(|v| !v.is_empty());
        let (Some(destination), Some(object_key), Some(sha256), Some(size)) =
            (s.destination, s.object_key, s.sha256, s.size_bytes)
        else {
            return Err(Refusal {
                reason: reason::BACKUP_INCOMPLETE,
                message: format!(
                    "EtcdBackup {name} succeeded but its status lacks destination, objectKey, \
                     sha256 or sizeBytes"
                ),
            });
        };
        let size_bytes = u64::try_from(size).map_err(|_| Refusal {
            reason: reason::BACKUP_INCOMPLETE,
            message: format!("EtcdBackup {name} records a negative size {size}"),
        })?;
        return Ok(ResolvedRestore {
            destination,
            object_key,
            sha256,
            size_bytes: Some(size_bytes),
            etcd_version,
        });
    }
    // The CRD's rules require these three together; an object written
    // without them (a server without CEL) is refused, never guessed at.
    match (&source.destination, &source.object_key, &source.sha256) {
        (Some(destination), Some(object_key), Some(sha256)) => Ok(ResolvedRestore {
            destination: destination.clone(),
            object_key: object_key.clone(),
            sha256: sha256.clone(),
            size_bytes: source.size_bytes.and_then(|s| u64::try_from(s).ok()),
            etcd_version: None,
        }),
        _ => Err(Refusal {
            reason: reason::BACKUP_INCOMPLETE,
            message: "restore needs backupName, or destination + objectKey + sha256".into(),
        }),
    }
}

/// What reading the object back showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectCheck {
    /// It exists; this many bytes with this SHA-256 were streamed through.
    Read { size: u64, sha256: String },
    /// It does not exist.
    NotFound,
    /// The store could not be read (credentials, network, configuration).
    Unreadable(String),
}

/// Judges the object against what the restore expects: `Ok` means the
/// cluster may be bootstrapped from it.
pub fn judge_object(expected: &ResolvedRestore, seen: &ObjectCheck) -> Result<(), Refusal> {
    let key = &expected.object_key;
    match seen {
        ObjectCheck::NotFound => Err(Refusal {
            reason: reason::OBJECT_NOT_FOUND,
            message: format!("snapshot object {key} does not exist"),
        }),
        ObjectCheck::Unreadable(why) => Err(Refusal {
            reason: reason::OBJECT_STORE_ERROR,
            message: format!("snapshot object {key} cannot be read: {why}"),
        }),
        ObjectCheck::Read { size, sha256 } => {
            if let Some(want) = expected.size_bytes
                && want != *size
            {
                // What was read is not reported: the key is the tenant's to
                // name, and the object need not be the tenant's.
                let how = if *size < want {
                    "truncated: smaller than"
                } else {
                    "larger than"
                };
                return Err(Refusal {
                    reason: reason::SIZE_MISMATCH,
                    message: format!(
                        "snapshot object {key} is {how} the {want} bytes the backup recorded"
                    ),
                });
            }
            if !sha256.eq_ignore_ascii_case(&expected.sha256) {
                return Err(Refusal {
                    reason: reason::CHECKSUM_MISMATCH,
                    message: format!(
                        "snapshot object {key} does not hold what was recorded: its SHA-256 \
                         is not {}",
                        expected.sha256
                    ),
                });
            }
            Ok(())
        }
    }
}

/// What a snapshot itself says about the etcd that wrote it: the cluster
/// version etcd keeps in its database (`MAJOR.MINOR.0`, the minor every
/// member agreed on), read while the snapshot is verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotVersion {
    /// The cluster version recorded in it, e.g. `3.5.0`.
    Recorded(String),
    /// etcd's database, but no cluster version in it (a cluster that never
    /// agreed on one).
    NotRecorded,
    /// Not readable as etcd's database (the reason).
    Unreadable(String),
}

/// Judges whether the snapshot may seed a cluster of etcd `requested`, by
/// the rule the version policy applies to data a cluster ran on: etcd runs
/// a data directory on the minor that wrote it or the next one up, never on
/// an older minor (no downgrade) and never two minors up (no skipped minor).
/// What wrote the snapshot is known from its `EtcdBackup` (the member's
/// version) and from the snapshot itself (the cluster version); the newest
/// of them must not be newer than `requested`, the oldest not more than one
/// minor older. A snapshot whose version nothing tells is refused. A
/// `requested` that is no full version is left to the version policy.
pub fn judge_version(
    expected: &ResolvedRestore,
    seen: &SnapshotVersion,
    requested: &str,
) -> Result<(), Refusal> {
    let Some(want) = crate::version::parse_full_version(requested) else {
        return Ok(());
    };
    let want = (want.major, want.minor);
    let key = &expected.object_key;
    let mut known: Vec<((u64, u64), String)> = Vec::new();
    if let Some(v) = &expected.etcd_version
        && let Some(minor) = minor_of(v)
    {
        known.push((minor, format!("its EtcdBackup records etcd {v}")));
    }
    if let SnapshotVersion::Recorded(v) = seen
        && let Some(minor) = minor_of(v)
    {
        known.push((minor, format!("the snapshot records cluster version {v}")));
    }
    let (Some(newest), Some(oldest)) = (known.iter().max(), known.iter().min()) else {
        return Err(version_unknown(key, seen));
    };
    let origin = known
        .iter()
        .map(|(_, d)| d.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let ((major, minor), _) = newest;
    if newest.0 > want {
        return Err(Refusal {
            reason: reason::SNAPSHOT_VERSION_TOO_NEW,
            message: format!(
                "snapshot object {key} was written by etcd {major}.{minor} ({origin}), a newer \
                 minor than spec.version {requested}: etcd cannot run an older minor on newer \
                 data. Set spec.version to a {major}.{minor}.x release to restore it"
            ),
        });
    }
    let ((major, minor), _) = oldest;
    if want > (*major, minor + 1) {
        return Err(Refusal {
            reason: reason::SNAPSHOT_VERSION_TOO_OLD,
            message: format!(
                "snapshot object {key} was written by etcd {major}.{minor} ({origin}), more \
                 than one minor below spec.version {requested}: etcd moves up one minor at a \
                 time. Restore it with spec.version {major}.{minor}.x or {major}.{}.x, then \
                 upgrade",
                minor + 1
            ),
        });
    }
    Ok(())
}

/// `(MAJOR, MINOR)` of `3.5`, `3.5.0` or `v3.5.1`.
fn minor_of(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn version_unknown(key: &str, seen: &SnapshotVersion) -> Refusal {
    let why = match seen {
        SnapshotVersion::Unreadable(why) => format!("it cannot be read as etcd's database: {why}"),
        _ => "it records no cluster version".to_string(),
    };
    Refusal {
        reason: reason::SNAPSHOT_VERSION_UNKNOWN,
        message: format!(
            "which etcd wrote snapshot object {key} cannot be told: no EtcdBackup records it and \
             {why}; restoring it could start an older etcd on newer data. Restore from an \
             EtcdBackup (it records the version) or from a snapshot of a running cluster"
        ),
    }
}

/// Name of the marker file the seeder leaves in a member's data directory
/// after restoring: it holds the SHA-256 of the snapshot restored, so a
/// restarted init container recognises its own work.
pub const RESTORE_MARKER: &str = ".etcdfleet-restored-from";

/// What the seeder finds in a member's data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataDirState {
    /// Nothing there (a new volume).
    Empty,
    /// Restored before from the snapshot with this SHA-256 (the marker).
    RestoredFrom(String),
    /// etcd data without our marker, or a marker of another snapshot.
    Foreign,
}

/// What the seeder does with a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedAction {
    /// Fetch, verify and restore.
    Restore,
    /// Already restored from this very snapshot: leave it, let etcd start.
    AlreadyDone,
    /// Refuse (exit non-zero): the volume holds other data, e.g. a PVC kept
    /// from a deleted cluster. Mixing it with the snapshot, or wiping it,
    /// would lose data silently; the operator deletes the PVC (or restores
    /// into another workload namespace).
    RefuseForeign,
}

/// The seeder's decision (pure).
pub fn seed_action(state: &DataDirState, sha256: &str) -> SeedAction {
    match state {
        DataDirState::Empty => SeedAction::Restore,
        DataDirState::RestoredFrom(s) if s.eq_ignore_ascii_case(sha256) => SeedAction::AlreadyDone,
        DataDirState::RestoredFrom(_) | DataDirState::Foreign => SeedAction::RefuseForeign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn dest() -> ObjectStoreDestination {
        ObjectStoreDestination {
            path: Some("/backups".into()),
            ..Default::default()
        }
    }

    fn succeeded() -> EtcdBackupStatus {
        EtcdBackupStatus {
            phase: Some(phase::SUCCEEDED.into()),
            destination: Some(dest()),
            object_key: Some("c/1.db".into()),
            sha256: Some(SHA.into()),
            size_bytes: Some(10),
            ..Default::default()
        }
    }

    fn by_name() -> RestoreSource {
        RestoreSource {
            backup_name: Some("b".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_or_unfinished_backup_is_refused_with_its_name() {
        let e = resolve_source(&by_name(), None).unwrap_err();
        assert_eq!(e.reason, reason::BACKUP_NOT_FOUND);
        assert!(e.message.contains("EtcdBackup b"), "{}", e.message);

        let running = EtcdBackupStatus {
            phase: Some(phase::RUNNING.into()),
            ..Default::default()
        };
        let e = resolve_source(&by_name(), Some(Some(&running))).unwrap_err();
        assert_eq!(e.reason, reason::BACKUP_NOT_SUCCEEDED);
        let e = resolve_source(&by_name(), Some(None)).unwrap_err();
        assert_eq!(e.reason, reason::BACKUP_NOT_SUCCEEDED);

        let mut partial = succeeded();
        partial.sha256 = None;
        let e = resolve_source(&by_name(), Some(Some(&partial))).unwrap_err();
        assert_eq!(e.reason, reason::BACKUP_INCOMPLETE);
    }

    #[test]
    fn a_succeeded_backup_resolves_to_its_recorded_object() {
        let r = resolve_source(&by_name(), Some(Some(&succeeded()))).unwrap();
        assert_eq!(r.object_key, "c/1.db");
        assert_eq!(r.sha256, SHA);
        assert_eq!(r.size_bytes, Some(10));
        assert_eq!(r.destination, dest());
    }

    #[test]
    fn a_direct_object_needs_destination_key_and_checksum() {
        let direct = RestoreSource {
            destination: Some(dest()),
            object_key: Some("x.db".into()),
            sha256: Some(SHA.into()),
            ..Default::default()
        };
        let r = resolve_source(&direct, None).unwrap();
        assert_eq!((r.object_key.as_str(), r.size_bytes), ("x.db", None));
        let no_sha = RestoreSource {
            sha256: None,
            ..direct
        };
        assert_eq!(
            resolve_source(&no_sha, None).unwrap_err().reason,
            reason::BACKUP_INCOMPLETE
        );
    }

    #[test]
    fn missing_truncated_and_corrupt_objects_are_refused_naming_the_key() {
        let r = resolve_source(&by_name(), Some(Some(&succeeded()))).unwrap();
        let cases = [
            (ObjectCheck::NotFound, reason::OBJECT_NOT_FOUND),
            (
                ObjectCheck::Unreadable("403".into()),
                reason::OBJECT_STORE_ERROR,
            ),
            (
                ObjectCheck::Read {
                    size: 4,
                    sha256: SHA.into(),
                },
                reason::SIZE_MISMATCH,
            ),
            (
                ObjectCheck::Read {
                    size: 10,
                    sha256: "b".repeat(64),
                },
                reason::CHECKSUM_MISMATCH,
            ),
        ];
        for (seen, want) in cases {
            let e = judge_object(&r, &seen).unwrap_err();
            assert_eq!(e.reason, want, "{seen:?}");
            assert!(e.message.contains("c/1.db"), "{}", e.message);
            // A tenant learns nothing of an object it does not own: not
            // its digest, not its size.
            let tenant_learns = ["b".repeat(64), " 4 bytes".to_string()];
            assert!(
                !tenant_learns.iter().any(|t| e.message.contains(t.as_str())),
                "{}",
                e.message
            );
        }
        let truncated = judge_object(
            &r,
            &ObjectCheck::Read {
                size: 4,
                sha256: SHA.into(),
            },
        )
        .unwrap_err();
        assert!(
            truncated.message.contains("truncated"),
            "{}",
            truncated.message
        );
        assert_eq!(
            judge_object(
                &r,
                &ObjectCheck::Read {
                    size: 10,
                    sha256: SHA.into()
                }
            ),
            Ok(())
        );
    }

    #[test]
    fn a_snapshot_restores_only_into_its_own_minor_or_the_next() {
        let from_backup = |v: &str| ResolvedRestore {
            etcd_version: Some(v.into()),
            ..resolve_source(&by_name(), Some(Some(&succeeded()))).unwrap()
        };
        let direct = ResolvedRestore {
            etcd_version: None,
            ..from_backup("")
        };
        let recorded = |v: &str| SnapshotVersion::Recorded(v.into());
        let not_recorded = SnapshotVersion::NotRecorded;
        // (backup's version, snapshot's own, spec.version, expected reason)
        let cases: &[(&ResolvedRestore, &SnapshotVersion, &str, Option<&str>)] = &[
            (&from_backup("3.5.1"), &recorded("3.5.0"), "3.5.1", None),
            (&from_backup("3.5.1"), &recorded("3.5.0"), "3.5.0", None),
            (&from_backup("3.5.1"), &recorded("3.5.0"), "3.6.0", None),
            (&from_backup("3.4.23"), &recorded("3.4.0"), "3.5.1", None),
            (&direct, &recorded("3.4.0"), "3.4.23", None),
            (&from_backup("3.4.23"), &not_recorded, "3.4.23", None),
            // Downgrades: by what the backup says, by what the snapshot says.
            (
                &from_backup("3.5.1"),
                &recorded("3.5.0"),
                "3.4.23",
                Some(reason::SNAPSHOT_VERSION_TOO_NEW),
            ),
            (
                &from_backup("3.5.1"),
                &not_recorded,
                "3.4.23",
                Some(reason::SNAPSHOT_VERSION_TOO_NEW),
            ),
            (
                &direct,
                &recorded("3.5.0"),
                "3.4.23",
                Some(reason::SNAPSHOT_VERSION_TOO_NEW),
            ),
            // A 3.5 member of a cluster still at 3.4 wrote 3.5 data.
            (
                &from_backup("3.5.1"),
                &recorded("3.4.0"),
                "3.4.23",
                Some(reason::SNAPSHOT_VERSION_TOO_NEW),
            ),
            (
                &direct,
                &recorded("3.6.0"),
                "3.5.1",
                Some(reason::SNAPSHOT_VERSION_TOO_NEW),
            ),
            // Skipped minors.
            (
                &from_backup("3.4.23"),
                &recorded("3.4.0"),
                "3.6.0",
                Some(reason::SNAPSHOT_VERSION_TOO_OLD),
            ),
            (
                &direct,
                &recorded("3.4.0"),
                "3.6.0",
                Some(reason::SNAPSHOT_VERSION_TOO_OLD),
            ),
            // Nothing tells.
            (
                &direct,
                &not_recorded,
                "3.5.1",
                Some(reason::SNAPSHOT_VERSION_UNKNOWN),
            ),
            (
                &direct,
                &SnapshotVersion::Unreadable("no magic".into()),
                "3.5.1",
                Some(reason::SNAPSHOT_VERSION_UNKNOWN),
            ),
            (
                &from_backup("garbage"),
                &not_recorded,
                "3.5.1",
                Some(reason::SNAPSHOT_VERSION_UNKNOWN),
            ),
        ];
        for (expected, seen, requested, want) in cases {
            let got = judge_version(expected, seen, requested);
            assert_eq!(
                got.as_ref().err().map(|r| r.reason),
                *want,
                "{:?} {seen:?} → {requested}: {got:?}",
                expected.etcd_version
            );
            // A refusal names the object.
            assert!(
                got.as_ref()
                    .err()
                    .is_none_or(|r| r.message.contains("c/1.db")),
                "{got:?}"
            );
        }
        let refused = judge_version(&from_backup("3.5.1"), &recorded("3.5.0"), "3.4.23")
            .unwrap_err()
            .message;
        for want in ["3.5", "3.5.1", "3.5.0", "3.4.23", "spec.version to a 3.5.x"] {
            assert!(refused.contains(want), "{want}: {refused}");
        }
        // A requested version the policy rejects is the policy's to report.
        assert_eq!(judge_version(&direct, &recorded("3.5.0"), "v3.4"), Ok(()));
    }

    #[test]
    fn the_seeder_restores_only_into_an_empty_or_its_own_data_dir() {
        assert_eq!(seed_action(&DataDirState::Empty, SHA), SeedAction::Restore);
        assert_eq!(
            seed_action(&DataDirState::RestoredFrom(SHA.into()), SHA),
            SeedAction::AlreadyDone
        );
        assert_eq!(
            seed_action(&DataDirState::RestoredFrom("b".repeat(64)), SHA),
            SeedAction::RefuseForeign
        );
        assert_eq!(
            seed_action(&DataDirState::Foreign, SHA),
            SeedAction::RefuseForeign
        );
    }
}
