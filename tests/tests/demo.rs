//! `make demo` as a test: every phase of the demo completes on real etcd, the
//! final table lists three Available clusters, and the broken member was
//! replaced by a member with a new id.

use anyhow::{Context as _, Result};
use etcdfleet_tests::demo::{
    DemoOptions, UPGRADE_FROM, UPGRADE_TO, WORKLOADS, check_mount_namespaces, run_demo,
};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_both};

/// The cell of `row` under the column titled `title` in `header`.
fn cell<'a>(header: &str, row: &'a str, title: &str) -> &'a str {
    let start = header
        .find(title)
        .unwrap_or_else(|| panic!("no column {title}"));
    let rest = &header[start + title.len()..];
    let width = title.len() + rest.len() - rest.trim_start().len();
    let end = (start + width).min(row.len());
    row.get(start..end).unwrap_or_default().trim()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_completes_every_phase_and_heals_the_broken_member() -> Result<()> {
    let Some((v35, v36)) = require_both(EtcdVersion::V3_5Latest, EtcdVersion::V3_6) else {
        return Ok(());
    };
    assert_eq!(
        (UPGRADE_FROM, UPGRADE_TO),
        (v35.release.as_str(), v36.release.as_str()),
        "the demo runs the releases hack/upstream pins"
    );
    if let Err(why) = check_mount_namespaces() {
        println!("SKIPPED: {why}");
        assert!(
            std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() != Ok("1"),
            "{why}"
        );
        return Ok(());
    }
    let mut out = Vec::new();
    let result = run_demo(&mut out, DemoOptions::default()).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let summary = result.with_context(|| format!("demo output:\n{text}"))?;
    eprintln!("{text}");

    let phases: Vec<&str> = summary.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(phases.len(), 5, "setup + four phases: {phases:?}");
    assert!(phases[1].starts_with("Create"), "{phases:?}");
    assert!(phases[2].starts_with("Scale search"), "{phases:?}");
    assert!(phases[3].starts_with("Break shop"), "{phases:?}");
    assert!(phases[4].starts_with("Upgrade payments"), "{phases:?}");
    for p in &summary.phases[1..] {
        assert!(!p.steps.is_empty(), "phase {:?} took no step", p.name);
    }
    let kinds = |i: usize| -> Vec<&str> {
        summary.phases[i]
            .steps
            .iter()
            .map(|s| s.kind.as_str())
            .collect()
    };
    assert!(kinds(2).contains(&"AddLearner") && kinds(2).contains(&"PromoteLearner"));
    assert!(
        summary.phases[3]
            .steps
            .iter()
            .any(|s| s.kind == "RemoveMember" && s.text.contains("failure")),
        "the failed member was removed: {:?}",
        summary.phases[3].steps
    );

    // The upgrade restarted every payments member onto 3.6, one at a time.
    let restarts = summary.phases[4]
        .steps
        .iter()
        .filter(|s| s.cluster == "payments" && s.kind == "RestartMember")
        .count();
    assert_eq!(restarts, 3, "{:?}", summary.phases[4].steps);
    // Nothing alarming while clusters are created normally.
    assert!(!text.contains("no client certificate"), "{text}");

    // The final table: three Available clusters with all members ready.
    let lines: Vec<&str> = summary.final_table.lines().collect();
    let header = lines[0];
    for name in WORKLOADS {
        let row = lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(name))
            .with_context(|| format!("{name} not in the table:\n{}", summary.final_table))?;
        assert_eq!(cell(header, row, "AVAILABLE"), "True", "{row}");
        assert_eq!(cell(header, row, "MEMBERS"), "3/3", "{row}");
        let version = if name == "payments" {
            UPGRADE_TO
        } else {
            UPGRADE_FROM
        };
        assert_eq!(cell(header, row, "VERSION"), version, "{row}");
    }
    assert_eq!(summary.clusters.len(), 3);
    assert!(summary.clusters.iter().all(|c| c.available && c.ready == 3));

    let healed = summary.healed.as_ref().context("no heal report")?;
    assert!(!healed.old_id.is_empty() && !healed.new_id.is_empty());
    assert_ne!(
        healed.old_id, healed.new_id,
        "the healed member has a new id"
    );
    assert!(text.contains("Summary"));

    // No step repeats without a change: each volume record names a member
    // and the etcd version on it, and none is written twice.
    let mut records = std::collections::BTreeMap::new();
    for s in summary.steps().filter(|s| s.kind == "RecordPvcMember") {
        *records
            .entry((s.cluster.as_str(), s.text.as_str()))
            .or_insert(0) += 1;
    }
    let repeated: Vec<_> = records.iter().filter(|(_, n)| **n > 1).collect();
    assert!(!records.is_empty(), "no volume was ever recorded");
    assert!(repeated.is_empty(), "volume records repeated: {repeated:?}");
    Ok(())
}
