//! What a platform team's monitoring reads: the Grafana dashboard
//! (config/grafana) and the alert rules (config/prometheus) query only
//! metrics the controller exports (names read from the controller's own
//! registry), every expression parses (promtool), each dashboard panel shows
//! one unit, and each alert fires on the state it names — evaluated by
//! promtool's rule tests on series the controller itself encoded — and stays
//! quiet on a healthy cluster.

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
    metrics.set_cluster_members("team-a/c", 3, 3);
    metrics.set_certificate_expiry("team-a/c", "ca", Some(2_000_000_000));
    metrics.observe_backup_success("team-a/c", 4096, Duration::from_millis(5));
    metrics.observe_backup_failure("team-a/c", "ObjectStoreError");
    metrics.observe_recovery_started("team-a/c");
    let drilled = std::time::SystemTime::now();
    metrics.observe_drill(
        "team-a/c",
        Some(true),
        Some(Duration::from_secs(3)),
        drilled,
    );
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

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// promtool (Debian `prometheus`, installed by hack/install-tools.sh).
fn promtool() -> std::path::PathBuf {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("promtool is missing: hack/install-tools.sh installs it (Debian package prometheus)")
    })
}

/// Runs promtool with `args`; panics with its output unless it succeeds.
fn run_promtool(args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new(promtool())
        .args(args)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// The shipped PrometheusRule's `spec` (a Prometheus rule file).
fn alert_rules() -> serde_json::Value {
    let path = repo().join("config/prometheus/etcdfleet-alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let object: serde_json::Value = etcdfleet_api::yaml::from_str(&text).unwrap();
    assert_eq!(object["kind"].as_str(), Some("PrometheusRule"));
    object["spec"].clone()
}

fn rules(spec: &serde_json::Value) -> Vec<serde_json::Value> {
    spec["groups"]
        .as_array()
        .expect("the PrometheusRule has groups")
        .iter()
        .flat_map(|g| {
            g["rules"]
                .as_array()
                .cloned()
                .expect("every group has rules")
        })
        .collect()
}

/// The unit a series is in, read from its name (Prometheus naming).
fn unit_of(name: &str) -> &'static str {
    if name.contains("_seconds") {
        "seconds"
    } else if name.contains("_bytes") {
        "bytes"
    } else {
        "count"
    }
}

#[test]
fn each_dashboard_panel_shows_one_unit_and_every_query_parses() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let mut recording = Vec::new();
    for (i, panel) in panels.iter().enumerate() {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        let units: BTreeSet<&str> = targets
            .iter()
            .flat_map(|t| metric_names(t["expr"].as_str().unwrap_or_default()))
            .map(|n| unit_of(&n))
            .collect();
        assert_eq!(units.len(), 1, "panel {title:?} mixes units {units:?}");
        let declared = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or_default();
        match units.first().copied() {
            Some("bytes") => assert_eq!(declared, "bytes", "{title:?}"),
            Some("seconds") if !title.contains("rate") => assert!(
                declared == "s" || declared == "ops",
                "{title:?} shows seconds as {declared:?}"
            ),
            _ => assert!(!declared.is_empty(), "{title:?} declares no unit"),
        }
        for (j, target) in targets.iter().enumerate() {
            recording.push(serde_json::json!({
                "record": format!("dashboard:panel{i}:query{j}"),
                "expr": target["expr"],
            }));
        }
    }
    // promtool parses each query (as a recording rule) the way Prometheus would.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    let rules = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": recording }] });
    std::fs::write(&file, etcdfleet_api::yaml::to_string(&rules).unwrap()).unwrap();
    let out = run_promtool(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_parses_names_exported_metrics_and_says_what_to_fix() {
    let exported = exported_series();
    let spec = alert_rules();
    let rules = rules(&spec);
    let mut alerts = BTreeSet::new();
    for rule in &rules {
        let name = rule["alert"]
            .as_str()
            .expect("every rule is an alert")
            .to_string();
        let expr = rule["expr"].as_str().unwrap_or_default();
        let names = metric_names(expr);
        assert!(
            !names.is_empty(),
            "{name}: {expr:?} names no etcdfleet metric"
        );
        for metric in names {
            assert!(
                exported.contains(&metric),
                "{name}: {metric} is not exported"
            );
        }
        assert!(
            rule["labels"]["severity"].as_str().is_some(),
            "{name} has no severity label"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key].as_str().is_some(),
                "{name} has no {key}"
            );
        }
        alerts.insert(name);
    }
    // The ones the platform team pages on.
    for needed in [
        "EtcdfleetQuorumLossRecovered",
        "EtcdfleetBackupTooOld",
        "EtcdfleetBackupNotRestorable",
        "EtcdfleetClusterNotAvailable",
        "EtcdfleetQuorumAtRisk",
        "EtcdfleetCertificateExpiresSoon",
        "EtcdfleetNoSpaceAlarm",
    ] {
        assert!(alerts.contains(needed), "no alert {needed}: {alerts:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcdfleet-alerts.yaml");
    std::fs::write(&file, etcdfleet_api::yaml::to_string(&spec).unwrap()).unwrap();
    let out = run_promtool(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    assert!(
        out.contains(&format!("{} rules found", rules.len())),
        "{out}"
    );
}

fn condition(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }
}

/// A fleet in every state an alert names, and one healthy cluster, as the
/// controller's registry encodes it. Certificate expiry is in Unix seconds
/// and promtool's clock starts at 0: "soon" is a few days after the epoch.
fn fleet_metrics() -> String {
    let m = Metrics::new();
    let day = 86_400;
    let now = std::time::SystemTime::now();
    let ok = [
        condition("Available", "True", "QuorumHealthy"),
        condition("Degraded", "False", "AllMembersHealthy"),
    ];
    for cluster in [
        "t/healthy",
        "t/at-risk",
        "t/five-ok",
        "t/five-at-risk",
        "t/expiring",
    ] {
        m.set_cluster_conditions(cluster, Some(&ok));
        m.set_cluster_members(cluster, 3, 3);
        m.set_certificate_expiry(cluster, "ca", Some(3650 * day));
        m.set_certificate_expiry(cluster, "client", Some(300 * day));
        m.observe_backup_recorded(cluster, now - Duration::from_secs(3600), Some(1 << 20));
    }
    // A passed drill (quiet) and one whose backup did not restore (fires).
    m.observe_drill("t/healthy", Some(true), Some(Duration::from_secs(4)), now);
    m.observe_drill(
        "t/unrestorable",
        Some(false),
        Some(Duration::from_secs(3)),
        now,
    );
    m.set_cluster_members("t/at-risk", 3, 2);
    // Five voters can lose two: one down leaves room for one more.
    m.set_cluster_members("t/five-ok", 5, 4);
    m.set_cluster_members("t/five-at-risk", 5, 3);
    m.set_certificate_expiry("t/expiring", "client", Some(5 * day));
    m.set_cluster_conditions(
        "t/lost",
        Some(&[
            condition("Available", "False", "QuorumLost"),
            condition("Degraded", "True", "MemberUnhealthy"),
        ]),
    );
    m.set_cluster_members("t/lost", 3, 1);
    m.set_cluster_conditions(
        "t/full",
        Some(&[
            condition("Available", "False", "NoSpace"),
            condition("Degraded", "True", "AlarmNOSPACE"),
        ]),
    );
    m.set_cluster_members("t/full", 3, 3);
    m.encode()
}

/// A recovery from a lost quorum started ten minutes in (the counter as the
/// controller encodes it, going from 0 to 1): `EtcdfleetQuorumLossRecovered`
/// fires on that cluster.
fn recovery_case(rules: &[serde_json::Value]) -> (serde_json::Value, serde_json::Value) {
    let m = Metrics::new();
    m.observe_recovery_started("t/recovered");
    let encoded = m.encode();
    let series = encoded
        .lines()
        .find(|l| l.starts_with("etcdfleet_quorum_loss_recoveries_total{"))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(series, _)| series.to_string())
        .expect("the recoveries counter is encoded");
    let rule = rules
        .iter()
        .find(|r| r["alert"].as_str() == Some("EtcdfleetQuorumLossRecovered"))
        .expect("rule EtcdfleetQuorumLossRecovered");
    let labels = serde_json::json!({ "cluster": "t/recovered" });
    let mut all = labels.clone();
    all["severity"] = rule["labels"]["severity"].as_str().unwrap().into();
    (
        serde_json::json!({ "series": series, "values": "0x10 1x30" }),
        serde_json::json!({
            "eval_time": "20m",
            "alertname": "EtcdfleetQuorumLossRecovered",
            "exp_alerts": [{ "exp_labels": all, "exp_annotations": expanded(rule, &labels) }],
        }),
    )
}

