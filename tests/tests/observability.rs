//! The Grafana dashboard shipped in config/grafana queries only metrics the
//! controller exports (names read from the controller's own registry).
//! Issue 13 item 6.

use std::collections::BTreeSet;
use std::path::Path;

use std::time::Duration;

use etcdfleet_controllers::etcdcluster::plan::Plan;
use etcdfleet_controllers::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

/// Series names the registry exposes, from its `# TYPE name kind` lines:
/// counters as `name_total`, histograms as `name_bucket|_sum|_count`. A
/// labelled family is only encoded once it has a child, so every recording
/// method is called once first.
fn exported_series() -> BTreeSet<String> {
    let metrics = Metrics::new();
    metrics.observe_reconcile(Duration::from_millis(5), Some("ManagementAPIError"));
    metrics.observe_step("AddLearner", Duration::from_millis(5), None);
    metrics.observe_plan(&Plan::Wait("x".into()));
    metrics.set_cluster_conditions(
        "team-a/c",
        Some(&[Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
            observed_generation: None,
        }]),
    );
    metrics.observe_backup_success("team-a/c", 4096, Duration::from_millis(5));
    metrics.observe_backup_failure("team-a/c", "ObjectStoreError");
    let text = metrics.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("malformed TYPE line: {line}");
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "gauge" | "unknown" => &[""],
            other => panic!("unexpected metric type {other} of {name}"),
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

/// Every `etcdfleet_…` identifier in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("etcdfleet_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn dashboard() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/grafana/etcdfleet-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_dashboard_query_names_a_metric_the_controller_exports() {
    let exported = exported_series();
    assert!(
        exported.contains("etcdfleet_reconciles_total"),
        "registry read wrongly: {exported:?}"
    );
    let panels = dashboard()["panels"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!panels.is_empty());
    let mut queried = BTreeSet::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{title:?}: {expr:?} names no etcdfleet metric"
            );
            for name in names {
                assert!(
                    exported.contains(&name),
                    "{title:?}: {name} is not exported; exported: {exported:?}"
                );
                queried.insert(name);
            }
        }
    }
    // The dashboard covers what an operator asks first.
    for needed in [
        "etcdfleet_clusters",
        "etcdfleet_reconcile_failures_total",
        "etcdfleet_step_duration_seconds_bucket",
        "etcdfleet_backup_age_seconds",
    ] {
        assert!(queried.contains(needed), "no panel queries {needed}");
    }
}

#[test]
fn metric_names_are_found_in_promql() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.9, sum by (le) (rate(etcdfleet_step_duration_seconds_bucket[5m]))) / etcdfleet_clusters"
        ),
        [
            "etcdfleet_step_duration_seconds_bucket",
            "etcdfleet_clusters"
        ]
    );
    assert!(metric_names("sum(up)").is_empty());
}
