//! The etcd version policy and the image a version runs as.
//!
//! `decide(current, requested)` is the one place that says whether a cluster
//! may move from the version it runs to the version its spec asks for. It is a
//! pure function of a small table of supported minors; the controller turns a
//! rejection into `VersionAccepted=False` (with `reason()` / `message()`) and
//! touches nothing.
//!
//! Rules (etcd.io "Upgrading etcd clusters and applications"): patch upgrades
//! any distance up; minor upgrades one step at a time, and only from a patch the
//! etcd project names as safe; no skipping a minor; no downgrade (etcd's own
//! downgrade API, 3.6+, is not driven by this controller yet).

use std::fmt;

use semver::Version;

/// Repository of the upstream etcd images, used when a cluster names none.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "gcr.io/etcd-development/etcd";

/// The only etcd major version this controller runs.
const SUPPORTED_MAJOR: u64 = 3;

/// One supported minor of etcd 3.x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupportedMinor {
    /// The minor, e.g. `5` for 3.5.
    pub minor: u64,
    /// The lowest patch of this minor from which an upgrade to the next minor
    /// is safe; `None` when this is the newest supported minor.
    pub min_patch_for_next_minor: Option<u64>,
}

/// Supported etcd 3.x minors, oldest first, with the patch each must reach
/// before moving to the next minor. Sources:
/// - 3.4 → 3.5: etcd.io docs v3.5 `upgrades/upgrade_3_5`: any 3.4 patch may be
///   upgraded; it is a rolling replacement of binaries on the same data dirs
///   (also seen here: 3.4.23 → 3.5.1, see ETCD-FACTS.md).
/// - 3.5 → 3.6: etcd.io docs v3.6 `upgrades/upgrade_3_6`: "upgrade to v3.5.26
///   or later first" (an older revision of that guide said 3.5.20; the newer,
///   stricter bound is used).
/// - 3.6: newest supported minor; no upgrade path beyond it yet.
pub const SUPPORTED_MINORS: &[SupportedMinor] = &[
    SupportedMinor {
        minor: 4,
        min_patch_for_next_minor: Some(0),
    },
    SupportedMinor {
        minor: 5,
        min_patch_for_next_minor: Some(26),
    },
    SupportedMinor {
        minor: 6,
        min_patch_for_next_minor: None,
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
}

impl VersionChange {
    /// The version the cluster should run after this change.
    pub fn target(&self) -> &Version {
        match self {
            VersionChange::Initial { requested } => requested,
            VersionChange::NoChange { version } => version,
            VersionChange::PatchUpgrade { to, .. } | VersionChange::MinorUpgrade { to, .. } => to,
        }
    }

    /// Whether running members must be replaced to reach the target.
    pub fn is_upgrade(&self) -> bool {
        matches!(
            self,
            VersionChange::PatchUpgrade { .. } | VersionChange::MinorUpgrade { .. }
        )
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
    /// Lower than what the cluster runs.
    #[error("{}", self.message())]
    Downgrade { from: Version, to: Version },
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
            VersionRejection::SkipsMinor { .. } => "SkipsMinor",
            VersionRejection::PatchTooOldForMinorUpgrade { .. } => "PatchTooOldForMinorUpgrade",
        }
    }

    /// What is wrong and what to do, naming the versions and the rule.
    pub fn message(&self) -> String {
        match self {
            VersionRejection::Invalid { role, value } => format!(
                "{role} version {value:?} is not a full MAJOR.MINOR.PATCH version such as 3.5.1 \
                 (no \"v\" prefix, pre-release or build metadata)"
            ),
            VersionRejection::UnsupportedVersion { version } => format!(
                "etcd {version} is not supported; supported versions are {}",
                supported_list()
            ),
            VersionRejection::Downgrade { from, to } => format!(
                "downgrade from {from} to {to} is not supported: etcd versions only move up \
                 (set version back to {from} or newer)"
            ),
            VersionRejection::SkipsMinor { from, to } => format!(
                "upgrade from {from} to {to} skips a minor version: upgrade one minor at a time \
                 (first to {}.{}.x)",
                from.major,
                from.minor + 1
            ),
            VersionRejection::PatchTooOldForMinorUpgrade {
                from,
                to,
                min_patch,
            } => format!(
                "upgrade from {from} to {to} requires {min_patch} or later first: \
                 upgrade to the latest {}.{} patch, then to {to}",
                from.major, from.minor
            ),
        }
    }
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

fn supported_minor(version: &Version) -> Option<&'static SupportedMinor> {
    if version.major != SUPPORTED_MAJOR {
        return None;
    }
    SUPPORTED_MINORS.iter().find(|m| m.minor == version.minor)
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
/// move to `requested`.
pub fn decide(current: Option<&str>, requested: &str) -> Result<VersionChange, VersionRejection> {
    let to = parse_supported(requested, VersionRole::Requested)?;
    let Some(current) = current else {
        return Ok(VersionChange::Initial { requested: to });
    };
    let from = parse_supported(current, VersionRole::Current)?;

    if to == from {
        return Ok(VersionChange::NoChange { version: to });
    }
    if to < from {
        return Err(VersionRejection::Downgrade { from, to });
    }
    // Same major (both supported), `to` is newer.
    if to.minor == from.minor {
        return Ok(VersionChange::PatchUpgrade { from, to });
    }
    if to.minor > from.minor + 1 {
        return Err(VersionRejection::SkipsMinor { from, to });
    }
    let min_patch = supported_minor(&from)
        .and_then(|m| m.min_patch_for_next_minor)
        // `to` is in the table, so `from` is not the newest minor; a missing
        // bound would be a table error, which we refuse rather than guess.
        .ok_or_else(|| VersionRejection::UnsupportedVersion {
            version: to.clone(),
        })?;
    if from.patch < min_patch {
        let min_patch = Version::new(from.major, from.minor, min_patch);
        return Err(VersionRejection::PatchTooOldForMinorUpgrade {
            from,
            to,
            min_patch,
        });
    }
    Ok(VersionChange::MinorUpgrade { from, to })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn rejected(current: Option<&str>, requested: &str) -> VersionRejection {
        decide(current, requested).expect_err("change must be rejected")
    }

    #[test]
    fn initial_accepts_any_supported_version() {
        for version in ["3.4.0", "3.4.23", "3.5.1", "3.6.0", "3.6.5"] {
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
        assert_eq!(change.target(), &v("3.5.1"));
    }

    #[test]
    fn patch_upgrades_go_any_distance_up() {
        assert_eq!(
            decide(Some("3.5.1"), "3.5.26"),
            Ok(VersionChange::PatchUpgrade {
                from: v("3.5.1"),
                to: v("3.5.26")
            })
        );
        assert_eq!(
            decide(Some("3.4.0"), "3.4.23").unwrap().target(),
            &v("3.4.23")
        );
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
        assert!(matches!(
            decide(Some("3.4.23"), "3.5.0"),
            Ok(VersionChange::MinorUpgrade { .. })
        ));
    }

    #[test]
    fn minor_upgrade_to_3_6_needs_3_5_26() {
        assert_eq!(
            decide(Some("3.5.26"), "3.6.0"),
            Ok(VersionChange::MinorUpgrade {
                from: v("3.5.26"),
                to: v("3.6.0")
            })
        );
        assert!(decide(Some("3.5.30"), "3.6.4").is_ok());

        let err = rejected(Some("3.5.20"), "3.6.0");
        assert_eq!(
            err,
            VersionRejection::PatchTooOldForMinorUpgrade {
                from: v("3.5.20"),
                to: v("3.6.0"),
                min_patch: v("3.5.26"),
            }
        );
        assert_eq!(err.reason(), "PatchTooOldForMinorUpgrade");
        let msg = err.message();
        for word in [
            "3.5.20",
            "3.6.0",
            "requires 3.5.26 or later",
            "latest 3.5 patch",
        ] {
            assert!(msg.contains(word), "{msg:?} lacks {word:?}");
        }
        assert_eq!(
            rejected(Some("3.5.25"), "3.6.1").reason(),
            "PatchTooOldForMinorUpgrade"
        );
    }

    #[test]
    fn skipping_a_minor_is_rejected() {
        let err = rejected(Some("3.4.23"), "3.6.0");
        assert_eq!(
            err,
            VersionRejection::SkipsMinor {
                from: v("3.4.23"),
                to: v("3.6.0")
            }
        );
        assert_eq!(err.reason(), "SkipsMinor");
        let msg = err.message();
        for word in [
            "3.4.23",
            "3.6.0",
            "skips a minor",
            "one minor at a time",
            "3.5.x",
        ] {
            assert!(msg.contains(word), "{msg:?} lacks {word:?}");
        }
    }

    #[test]
    fn downgrades_are_rejected() {
        for (from, to) in [("3.5.1", "3.5.0"), ("3.5.1", "3.4.23"), ("3.6.0", "3.5.26")] {
            let err = rejected(Some(from), to);
            assert_eq!(
                err,
                VersionRejection::Downgrade {
                    from: v(from),
                    to: v(to)
                }
            );
            assert_eq!(err.reason(), "Downgrade");
            let msg = err.message();
            assert!(msg.contains("downgrade"), "{msg}");
            assert!(msg.contains(from) && msg.contains(to), "{msg}");
        }
    }

    #[test]
    fn unsupported_majors_and_minors_are_rejected() {
        for version in ["2.3.8", "4.0.0", "3.3.27", "3.7.0"] {
            let err = rejected(None, version);
            assert_eq!(
                err,
                VersionRejection::UnsupportedVersion {
                    version: v(version)
                }
            );
            assert_eq!(err.reason(), "UnsupportedVersion");
            let msg = err.message();
            assert!(msg.contains(version), "{msg}");
            assert!(msg.contains("not supported"), "{msg}");
            assert!(msg.contains("3.4.x, 3.5.x, 3.6.x"), "{msg}");
        }
        // An unsupported current version blocks every change, too.
        assert_eq!(
            rejected(Some("3.3.27"), "3.4.0").reason(),
            "UnsupportedVersion"
        );
        // Upgrading past the newest supported minor.
        assert_eq!(
            rejected(Some("3.6.5"), "3.7.0").reason(),
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
}
