//! The `etcdfleet` binary's offline subcommands, run as a platform engineer
//! would run them: on the shipped samples and templates.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn etcdfleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etcdfleet"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the etcdfleet binary runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn render_shows_resolved_fields_their_sources_and_the_objects() {
    let out = etcdfleet(&[
        "render",
        "--cluster",
        "config/samples/etcdcluster-minimal.yaml",
        "--cluster-template",
        "templates/ha-3.yaml",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("3.5.1"), "{stdout}");
    assert!(stdout.contains("ClusterEtcdTemplate/ha-3"), "{stdout}");
    for kind in [
        "kind: StatefulSet",
        "kind: Service",
        "kind: PodDisruptionBudget",
        "kind: ConfigMap",
    ] {
        assert!(stdout.contains(kind), "{kind} missing from:\n{stdout}");
    }
}

#[test]
fn render_without_the_template_fails_naming_it() {
    let out = etcdfleet(&[
        "render",
        "--cluster",
        "config/samples/etcdcluster-minimal.yaml",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("ha-3") && stderr.contains("not found"),
        "{stderr}"
    );
}

#[test]
fn plan_says_what_would_happen_to_each_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("fleet.yaml");
    std::fs::write(
        &manifests,
        format!(
            "{}\n---\n{}",
            std::fs::read_to_string(root().join("config/samples/etcdcluster-minimal.yaml"))
                .unwrap(),
            std::fs::read_to_string(root().join("templates/ha-3.yaml")).unwrap()
        ),
    )
    .unwrap();
    let out = etcdfleet(&["plan", "-f", manifests.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("shop"), "{stdout}");
    assert!(
        stdout.to_lowercase().contains("bootstrap") || stdout.contains("create"),
        "{stdout}"
    );
}

/// The option lines of a `--help` text with whether each has a description
/// (on its own line, or on the next, deeper-indented line).
fn options_without_description(help: &str) -> Vec<String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if !trimmed.starts_with('-') {
            continue;
        }
        // clap separates the flag from its description by two or more spaces.
        let same_line = trimmed
            .split_once("  ")
            .is_some_and(|(_, d)| !d.trim().is_empty());
        let indent = line.len() - trimmed.len();
        let next_line = lines.get(i + 1).is_some_and(|n| {
            let t = n.trim_start();
            !t.is_empty() && !t.starts_with('-') && n.len() - t.len() > indent
        });
        if !same_line && !next_line {
            missing.push(trimmed.to_string());
        }
    }
    missing
}

#[test]
fn every_flag_of_every_subcommand_has_a_description() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["render", "--help"],
        &["plan", "--help"],
    ] {
        let out = etcdfleet(args);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(stdout.contains("--help"), "{args:?}: {stdout}");
        let missing = options_without_description(&stdout);
        assert!(
            missing.is_empty(),
            "{args:?}: flags without a description: {missing:?}\n{stdout}"
        );
    }
}

#[test]
fn every_config_file_field_has_a_run_flag() {
    // Field path in the config file -> the `run` flag that overrides it.
    let flags = [
        ("namespaces", "--namespace"),
        ("labelSelector", "--label-selector"),
        (
            "memberFailureGraceSeconds",
            "--member-failure-grace-seconds",
        ),
        ("deletionTimeoutSeconds", "--deletion-timeout-seconds"),
        ("requeueConvergedSeconds", "--requeue-converged-seconds"),
        ("leaderElection.enabled", "--leader-elect"),
        ("leaderElection.leaseName", "--lease-name"),
        ("leaderElection.leaseNamespace", "--lease-namespace"),
        (
            "leaderElection.leaseDurationSeconds",
            "--lease-duration-seconds",
        ),
        (
            "leaderElection.renewIntervalSeconds",
            "--lease-renew-interval-seconds",
        ),
        (
            "leaderElection.renewDeadlineSeconds",
            "--lease-renew-deadline-seconds",
        ),
        ("metricsAddress", "--metrics-address"),
        ("logFormat", "--log-format"),
        ("maxConcurrentReconciles", "--max-concurrent-reconciles"),
        ("debounceMilliseconds", "--debounce-milliseconds"),
        ("shutdownGraceSeconds", "--shutdown-grace-seconds"),
    ];
    // Every field the file can hold, from the configuration type itself, so
    // a new field without a flag fails here.
    let default =
        serde_yaml::to_value(etcdfleet_controllers::config::ControllerConfig::default()).unwrap();
    let mut fields = Vec::new();
    for (k, v) in default.as_mapping().unwrap() {
        let k = k.as_str().unwrap();
        match v.as_mapping() {
            Some(inner) => {
                for (ik, _) in inner {
                    fields.push(format!("{k}.{}", ik.as_str().unwrap()));
                }
            }
            None => fields.push(k.to_string()),
        }
    }
    let out = etcdfleet(&["run", "--help"]);
    let (help, _) = text(&out);
    for field in &fields {
        let Some((_, flag)) = flags.iter().find(|(f, _)| f == field) else {
            panic!("config field {field} has no flag in this test's table (nor, likely, in `run`)");
        };
        assert!(
            help.contains(&format!("{flag} ")),
            "{field}: {flag} missing from run --help:\n{help}"
        );
        // The description names the file field it overrides.
        assert!(
            help.contains(&format!("file: {field}")),
            "{flag}'s description does not name {field}:\n{help}"
        );
    }
}