/// The encoded samples as promtool input series, constant for `minutes`.
fn input_series(exposition: &str, minutes: u32) -> Vec<serde_json::Value> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            serde_json::json!({ "series": series, "values": format!("{value}+0x{minutes}") })
        })
        .collect()
}

/// The rule's annotations with `{{ $labels.x }}` filled from `labels`.
fn expanded(rule: &serde_json::Value, labels: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (k, v) in rule["annotations"].as_object().into_iter().flatten() {
        let mut text = v.as_str().unwrap_or_default().to_string();
        for (label, value) in labels.as_object().into_iter().flatten() {
            text = text.replace(
                &format!("{{{{ $labels.{label} }}}}"),
                value.as_str().unwrap(),
            );
        }
        assert!(!text.contains("{{"), "unexpanded template in {text}");
        out.insert(k.clone(), text.into());
    }
    out.into()
}

#[test]
fn each_alert_fires_on_the_state_it_names_and_never_on_a_healthy_cluster() {
    let spec = alert_rules();
    let exposition = fleet_metrics();
    let backup_age = |cluster: &str| -> f64 {
        let prefix = format!("etcdfleet_backup_age_seconds{{cluster=\"{cluster}\"}} ");
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no backup age of {cluster}"))
            .parse()
            .unwrap()
    };
    assert!(backup_age("t/healthy") < 7200.0);
    // What each alert must find after 30 minutes of these series: the labels
    // of every firing alert (the rule's own labels added below).
    let cluster = |c: &str| serde_json::json!({ "cluster": c });
    let not_available = |c: &str, reason: &str| serde_json::json!({ "cluster": c, "condition": "Available", "status": "False", "reason": reason });
    let expected: Vec<(&str, Vec<serde_json::Value>)> = vec![
        (
            "EtcdfleetClusterNotAvailable",
            vec![
                not_available("t/full", "NoSpace"),
                not_available("t/lost", "QuorumLost"),
            ],
        ),
        (
            "EtcdfleetQuorumAtRisk",
            vec![cluster("t/at-risk"), cluster("t/five-at-risk")],
        ),
        (
            "EtcdfleetNoSpaceAlarm",
            vec![
                serde_json::json!({ "cluster": "t/full", "condition": "Degraded", "status": "True", "reason": "AlarmNOSPACE" }),
            ],
        ),
        ("EtcdfleetBackupTooOld", vec![]),
        (
            "EtcdfleetBackupNotRestorable",
            vec![cluster("t/unrestorable")],
        ),
        (
            "EtcdfleetCertificateExpiresSoon",
            vec![serde_json::json!({ "cluster": "t/expiring", "certificate": "client" })],
        ),
        // A recovery long past (a constant count) does not fire.
        ("EtcdfleetQuorumLossRecovered", vec![]),
    ];
    let rules = rules(&spec);
    let mut cases = Vec::new();
    for (alert, firing) in &expected {
        let rule = rules
            .iter()
            .find(|r| r["alert"].as_str() == Some(alert))
            .unwrap_or_else(|| panic!("no rule {alert}"));
        let exp_alerts: Vec<serde_json::Value> = firing
            .iter()
            .map(|labels| {
                let mut all = labels.clone();
                for (k, v) in rule["labels"].as_object().into_iter().flatten() {
                    all[k.as_str()] = v.as_str().unwrap().into();
                }
                serde_json::json!({ "exp_labels": all, "exp_annotations": expanded(rule, labels) })
            })
            .collect();
        cases.push(
            serde_json::json!({ "eval_time": "30m", "alertname": alert, "exp_alerts": exp_alerts }),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let rules_file = dir.path().join("etcdfleet-alerts.yaml");
    std::fs::write(&rules_file, etcdfleet_api::yaml::to_string(&spec).unwrap()).unwrap();
    // The same series with one backup 30 hours old: only BackupTooOld moves.
    let old_backup = {
        let m = Metrics::new();
        m.set_cluster_conditions(
            "t/old-backup",
            Some(&[condition("Available", "True", "QuorumHealthy")]),
        );
        m.observe_backup_recorded(
            "t/old-backup",
            std::time::SystemTime::now() - Duration::from_secs(30 * 3600),
            Some(1),
        );
        m.encode()
    };
    let backup_rule = rules
        .iter()
        .find(|r| r["alert"].as_str() == Some("EtcdfleetBackupTooOld"))
        .unwrap();
    let (recovered_series, recovered_case) = recovery_case(&rules);
    let mut backup_labels = cluster("t/old-backup");
    backup_labels["severity"] = backup_rule["labels"]["severity"].as_str().unwrap().into();
    let tests = serde_json::json!({
        "rule_files": [rules_file],
        "evaluation_interval": "1m",
        "tests": [
            { "interval": "1m", "input_series": input_series(&exposition, 40), "alert_rule_test": cases },
            {
                "interval": "1m",
                "input_series": input_series(&old_backup, 40),
                "alert_rule_test": [{
                    "eval_time": "5m",
                    "alertname": "EtcdfleetBackupTooOld",
                    "exp_alerts": [{
                        "exp_labels": backup_labels,
                        "exp_annotations": expanded(backup_rule, &cluster("t/old-backup")),
                    }],
                }],
            },
            {
                "interval": "1m",
                "input_series": [recovered_series],
                "alert_rule_test": [recovered_case],
            },
        ],
    });
    let test_file = dir.path().join("alerts-test.yaml");
    std::fs::write(&test_file, etcdfleet_api::yaml::to_string(&tests).unwrap()).unwrap();
    let out = run_promtool(&["test".as_ref(), "rules".as_ref(), test_file.as_os_str()]);
    assert!(out.contains("SUCCESS"), "{out}");
}
