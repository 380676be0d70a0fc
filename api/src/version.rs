//! The etcd version policy and the image a version runs as.
//!
//! `decide(current, requested)` is the one place that says whether a cluster
//! may move from the version it runs to the version its spec asks for. It is a
//! pure function of a small table of supported minors ([`SUPPORTED_MINORS`]);
//! the controller turns a rejection into `VersionAccepted=False` (with
//! `reason()` / `message()`) and touches nothing. [`notice`] says whether a
//! version is still supported by the etcd project (a warning, never a
//! refusal).
//!
//! Rules (etcd.io "Upgrading etcd clusters and applications"): patch upgrades
//! any distance up; minor upgrades one step at a time, and only from a patch the
//! etcd project names as safe; no skipping a minor. Downgrades: only one minor
//! down, only where etcd's online downgrade API exists (3.6 and later), only
//! to a patch of the lower minor that may move up again, and only when the
//! cluster carries the acknowledgement [`DOWNGRADE_ANNOTATION`] naming the
//! target ([`decide_with`]). Everything else that lowers the version is
//! refused.

use std::fmt;

use semver::Version;

/// Repository of the upstream etcd images, used when a cluster names none.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "gcr.io/etcd-development/etcd";

/// Annotation on an `EtcdCluster` that acknowledges a downgrade: its value
/// must be exactly the lowered `spec.version`, so a leftover acknowledgement
/// never authorizes another downgrade. The controller removes it once the
/// downgrade is complete.
pub const DOWNGRADE_ANNOTATION: &str = "etcdfleet.dev/allow-downgrade";

/// The only etcd major version this controller runs.
const SUPPORTED_MAJOR: u64 = 3;

/// Whether the etcd project still supports a minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Patch releases are still cut.
    Supported,
    /// No more patches: clusters keep running (a warning, not a refusal) and
    /// should move on to the next minor.
    EndOfSupport {
        /// When support ended, as the etcd project said it.
        since: &'static str,
    },
}

/// Early patches of a minor the etcd project advises against in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvisedAgainst {
    /// Patches below this one are affected.
    pub below_patch: u64,
    /// Why, in a few words.
    pub why: &'static str,
}

/// One supported minor of etcd 3.x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupportedMinor {
    /// The minor, e.g. `5` for 3.5.
    pub minor: u64,
    /// The lowest patch of this minor from which an upgrade to the next minor
    /// is safe; `None` when this is the newest supported minor.
    pub min_patch_for_next_minor: Option<u64>,
    /// Whether the etcd project still supports this minor.
    pub support: Support,
    /// Early patches not to run in production, if any.
    pub advised_against: Option<AdvisedAgainst>,
    /// etcd's online downgrade API (`downgrade validate|enable|cancel`) can
    /// take a cluster of this minor down to the previous one.
    pub online_downgrade: bool,
}

/// Supported etcd 3.x minors, oldest first. Sources, per row:
///
/// - **3.4** → 3.5 from any 3.4 patch: etcd.io docs v3.5
///   `upgrades/upgrade_3_5` (a rolling replacement of binaries on the same
///   data dirs; seen here with 3.4.23 → 3.5.1 and 3.5.35). Out of support:
///   etcd.io docs v3.6 `op-guide/versioning` ("when v3.6 is released, v3.4
///   goes out of support"); support ended in June 2026. No online
///   downgrade to 3.3.
/// - **3.5** → 3.6 from **3.5.32**: etcd.io docs v3.7 `upgrades/upgrade_3_6`,
///   "Update 3.5": "make sure that all of your 3.5 members are updated to
///   3.5.32 or later" (the bound was 3.5.20, then 3.5.24–3.5.26, after the
///   membership bugs etcd #19557, #20793, #20967; 3.5.32 adds
///   `--v2-deprecation=write-only-skip-check` and makes `etcdutl check
///   v2store` read WAL records). etcd itself enforces no patch: 3.6.16's
///   `etcdserver/cluster_util.go` `allowedVersionRange` admits any cluster
///   version from `MinClusterVersion` 3.0.0 up to its own minor, so this
///   table is the only guard. 3.5.0–3.5.2 advised against: the etcd project's
///   announcement of the data inconsistency fixed in 3.5.3. No online
///   downgrade from 3.5 (3.5 → 3.4 is the offline `--next-cluster-version-
///   compatible` procedure of docs v3.7 `downgrades/downgrade_3_5`, needing
///   3.4.32+).
/// - **3.6** → 3.7 from **3.6.11**: etcd.io docs v3.7 `upgrades/upgrade_3_7`,
///   "Update 3.6": "make sure that all of your 3.6 members are updated to
///   3.6.11 or later" (3.7.3's `cluster_util.go` again checks only the minor
///   window). Online downgrade to 3.5: docs v3.7 `downgrades/downgrade_3_6`;
///   3.6.16 `etcdserver/version/downgrade.go` allows exactly one minor down.
/// - **3.7**: released July 2026 (etcd blog "announcing etcd 3.7"); the
///   newest supported minor. Online downgrade to 3.6: docs v3.7
///   `downgrades/downgrade_3_7`; 3.7.3 `etcdserver/version/downgrade.go`.
pub const SUPPORTED_MINORS: &[SupportedMinor] = &[
    SupportedMinor {
        minor: 4,
        min_patch_for_next_minor: Some(0),
        support: Support::EndOfSupport { since: "June 2026" },
        advised_against: None,
        online_downgrade: false,
    },
    SupportedMinor {
        minor: 5,
        min_patch_for_next_minor: Some(32),
        support: Support::Supported,
        advised_against: Some(AdvisedAgainst {
            below_patch: 3,
            why: "a data inconsistency fixed in 3.5.3",
        }),
        online_downgrade: false,
    },
    SupportedMinor {
        minor: 6,
        min_patch_for_next_minor: Some(11),
        support: Support::Supported,
        advised_against: None,
        online_downgrade: true,
    },
    SupportedMinor {
        minor: 7,
        min_patch_for_next_minor: None,
        support: Support::Supported,
        advised_against: None,
        online_downgrade: true,
    },
];

