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
    // The template's version, resolved into the cluster's spec.
    let template = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/ha-3.yaml"),
    )
    .unwrap();
    let version = template
        .lines()
        .find_map(|l| l.strip_prefix("  version: "))
        .expect("ha-3 names a version");
    // The writer quotes strings that start like a number.
    assert!(
        stdout.contains(&format!("version: \"{version}\"")),
        "{stdout}"
    );
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
    // A new cluster is a change to make.
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stdout.contains("shop"), "{stdout}");
    assert!(
        stdout.to_lowercase().contains("bootstrap") || stdout.contains("create"),
        "{stdout}"
    );
}

/// A cluster manifest with one field changed; `spec` lines are indented by two.
fn cluster_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n{spec}"
    )
}

const GOOD_SPEC: &str = "  clusterRef: {name: shop}\n  version: 3.5.1\n  replicas: 3\n";

/// Each input the API server would refuse, with the field path the error
/// must name.
fn bad_inputs() -> Vec<(&'static str, String, &'static str)> {
    vec![
        (
            "wrong apiVersion",
            cluster_yaml("bad", GOOD_SPEC).replace("v1alpha1", "v9"),
            "apiVersion: Unsupported value: \"etcdfleet.dev/v9\"",
        ),
        (
            "misspelt field",
            cluster_yaml("bad", &format!("{GOOD_SPEC}  replicsa: 3\n")),
            "spec.replicsa: unknown field",
        ),
        (
            "both cluster references",
            cluster_yaml(
                "bad",
                &format!("{GOOD_SPEC}  kubeconfigSecretRef: {{name: kc}}\n"),
            ),
            "spec: Invalid value: \"object\": exactly one of clusterRef or kubeconfigSecretRef",
        ),
        (
            "no cluster reference",
            cluster_yaml("bad", "  version: 3.5.1\n  replicas: 3\n"),
            "spec: Invalid value: \"object\": exactly one of clusterRef or kubeconfigSecretRef",
        ),
        (
            "storage size that is no quantity",
            cluster_yaml("bad", &format!("{GOOD_SPEC}  storage: {{size: lots}}\n")),
            "spec.storage.size: Invalid value",
        ),
        (
            "image repository that is no repository",
            cluster_yaml(
                "bad",
                &format!("{GOOD_SPEC}  imageRepository: \"not a repo!!\"\n"),
            ),
            "spec.imageRepository: Invalid value",
        ),
        (
            "retention that is no duration",
            cluster_yaml(
                "bad",
                &format!("{GOOD_SPEC}  etcd: {{autoCompactionRetention: forever}}\n"),
            ),
            "spec.etcd.autoCompactionRetention: Invalid value",
        ),
        (
            "version 4",
            cluster_yaml(
                "bad",
                "  clusterRef: {name: shop}\n  version: 4.0.0\n  replicas: 3\n",
            ),
            "spec.version: Invalid value",
        ),
        (
            "integer beyond int64",
            cluster_yaml(
                "bad",
                "  clusterRef: {name: shop}\n  version: 3.5.1\n  replicas: 99999999999999999999999\n",
            ),
            "spec.replicas: Invalid value",
        ),
    ]
}

fn write(dir: &std::path::Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn render_and_plan_refuse_each_bad_input_naming_the_field_and_keep_the_good_cluster() {
    let dir = tempfile::tempdir().unwrap();
    for (what, bad, field) in bad_inputs() {
        // The bad cluster first: it must not hide the good one after it.
        let file = write(
            dir.path(),
            "fleet.yaml",
            &format!("{bad}\n---\n{}", cluster_yaml("good", GOOD_SPEC)),
        );
        let out = etcdfleet(&["render", "--cluster", &file]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "render, {what}: {stderr}");
        assert!(
            stderr.contains(field),
            "render, {what}: {field:?} not in {stderr}"
        );
        assert!(
            stdout.contains("# EtcdCluster shop/good"),
            "render, {what}: {stdout}"
        );

        let out = etcdfleet(&["plan", "-f", &file]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "plan, {what}: {stderr}");
        assert!(
            stderr.contains(field),
            "plan, {what}: {field:?} not in {stderr}"
        );
        assert!(
            stdout.contains("EtcdCluster shop/good"),
            "plan, {what}: {stdout}"
        );
    }
}

fn member(cluster: &str, ordinal: u32, leader: bool) -> String {
    format!(
        "    - name: {cluster}-etcd-{ordinal}\n      id: \"{:x}\"\n      version: 3.5.1\n      leader: {leader}\n      healthy: true\n",
        0xa0 + ordinal
    )
}

fn running(name: &str, spec: &str) -> String {
    format!(
        "{}status:\n  currentVersion: 3.5.1\n  members:\n{}{}{}",
        cluster_yaml(name, spec),
        member(name, 0, true),
        member(name, 1, false),
        member(name, 2, false)
    )
}

#[test]
fn plan_exit_code_is_0_when_every_cluster_is_converged() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "fleet.yaml", &running("shop", GOOD_SPEC));
    let out = etcdfleet(&["plan", "-f", &file]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("next: no change"), "{stdout}");
}

