//! The etcd flags that differ between etcd versions, as a pure function of
//! the version that runs: what `render::etcd_args` adds to the flags every
//! version shares.
//!
//! | version | flags |
//! |---|---|
//! | 3.4.x | `--logger=zap` (3.4's default is the deprecated capnslog; 3.5+ default to zap), `--experimental-initial-corrupt-check=true` |
//! | 3.5.0–3.5.4 | `--experimental-initial-corrupt-check=true` |
//! | 3.5.5+ | also `--experimental-compact-hash-check-enabled=true` |
//! | 3.6.x, 3.7.x | `--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true` |
//!
//! Sources, checked against the binaries the tests run (`etcd --help` of
//! 3.4.23, 3.5.1, 3.5.21, 3.5.35, 3.6.16, 3.7.3) and etcd's sources:
//! - the compact-hash check came in 3.5.5 (etcd CHANGELOG-3.5, v3.5.5: "Add
//!   `etcd --experimental-compact-hash-check-enabled
//!   --experimental-compact-hash-check-time`"); 3.4.23 and 3.5.1 lack it;
//! - 3.6 turned both checks into feature gates and deprecated the
//!   `--experimental-*` spellings (etcd.io docs `upgrades/upgrade_3_6`,
//!   "Equivalent flags of v3.5 feature gates"; 3.6.16
//!   `server/features/etcd_features.go` `ExperimentalFlagToFeatureMap`);
//! - 3.7 removed every `--experimental-*` flag (etcd blog "announcing etcd
//!   3.7"; 3.7.3's `etcd --help` lists none).
//!
//! Defaults that changed between versions are not left to the binary where
//! they matter: `--snapshot-count` (100000 before 3.6, 10000 from 3.6) is
//! always rendered from the spec. `--v2-deprecation` (`not-yet` → `write-only`)
//! is left to each version: 3.6 ignores any other value but
//! `write-only-skip-check`, which this controller never sets.
//!
//! The flags are rendered for the version in the StatefulSet's pod template;
//! a member keeps the command line it was started with until its pod is
//! replaced, so during a roll the members still on the old version keep the
//! flags that version accepts (and a downgrade renders the lower version's
//! spelling for the members it replaces).

use etcdfleet_api::version::parse_full_version;

/// The corruption checks a version supports, in the spelling it accepts.
pub fn corruption_check_flags(version: &semver::Version) -> Vec<String> {
    match (version.major, version.minor) {
        (3, 0..=4) => vec!["--experimental-initial-corrupt-check=true".to_string()],
        (3, 5) if version.patch < 5 => {
            vec!["--experimental-initial-corrupt-check=true".to_string()]
        }
        (3, 5) => vec![
            "--experimental-initial-corrupt-check=true".to_string(),
            "--experimental-compact-hash-check-enabled=true".to_string(),
        ],
        _ => vec!["--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true".to_string()],
    }
}

/// Every flag of `version` (a full `MAJOR.MINOR.PATCH`) that differs between
/// versions; none for a string that is not a version (the version policy
/// refuses those before anything is rendered).
pub fn version_flags(version: &str) -> Vec<String> {
    let Some(version) = parse_full_version(version.trim_start_matches('v')) else {
        return Vec::new();
    };
    let mut flags = Vec::new();
    if (version.major, version.minor) < (3, 5) {
        flags.push("--logger=zap".to_string());
    }
    flags.extend(corruption_check_flags(&version));
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_version() {
        let cases: &[(&str, &[&str])] = &[
            (
                "3.4.23",
                &["--logger=zap", "--experimental-initial-corrupt-check=true"],
            ),
            ("3.5.1", &["--experimental-initial-corrupt-check=true"]),
            (
                "3.5.5",
                &[
                    "--experimental-initial-corrupt-check=true",
                    "--experimental-compact-hash-check-enabled=true",
                ],
            ),
            (
                "3.5.35",
                &[
                    "--experimental-initial-corrupt-check=true",
                    "--experimental-compact-hash-check-enabled=true",
                ],
            ),
            (
                "3.6.16",
                &["--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true"],
            ),
            (
                "3.7.3",
                &["--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true"],
            ),
        ];
        for (version, want) in cases {
            assert_eq!(version_flags(version), *want, "{version}");
        }
    }

    #[test]
    fn no_experimental_flag_from_3_7_and_no_feature_gates_before_3_6() {
        for v in ["3.7.0", "3.7.3"] {
            assert!(
                version_flags(v).iter().all(|f| !f.contains("experimental")),
                "{v}"
            );
        }
        for v in ["3.4.0", "3.5.0", "3.5.35"] {
            assert!(
                version_flags(v)
                    .iter()
                    .all(|f| !f.contains("feature-gates")),
                "{v}"
            );
        }
    }

    /// The README's "Flags per version" table says what this renders: each
    /// row names a version range and the flags of its first and last patch.
    #[test]
    fn the_readme_flags_table_matches_the_rendering() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("**Flags per version.**")
            .nth(1)
            .and_then(|s| s.split("\n\n").nth(1))
            .expect("README has a flags-per-version table");
        let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| 3.")).collect();
        // (row's version cell, versions it covers)
        let expected: &[(&str, &[&str])] = &[
            ("3.4.x", &["3.4.0", "3.4.23"]),
            ("3.5.0–3.5.4", &["3.5.0", "3.5.4"]),
            ("3.5.5 and later", &["3.5.5", "3.5.35"]),
            ("3.6.x, 3.7.x", &["3.6.0", "3.6.16", "3.7.0", "3.7.3"]),
        ];
        assert_eq!(rows.len(), expected.len(), "{rows:?}");
        for ((cell, versions), row) in expected.iter().zip(&rows) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(cells[1], *cell, "{row}");
            for v in *versions {
                for flag in version_flags(v) {
                    // A row that says "also" lists what it adds to the row above.
                    let shown = cells[2].contains(&format!("`{flag}`"))
                        || (cells[2].starts_with("also")
                            && flag == "--experimental-initial-corrupt-check=true");
                    assert!(shown, "{v}: {flag} is not in the README row {row}");
                }
            }
        }
    }

    #[test]
    fn a_string_that_is_no_version_adds_nothing() {
        assert!(version_flags("latest").is_empty());
        assert_eq!(version_flags("v3.6.16"), version_flags("3.6.16"));
    }
}