/// An accepted version change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionChange {
    /// The cluster does not run yet: it is created at `requested`.
    Initial { requested: Version },
    /// The cluster already runs the requested version.
    NoChange { version: Version },
    /// A newer patch of the same minor.
    PatchUpgrade { from: Version, to: Version },
    /// The next minor, from a patch that is safe to upgrade from.
    MinorUpgrade { from: Version, to: Version },
    /// One minor down through etcd's online downgrade, acknowledged.
    Downgrade { from: Version, to: Version },
}

impl VersionChange {
    /// The version the cluster should run after this change.
    pub fn target(&self) -> &Version {
        match self {
            VersionChange::Initial { requested } => requested,
            VersionChange::NoChange { version } => version,
            VersionChange::PatchUpgrade { to, .. }
            | VersionChange::MinorUpgrade { to, .. }
            | VersionChange::Downgrade { to, .. } => to,
        }
    }

    /// Whether running members must be replaced to reach the target.
    pub fn is_upgrade(&self) -> bool {
        matches!(
            self,
            VersionChange::PatchUpgrade { .. } | VersionChange::MinorUpgrade { .. }
        )
    }

    /// A change of minor (up or down): the one that needs the preflight of
    /// a minor change (every member healthy, a snapshot first).
    pub fn crosses_minor(&self) -> Option<(&Version, &Version)> {
        match self {
            VersionChange::MinorUpgrade { from, to } | VersionChange::Downgrade { from, to } => {
                Some((from, to))
            }
            _ => None,
        }
    }
}

/// Which side of a change a bad version string was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionRole {
    /// The version the cluster runs now.
    Current,
    /// The version the spec asks for.
    Requested,
}

impl fmt::Display for VersionRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VersionRole::Current => "current",
            VersionRole::Requested => "requested",
        })
    }
}

/// A rejected version change. Nothing may be touched for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionRejection {
    /// Not a plain `MAJOR.MINOR.PATCH` version (prefixes, pre-releases and
    /// build metadata are rejected too).
    #[error("{}", self.message())]
    Invalid { role: VersionRole, value: String },
    /// Outside the supported table (major other than 3, or an unknown minor).
    #[error("{}", self.message())]
    UnsupportedVersion { version: Version },
    /// Lower than what the cluster runs, in a way etcd cannot go online
    /// (a patch downgrade, more than one minor, or from a minor without the
    /// downgrade API).
    #[error("{}", self.message())]
    Downgrade { from: Version, to: Version },
    /// A downgrade etcd can take online, but not acknowledged.
    #[error("{}", self.message())]
    DowngradeNotAcknowledged { from: Version, to: Version },
    /// A downgrade to a patch of the lower minor that could not move up again.
    #[error("{}", self.message())]
    DowngradeTargetTooOld {
        from: Version,
        to: Version,
        min_patch: Version,
    },
    /// More than one minor up.
    #[error("{}", self.message())]
    SkipsMinor { from: Version, to: Version },
    /// The next minor, but from a patch too old to upgrade from.
    #[error("{}", self.message())]
    PatchTooOldForMinorUpgrade {
        from: Version,
        to: Version,
        min_patch: Version,
    },
}

