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
