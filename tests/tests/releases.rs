//! Releases as the repository records them (`CHANGELOG.md`) and as the
//! manifests use them: every stage pins an image tag of a recorded version,
//! promoted in order (prod never ahead of staging, staging never ahead of
//! dev), and the base manifests deploy this tree's own version.

use std::process::Command;

use etcdfleet_tests::etcd_harness::workspace_root;
use serde_json::Value;

/// `(version, commit)` of each CHANGELOG entry, newest first; the candidate
/// has no commit.
fn changelog() -> Vec<(String, Option<String>)> {
    let text = std::fs::read_to_string(workspace_root().join("CHANGELOG.md")).unwrap();
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("## v") {
            let version = rest.split_whitespace().next().unwrap_or_default();
            out.push((format!("v{version}"), None));
        } else if let Some(commit) = line.strip_prefix("- commit: ") {
            out.last_mut().expect("a commit under a version").1 = Some(commit.trim().into());
        }
    }
    out
}

fn stage_tag(stage: &str) -> String {
    let path = workspace_root().join(format!("config/stages/{stage}/kustomization.yaml"));
    let k: Value = etcdfleet_api::yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        k["images"][0]["name"].as_str(),
        Some("etcdfleet/controller")
    );
    k["images"][0]["newTag"].as_str().unwrap().to_string()
}

#[test]
fn releases_are_recorded_with_a_commit_of_this_history() {
    let entries = changelog();
    let here = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        entries.first().map(|e| e.0.as_str()),
        Some(here.as_str()),
        "the newest CHANGELOG entry is the workspace version"
    );
    let released: Vec<_> = entries.iter().filter(|e| e.1.is_some()).collect();
    assert!(!released.is_empty(), "no release recorded with its commit");
    for (version, commit) in released {
        let commit = commit.as_deref().unwrap();
        assert_eq!(commit.len(), 40, "{version}: a full commit id");
        let known = Command::new("git")
            .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
            .current_dir(workspace_root())
            .status()
            .unwrap();
        assert!(
            known.success(),
            "{version}: {commit} is not in this history"
        );
    }
}

#[test]
fn stages_pin_recorded_versions_and_promote_in_order() {
    let entries = changelog();
    let age = |tag: &str| {
        entries
            .iter()
            .position(|(v, _)| v == tag)
            .unwrap_or_else(|| panic!("{tag} is not a version in CHANGELOG.md"))
    };
    let (dev, staging, prod) = (stage_tag("dev"), stage_tag("staging"), stage_tag("prod"));
    // Newer entries come first: a larger position is an older release.
    assert!(
        age(&staging) >= age(&dev),
        "staging {staging} is ahead of dev {dev}"
    );
    assert!(
        age(&prod) >= age(&staging),
        "prod {prod} is ahead of staging {staging}"
    );
    for tag in [&staging, &prod] {
        assert!(
            entries[age(tag)].1.is_some(),
            "{tag} runs beyond dev but was never cut (no commit in CHANGELOG.md)"
        );
    }
    let deployment =
        std::fs::read_to_string(workspace_root().join("config/manager/deployment.yaml")).unwrap();
    let image = format!("image: etcdfleet/controller:v{}", env!("CARGO_PKG_VERSION"));
    assert!(deployment.contains(&image), "config/manager: {image}");
    let job = std::fs::read_to_string(workspace_root().join("config/storage-migration/job.yaml"))
        .unwrap();
    assert!(job.contains(&image), "config/storage-migration: {image}");
}