impl VersionRejection {
    /// A stable CamelCase reason, usable as a Kubernetes condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            VersionRejection::Invalid { .. } => "InvalidVersion",
            VersionRejection::UnsupportedVersion { .. } => "UnsupportedVersion",
            VersionRejection::Downgrade { .. } => "Downgrade",
            VersionRejection::DowngradeNotAcknowledged { .. } => "DowngradeNotAcknowledged",
            VersionRejection::DowngradeTargetTooOld { .. } => "DowngradeTargetTooOld",
            VersionRejection::SkipsMinor { .. } => "SkipsMinor",
            VersionRejection::PatchTooOldForMinorUpgrade { .. } => "PatchTooOldForMinorUpgrade",
        }
    }

    /// What is wrong and what to do, naming the versions and the rule.
    pub fn message(&self) -> String {
        match self {
            VersionRejection::Invalid { role, value } => format!(
                "{role} version {value:?} is not a full MAJOR.MINOR.PATCH version such as 3.5.35 \
                 (no \"v\" prefix, pre-release or build metadata)"
            ),
            VersionRejection::UnsupportedVersion { version } => format!(
                "etcd {version} is not supported; supported versions are {}",
                supported_list()
            ),
            VersionRejection::Downgrade { from, to } => downgrade_refused(from, to),
            VersionRejection::DowngradeNotAcknowledged { from, to } => format!(
                "downgrade from {from} to {to} goes through etcd's online downgrade (validate, \
                 enable, then each member replaced, leader last) and needs an acknowledgement: \
                 annotate the EtcdCluster {DOWNGRADE_ANNOTATION}={to} to go ahead, or set version \
                 back to {from}"
            ),
            VersionRejection::DowngradeTargetTooOld {
                from,
                to,
                min_patch,
            } => format!(
                "downgrade from {from} to {to} would land on a {}.{} patch that cannot be \
                 upgraded again: downgrade to {min_patch} or a newer {}.{} patch instead",
                to.major, to.minor, to.major, to.minor
            ),
            VersionRejection::SkipsMinor { from, to } => skips_minor(from, to),
            VersionRejection::PatchTooOldForMinorUpgrade {
                from,
                to,
                min_patch,
            } => format!(
                "upgrade from {from} to {to} requires {min_patch} or later first: \
                 upgrade to {min_patch} or a newer {}.{} patch, then to {to}",
                from.major, from.minor
            ),
        }
    }
}

fn downgrade_refused(from: &Version, to: &Version) -> String {
    let how = if from.minor == to.minor {
        "etcd has no downgrade between patches of one minor".to_string()
    } else if from.minor > to.minor + 1 {
        "etcd downgrades one minor at a time".to_string()
    } else {
        format!(
            "etcd {}.{} has no online downgrade to {}.{}",
            from.major, from.minor, to.major, to.minor
        )
    };
    format!(
        "downgrade from {from} to {to} is not supported: {how} (set version back to {from} or \
         newer; to go back further, restore a snapshot into a new EtcdCluster)"
    )
}

fn skips_minor(from: &Version, to: &Version) -> String {
    let next = Version::new(from.major, from.minor + 1, 0);
    let first = match minimum_for_next_minor(&next) {
        Some(gate) => format!(
            "first to {gate} or a newer {}.{} patch",
            next.major, next.minor
        ),
        None => format!("first to {}.{}.x", next.major, next.minor),
    };
    format!(
        "upgrade from {from} to {to} skips a minor version: upgrade one minor at a time \
         ({first}, then on to {to})"
    )
}

fn supported_list() -> String {
    SUPPORTED_MINORS
        .iter()
        .map(|m| format!("{SUPPORTED_MAJOR}.{}.x", m.minor))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a plain `MAJOR.MINOR.PATCH` version: no `v` prefix, no pre-release,
/// no build metadata, no leading zeros (semver's own rule).
pub fn parse_full_version(value: &str) -> Option<Version> {
    let version = Version::parse(value).ok()?;
    (version.pre.is_empty() && version.build.is_empty()).then_some(version)
}

/// The table row of `version`'s minor, if supported.
pub fn supported_minor(version: &Version) -> Option<&'static SupportedMinor> {
    if version.major != SUPPORTED_MAJOR {
        return None;
    }
    SUPPORTED_MINORS.iter().find(|m| m.minor == version.minor)
}

/// The lowest version of `version`'s minor that may move on to the next
/// minor (`3.5.32` for any 3.5), if there is a next minor.
pub fn minimum_for_next_minor(version: &Version) -> Option<Version> {
    let patch = supported_minor(version)?.min_patch_for_next_minor?;
    Some(Version::new(version.major, version.minor, patch))
}