#[test]
fn plan_exit_code_is_3_when_a_cluster_has_changes_to_make() {
    let dir = tempfile::tempdir().unwrap();
    let scale = GOOD_SPEC.replace("replicas: 3", "replicas: 5");
    let file = write(
        dir.path(),
        "fleet.yaml",
        &format!(
            "{}\n---\n{}",
            running("shop", GOOD_SPEC),
            running("grow", &scale)
        ),
    );
    let out = etcdfleet(&["plan", "-f", &file]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("scale: add member 3 as a learner"),
        "{stdout}"
    );
}

#[test]
fn plan_exit_code_is_4_when_a_cluster_is_rejected_or_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let downgrade = GOOD_SPEC.replace("3.5.1", "3.4.0");
    let missing = format!("{GOOD_SPEC}  templateRef: {{kind: ClusterEtcdTemplate, name: nope}}\n");
    for (what, cluster) in [
        ("rejected downgrade", running("shop", &downgrade)),
        ("template not found", cluster_yaml("shop", &missing)),
    ] {
        // A cluster with changes beside it does not lower the code.
        let scale = GOOD_SPEC.replace("replicas: 3", "replicas: 5");
        let file = write(
            dir.path(),
            "fleet.yaml",
            &format!("{cluster}\n---\n{}", running("grow", &scale)),
        );
        let out = etcdfleet(&["plan", "-f", &file]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(4), "{what}: {stdout}{stderr}");
        assert!(
            stdout.contains("rejected") || stdout.contains("blocked"),
            "{what}: {stdout}"
        );
    }
}

#[test]
fn plan_exit_code_is_2_for_input_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let out = etcdfleet(&["plan", "-f", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let file = write(dir.path(), "broken.yaml", "kind: [unclosed\n");
    let out = etcdfleet(&["plan", "-f", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
}

#[test]
fn plan_help_documents_the_exit_codes() {
    let out = etcdfleet(&["plan", "--help"]);
    let (stdout, _) = text(&out);
    for code in [
        "0 every cluster converged",
        "3 some cluster has changes",
        "4 some cluster is rejected or blocked",
        "2 input errors",
    ] {
        assert!(stdout.contains(code), "{code:?} not in {stdout}");
    }
}
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
        ("sharding.enabled", "--sharding"),
        ("sharding.shardName", "--shard-name"),
        ("sharding.leasePrefix", "--shard-lease-prefix"),
        ("metricsAddress", "--metrics-address"),
        ("logFormat", "--log-format"),
        ("maxConcurrentReconciles", "--max-concurrent-reconciles"),
        ("debounceMilliseconds", "--debounce-milliseconds"),
        ("shutdownGraceSeconds", "--shutdown-grace-seconds"),
        ("dialer", "--dialer"),
        ("tracing.otlpEndpoint", "--otlp-endpoint"),
        ("seederImage", "--seeder-image"),
        ("caRotateBeforeDays", "--ca-rotate-before-days"),
        ("maxConcurrentDrills", "--max-concurrent-drills"),
        ("drillTimeoutSeconds", "--drill-timeout-seconds"),
        (
            "maxReconcilesPerNamespace",
            "--max-reconciles-per-namespace",
        ),
        (
            "tenancy.workloadIdentityNamespaces",
            "--workload-identity-namespace",
        ),
        (
            "tenancy.localDestinationNamespaces",
            "--local-destination-namespace",
        ),
        (
            "tenancy.minScheduleIntervalSeconds",
            "--min-schedule-interval-seconds",
        ),
        ("tenancy.defaultRetentionCount", "--default-retention-count"),
    ];
    // Every field the file can hold, from the configuration type itself, so
    // a new field without a flag fails here.
    let default =
        serde_json::to_value(etcdfleet_controllers::config::ControllerConfig::default()).unwrap();
    let mut fields = Vec::new();
    for (k, v) in default.as_object().expect("the configuration is an object") {
        match v.as_object() {
            Some(inner) => {
                for ik in inner.keys() {
                    fields.push(format!("{k}.{ik}"));
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