/// Checks that `value` is a full version of a supported etcd minor.
pub fn parse_supported(value: &str, role: VersionRole) -> Result<Version, VersionRejection> {
    let version = parse_full_version(value).ok_or_else(|| VersionRejection::Invalid {
        role,
        value: value.to_string(),
    })?;
    if supported_minor(&version).is_none() {
        return Err(VersionRejection::UnsupportedVersion { version });
    }
    Ok(version)
}

/// Decides whether a cluster running `current` (None: not created yet) may
/// move to `requested`, with no downgrade acknowledged.
pub fn decide(current: Option<&str>, requested: &str) -> Result<VersionChange, VersionRejection> {
    decide_with(current, requested, None)
}

/// [`decide`], with the value of [`DOWNGRADE_ANNOTATION`] if the cluster
/// carries one: a downgrade is accepted only when it names `requested`.
pub fn decide_with(
    current: Option<&str>,
    requested: &str,
    downgrade_acknowledged: Option<&str>,
) -> Result<VersionChange, VersionRejection> {
    let to = parse_supported(requested, VersionRole::Requested)?;
    let Some(current) = current else {
        return Ok(VersionChange::Initial { requested: to });
    };
    let from = parse_supported(current, VersionRole::Current)?;

    if to == from {
        return Ok(VersionChange::NoChange { version: to });
    }
    if to < from {
        return decide_downgrade(from, to, downgrade_acknowledged == Some(requested));
    }
    // Same major (both supported), `to` is newer.
    if to.minor == from.minor {
        return Ok(VersionChange::PatchUpgrade { from, to });
    }
    if to.minor > from.minor + 1 {
        return Err(VersionRejection::SkipsMinor { from, to });
    }
    let min_patch = minimum_for_next_minor(&from)
        // `to` is in the table, so `from` is not the newest minor; a missing
        // bound would be a table error, which we refuse rather than guess.
        .ok_or_else(|| VersionRejection::UnsupportedVersion {
            version: to.clone(),
        })?;
    if from < min_patch {
        return Err(VersionRejection::PatchTooOldForMinorUpgrade {
            from,
            to,
            min_patch,
        });
    }
    Ok(VersionChange::MinorUpgrade { from, to })
}

/// [`decide_with`], the acknowledgement read from a cluster's annotations
/// ([`DOWNGRADE_ANNOTATION`]).
pub fn decide_for(
    current: Option<&str>,
    requested: &str,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<VersionChange, VersionRejection> {
    let acknowledged = annotations.get(DOWNGRADE_ANNOTATION).map(String::as_str);
    decide_with(current, requested, acknowledged)
}

/// A lower `to`: only one minor down, from a minor with the online downgrade
/// API, to a patch that may move up again, and only when acknowledged.
fn decide_downgrade(
    from: Version,
    to: Version,
    acknowledged: bool,
) -> Result<VersionChange, VersionRejection> {
    let online = supported_minor(&from).is_some_and(|m| m.online_downgrade);
    if to.minor + 1 != from.minor || !online {
        return Err(VersionRejection::Downgrade { from, to });
    }
    if let Some(min_patch) = minimum_for_next_minor(&to)
        && to < min_patch
    {
        return Err(VersionRejection::DowngradeTargetTooOld {
            from,
            to,
            min_patch,
        });
    }
    if !acknowledged {
        return Err(VersionRejection::DowngradeNotAcknowledged { from, to });
    }
    Ok(VersionChange::Downgrade { from, to })
}

/// A warning about a version the cluster runs or moves to: out of support,
/// or a patch the etcd project advises against. Never a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionNotice {
    /// The minor is out of support.
    EndOfSupport {
        version: Version,
        since: &'static str,
    },
    /// An early patch the etcd project advises against in production.
    NotRecommended {
        version: Version,
        advice: AdvisedAgainst,
    },
}

impl VersionNotice {
    /// A stable CamelCase reason for the `VersionSupported=False` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            VersionNotice::EndOfSupport { .. } => "EndOfSupport",
            VersionNotice::NotRecommended { .. } => "NotRecommended",
        }
    }

    /// What is wrong and the upgrade path, naming the patch to move to.
    pub fn message(&self) -> String {
        match self {
            VersionNotice::EndOfSupport { version, since } => format!(
                "etcd {}.{} is out of support since {since} (the etcd project supports the \
                 current and the previous minor); it keeps running, but move on: {}",
                version.major,
                version.minor,
                upgrade_path(version)
            ),
            VersionNotice::NotRecommended { version, advice } => format!(
                "the etcd project advises against {}.{}.0–{}.{}.{} in production ({}); {}",
                version.major,
                version.minor,
                version.major,
                version.minor,
                advice.below_patch - 1,
                advice.why,
                upgrade_path(version)
            ),
        }
    }
}

/// Where a cluster on `version` goes next: the gate patch of its minor
/// (from which the next minor may follow), then the next minor.
fn upgrade_path(version: &Version) -> String {
    match minimum_for_next_minor(version) {
        Some(gate) if *version < gate => format!(
            "upgrade to {gate} or a newer {}.{} patch, then to {}.{}",
            version.major,
            version.minor,
            version.major,
            version.minor + 1
        ),
        Some(_) => {
            let next = Version::new(version.major, version.minor + 1, 0);
            match minimum_for_next_minor(&next) {
                Some(gate) => format!(
                    "upgrade to {}.{} ({gate} or later, so that {}.{} can follow)",
                    next.major,
                    next.minor,
                    next.major,
                    next.minor + 1
                ),
                None => format!("upgrade to {}.{}", next.major, next.minor),
            }
        }
        None => format!(
            "upgrade to a newer {}.{} patch",
            version.major, version.minor
        ),
    }
}

/// The warning for `version`, if any (`None`: supported and recommended).
pub fn notice(version: &Version) -> Option<VersionNotice> {
    let row = supported_minor(version)?;
    if let Support::EndOfSupport { since } = row.support {
        return Some(VersionNotice::EndOfSupport {
            version: version.clone(),
            since,
        });
    }
    let advice = row.advised_against?;
    (version.patch < advice.below_patch).then(|| VersionNotice::NotRecommended {
        version: version.clone(),
        advice,
    })
}

/// The container image of etcd `version`: `<repository>:v<version>`, with the
/// upstream repository when none is given.
pub fn image_for(repository: Option<&str>, version: &Version) -> String {
    let repository = repository
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| !r.is_empty())
        .unwrap_or(DEFAULT_IMAGE_REPOSITORY);
    format!("{repository}:v{version}")
}

/// The etcd version an image names by its tag (`…/etcd:v3.6.16` or
/// `…:3.6.16`), the inverse of [`image_for`]; `None` for an image pinned by
/// digest or tagged otherwise.
pub fn version_of_image(image: &str) -> Option<Version> {
    let (_, tag) = image.rsplit_once(':')?;
    if tag.contains('/') || image.contains('@') {
        return None;
    }
    Version::parse(tag.strip_prefix('v').unwrap_or(tag)).ok()
}

/// The repository of an image reference, without its tag and digest:
/// `registry:5000/etcd` of `registry:5000/etcd:v3.5.1@sha256:…` (a registry
/// port stays). The inverse of [`image_for`].
pub fn image_repository(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_tag_names_its_version() {
        let v = Version::parse("3.6.16").unwrap();
        assert_eq!(version_of_image(&image_for(None, &v)), Some(v.clone()));
        assert_eq!(version_of_image("mirror.example:5000/etcd:3.6.16"), Some(v));
        assert_eq!(version_of_image("mirror.example:5000/etcd"), None);
        assert_eq!(version_of_image("etcd:v3.6.16@sha256:abc"), None);
        assert_eq!(version_of_image("etcd:latest"), None);
    }

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn rejected(current: Option<&str>, requested: &str) -> VersionRejection {
        decide(current, requested).expect_err("change must be rejected")
    }

    fn assert_words(msg: &str, words: &[&str]) {
        for word in words {
            assert!(msg.contains(word), "{msg:?} lacks {word:?}");
        }
    }

    #[test]
    fn initial_accepts_any_supported_version() {
        for version in [
            "3.4.0", "3.4.23", "3.5.1", "3.5.35", "3.6.0", "3.6.16", "3.7.3",
        ] {
            assert_eq!(
                decide(None, version),
                Ok(VersionChange::Initial {
                    requested: v(version)
                })
            );
        }
    }

    #[test]
    fn same_version_is_no_change() {
        let change = decide(Some("3.5.1"), "3.5.1").unwrap();
        assert_eq!(
            change,
            VersionChange::NoChange {
                version: v("3.5.1")
            }
        );
        assert!(!change.is_upgrade());
        assert_eq!(change.crosses_minor(), None);
        assert_eq!(change.target(), &v("3.5.1"));
    }

    #[test]
    fn patch_upgrades_go_any_distance_up() {
        assert_eq!(
            decide(Some("3.5.1"), "3.5.35"),
            Ok(VersionChange::PatchUpgrade {
                from: v("3.5.1"),
                to: v("3.5.35")
            })
        );
        assert_eq!(
            decide(Some("3.4.0"), "3.4.23").unwrap().target(),
            &v("3.4.23")
        );
        assert!(decide(Some("3.5.21"), "3.5.35").unwrap().is_upgrade());
    }

    #[test]
    fn minor_upgrade_from_any_3_4_patch() {
        let change = decide(Some("3.4.0"), "3.5.1").unwrap();
        assert_eq!(
            change,
            VersionChange::MinorUpgrade {
                from: v("3.4.0"),
                to: v("3.5.1")
            }
        );
        assert!(change.is_upgrade());
        assert_eq!(change.crosses_minor(), Some((&v("3.4.0"), &v("3.5.1"))));
        assert!(matches!(
            decide(Some("3.4.23"), "3.5.35"),
            Ok(VersionChange::MinorUpgrade { .. })
        ));
    }

    #[test]
    fn minor_upgrade_to_3_6_needs_3_5_32() {
        assert_eq!(
            decide(Some("3.5.32"), "3.6.0"),
            Ok(VersionChange::MinorUpgrade {
                from: v("3.5.32"),
                to: v("3.6.0")
            })
        );
        assert!(decide(Some("3.5.35"), "3.6.16").is_ok());
        // Each bound the guide named before is too low now.
        for old in ["3.5.20", "3.5.21", "3.5.26", "3.5.31"] {
            let err = rejected(Some(old), "3.6.16");
            assert_eq!(
                err,
                VersionRejection::PatchTooOldForMinorUpgrade {
                    from: v(old),
                    to: v("3.6.16"),
                    min_patch: v("3.5.32"),
                }
            );
            assert_eq!(err.reason(), "PatchTooOldForMinorUpgrade");
            assert_words(
                &err.message(),
                &[
                    old,
                    "3.6.16",
                    "requires 3.5.32 or later first",
                    "upgrade to 3.5.32 or a newer 3.5 patch, then to 3.6.16",
                ],
            );
        }
    }

    #[test]
    fn minor_upgrade_to_3_7_needs_3_6_11() {
        assert!(matches!(
            decide(Some("3.6.11"), "3.7.0"),
            Ok(VersionChange::MinorUpgrade { .. })
        ));
        assert!(decide(Some("3.6.16"), "3.7.3").is_ok());
        let err = rejected(Some("3.6.10"), "3.7.3");
        assert_eq!(
            err,
            VersionRejection::PatchTooOldForMinorUpgrade {
                from: v("3.6.10"),
                to: v("3.7.3"),
                min_patch: v("3.6.11"),
            }
        );
        assert_words(&err.message(), &["requires 3.6.11 or later first"]);
    }

    #[test]
    fn skipping_a_minor_is_rejected_naming_the_patch_to_move_to_first() {
        let err = rejected(Some("3.4.23"), "3.6.16");
        assert_eq!(
            err,
            VersionRejection::SkipsMinor {
                from: v("3.4.23"),
                to: v("3.6.16")
            }
        );
        assert_eq!(err.reason(), "SkipsMinor");
        assert_words(
            &err.message(),
            &[
                "3.4.23",
                "3.6.16",
                "skips a minor",
                "one minor at a time",
                "first to 3.5.32 or a newer 3.5 patch",
            ],
        );
        assert_words(
            &rejected(Some("3.5.35"), "3.7.3").message(),
            &["first to 3.6.11 or a newer 3.6 patch"],
        );
    }

    #[test]
    fn downgrades_etcd_cannot_take_online_are_rejected() {
        for (from, to, why) in [
            ("3.5.1", "3.5.0", "no downgrade between patches"),
            ("3.6.16", "3.6.11", "no downgrade between patches"),
            ("3.5.35", "3.4.23", "no online downgrade to 3.4"),
            ("3.7.3", "3.5.35", "one minor at a time"),
        ] {
            for ack in [None, Some(to)] {
                let err = decide_with(Some(from), to, ack).expect_err(to);
                assert_eq!(
                    err,
                    VersionRejection::Downgrade {
                        from: v(from),
                        to: v(to)
                    }
                );
                assert_eq!(err.reason(), "Downgrade");
                assert_words(&err.message(), &["downgrade", from, to, why, "restore"]);
            }
        }
    }

    #[test]
    fn a_one_minor_downgrade_needs_an_acknowledgement_naming_the_target() {
        for (from, to) in [("3.6.16", "3.5.35"), ("3.7.3", "3.6.16")] {
            let err = rejected(Some(from), to);
            assert_eq!(
                err,
                VersionRejection::DowngradeNotAcknowledged {
                    from: v(from),
                    to: v(to)
                }
            );
            assert_words(
                &err.message(),
                &[
                    "online downgrade",
                    &format!("{DOWNGRADE_ANNOTATION}={to}"),
                    &format!("back to {from}"),
                ],
            );
            // An acknowledgement of another version does not count.
            assert_eq!(
                decide_with(Some(from), to, Some("3.5.32")).unwrap_err(),
                err
            );
            let change = decide_with(Some(from), to, Some(to)).unwrap();
            assert_eq!(
                change,
                VersionChange::Downgrade {
                    from: v(from),
                    to: v(to)
                }
            );
            assert!(!change.is_upgrade());
            assert_eq!(change.crosses_minor(), Some((&v(from), &v(to))));
            assert_eq!(change.target(), &v(to));
        }
    }

    #[test]
    fn a_downgrade_lands_only_on_a_patch_that_can_move_up_again() {
        let err = decide_with(Some("3.6.16"), "3.5.21", Some("3.5.21")).unwrap_err();
        assert_eq!(
            err,
            VersionRejection::DowngradeTargetTooOld {
                from: v("3.6.16"),
                to: v("3.5.21"),
                min_patch: v("3.5.32"),
            }
        );
        assert_words(
            &err.message(),
            &["downgrade to 3.5.32 or a newer 3.5 patch"],
        );
        assert_eq!(
            decide_with(Some("3.7.3"), "3.6.10", Some("3.6.10"))
                .unwrap_err()
                .reason(),
            "DowngradeTargetTooOld"
        );
    }

    #[test]
    fn unsupported_majors_and_minors_are_rejected() {
        for version in ["2.3.8", "4.0.0", "3.3.27", "3.8.0"] {
            let err = rejected(None, version);
            assert_eq!(
                err,
                VersionRejection::UnsupportedVersion {
                    version: v(version)
                }
            );
            assert_eq!(err.reason(), "UnsupportedVersion");
            assert_words(
                &err.message(),
                &[version, "not supported", "3.4.x, 3.5.x, 3.6.x, 3.7.x"],
            );
        }
        // An unsupported current version blocks every change, too.
        assert_eq!(
            rejected(Some("3.3.27"), "3.4.0").reason(),
            "UnsupportedVersion"
        );
        // Upgrading past the newest supported minor.
        assert_eq!(
            rejected(Some("3.7.3"), "3.8.0").reason(),
            "UnsupportedVersion"
        );
    }

    #[test]
    fn malformed_versions_are_rejected() {
        for bad in [
            "",
            "garbage",
            "3",
            "3.5",
            "latest",
            "v3.5.1",
            "3.5.1-rc.0",
            "3.5.1+build.7",
            "3.5.1.2",
            " 3.5.1",
            "03.5.1",
            "3.5.x",
        ] {
            let err = rejected(None, bad);
            assert_eq!(
                err,
                VersionRejection::Invalid {
                    role: VersionRole::Requested,
                    value: bad.to_string()
                },
                "{bad:?}"
            );
            assert_eq!(err.reason(), "InvalidVersion");
            let msg = err.message();
            assert!(msg.starts_with("requested version"), "{msg}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("MAJOR.MINOR.PATCH"), "{msg}");
        }
        let err = rejected(Some("latest"), "3.5.1");
        assert_eq!(
            err,
            VersionRejection::Invalid {
                role: VersionRole::Current,
                value: "latest".into()
            }
        );
        assert!(err.message().starts_with("current version \"latest\""));
    }

    #[test]
    fn display_is_the_message() {
        let err = rejected(Some("3.5.1"), "3.4.0");
        assert_eq!(err.to_string(), err.message());
    }

    #[test]
    fn table_is_ordered_and_only_the_newest_minor_has_no_next() {
        assert!(
            SUPPORTED_MINORS
                .windows(2)
                .all(|w| w[1].minor == w[0].minor + 1)
        );
        let (last, rest) = SUPPORTED_MINORS.split_last().unwrap();
        assert!(last.min_patch_for_next_minor.is_none());
        assert!(rest.iter().all(|m| m.min_patch_for_next_minor.is_some()));
        // Online downgrade exists from 3.6 on.
        let online: Vec<u64> = SUPPORTED_MINORS
            .iter()
            .filter(|m| m.online_downgrade)
            .map(|m| m.minor)
            .collect();
        assert_eq!(online, [6, 7]);
        assert_eq!(minimum_for_next_minor(&v("3.5.1")), Some(v("3.5.32")));
        assert_eq!(minimum_for_next_minor(&v("3.6.0")), Some(v("3.6.11")));
        assert_eq!(minimum_for_next_minor(&v("3.7.3")), None);
    }

    #[test]
    fn etcd_3_4_is_out_of_support_a_warning_that_names_the_path() {
        let n = notice(&v("3.4.23")).expect("3.4 is out of support");
        assert_eq!(n.reason(), "EndOfSupport");
        assert_words(
            &n.message(),
            &[
                "3.4 is out of support since June 2026",
                "keeps running",
                "upgrade to 3.5 (3.5.32 or later, so that 3.6 can follow)",
            ],
        );
        // Not a refusal: 3.4 is created and upgraded like any supported minor.
        assert!(decide(None, "3.4.23").is_ok());
        assert!(decide(Some("3.4.23"), "3.5.35").is_ok());
    }

    #[test]
    fn early_3_5_patches_are_not_recommended_and_current_ones_pass() {
        for early in ["3.5.0", "3.5.1", "3.5.2"] {
            let n = notice(&v(early)).expect(early);
            assert_eq!(n.reason(), "NotRecommended");
            assert_words(
                &n.message(),
                &[
                    "3.5.0–3.5.2",
                    "3.5.3",
                    "upgrade to 3.5.32 or a newer 3.5 patch, then to 3.6",
                ],
            );
        }
        for fine in ["3.5.3", "3.5.21", "3.5.35", "3.6.16", "3.7.3"] {
            assert_eq!(notice(&v(fine)), None, "{fine}");
        }
        assert_eq!(notice(&v("3.9.0")), None, "unsupported: the policy says so");
    }

    #[test]
    fn image_repository_drops_tag_and_digest_and_keeps_a_registry_port() {
        assert_eq!(
            image_repository("gcr.io/etcd-development/etcd:v3.5.1"),
            "gcr.io/etcd-development/etcd"
        );
        assert_eq!(
            image_repository("localhost:5000/etcd:v3.5.1"),
            "localhost:5000/etcd"
        );
        assert_eq!(
            image_repository("localhost:5000/etcd"),
            "localhost:5000/etcd"
        );
        assert_eq!(
            image_repository("localhost:5000/etcd:v3.5.1@sha256:abc"),
            "localhost:5000/etcd"
        );
        assert_eq!(
            image_repository("mirror.example/etcd@sha256:abc"),
            "mirror.example/etcd"
        );
        assert_eq!(
            image_repository(&image_for(None, &v("3.6.16"))),
            DEFAULT_IMAGE_REPOSITORY
        );
    }

    #[test]
    fn image_uses_the_repository_or_upstream() {
        assert_eq!(
            image_for(None, &v("3.5.1")),
            "gcr.io/etcd-development/etcd:v3.5.1"
        );
        assert_eq!(
            image_for(Some(""), &v("3.5.1")),
            "gcr.io/etcd-development/etcd:v3.5.1"
        );
        assert_eq!(
            image_for(Some("registry.example.com/mirror/etcd/"), &v("3.6.0")),
            "registry.example.com/mirror/etcd:v3.6.0"
        );
    }

    /// The README's version table says what this table says, row by row.
    #[test]
    fn the_readme_version_table_matches_the_policy() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("## How versions work")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("README has a \"How versions work\" section");
        // Rows of the minors table: the first cell is `3.N` alone.
        let rows: Vec<&str> = section
            .lines()
            .filter(|l| {
                l.split('|').nth(1).is_some_and(|c| {
                    c.trim()
                        .strip_prefix("3.")
                        .is_some_and(|m| !m.is_empty() && m.chars().all(|d| d.is_ascii_digit()))
                })
            })
            .collect();
        for m in SUPPORTED_MINORS {
            let row = rows
                .iter()
                .find(|r| r.starts_with(&format!("| 3.{} ", m.minor)))
                .unwrap_or_else(|| panic!("README lacks a row for 3.{}", m.minor));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            // | minor | support | next minor from | online downgrade |
            let support = match m.support {
                Support::Supported => "supported".to_string(),
                Support::EndOfSupport { since } => format!("out of support since {since}"),
            };
            assert_eq!(cells[2], support, "{row}");
            let next = match m.min_patch_for_next_minor {
                Some(p) => format!("3.{}.{p} → 3.{}", m.minor, m.minor + 1),
                None => "newest".to_string(),
            };
            assert_eq!(cells[3], next, "{row}");
            let down = if m.online_downgrade {
                format!("to 3.{}", m.minor - 1)
            } else {
                "no".to_string()
            };
            assert_eq!(cells[4], down, "{row}");
        }
        assert_eq!(rows.len(), SUPPORTED_MINORS.len(), "{rows:?}");
    }
}
