//! Validation on a real API server: each bad input a new user met is refused
//! by kube-apiserver at apply time with a message naming the field, nothing
//! is stored, every wrong field of one object is reported at once, and the
//! offline check (`etcdfleet render`/`plan`) refuses the same objects with
//! the same field paths. The shipped CRDs' CEL rules fit the API server's
//! cost budget (it refuses to install them otherwise).

use anyhow::Result;
use etcdfleet_controllers::cli::validate_offline;
use etcdfleet_tests::control_plane::scenario::{NS, STAGE_LABEL, installed_world};

/// An EtcdCluster named `name` with `spec` (flow YAML) added to a valid one.
fn cluster(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1beta1\nkind: EtcdCluster\nmetadata: {{name: {name}, namespace: {NS}, labels: {{{STAGE_LABEL}: dev}}}}\n\
         spec: {{clusterRef: {{name: w1}}, version: 3.5.35, replicas: 3, {spec}}}\n"
    )
}

/// The offline validator's messages for the same object.
fn offline(yaml: &str) -> String {
    let value: serde_json::Value = etcdfleet_api::yaml::from_str(yaml).expect("test YAML parses");
    validate_offline("EtcdCluster", &value)
        .err()
        .unwrap_or_default()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_validation_refuses_each_bad_input_naming_the_field_and_stores_nothing() -> Result<()>
{
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let cases = [
        (
            "storage: {size: -5Gi}",
            "spec.storage.size",
            "size must be a positive quantity",
        ),
        (
            "storage: {size: \"0\"}",
            "spec.storage.size",
            "size must be a positive quantity",
        ),
        (
            "resources: {requests: {memory: lots}}",
            "spec.resources.requests.memory",
            "should match",
        ),
        (
            "resources: {limits: {cpu: \"-1\"}}",
            "spec.resources.limits.cpu",
            "should match",
        ),
        (
            "backup: {schedule: every night}",
            "spec.backup.schedule",
            "five space-separated cron fields",
        ),
    ];
    for (i, (spec, field, message)) in cases.iter().enumerate() {
        let yaml = cluster(&format!("bad-{i}"), spec);
        let refused = world
            .apply(&yaml)
            .expect_err(&format!("the API server accepted {spec}"));
        let refused = format!("{refused:#}");
        assert!(
            refused.contains(field) && refused.contains(message),
            "{spec}: the API server's refusal does not name {field} / {message}: {refused}"
        );
        let offline = offline(&yaml);
        assert!(
            offline.contains(field) && offline.contains(message),
            "{spec}: offline: {offline}"
        );
    }
    // Three wrong fields in one object: all three named in one refusal.
    let yaml = cluster(
        "bad-all",
        "storage: {size: -5Gi}, resources: {requests: {memory: lots}}, backup: {schedule: every night}",
    );
    let refused = format!(
        "{:#}",
        world.apply(&yaml).expect_err("accepted three bad fields")
    );
    let offline = offline(&yaml);
    for field in [
        "spec.storage.size",
        "spec.resources",
        "spec.backup.schedule",
    ] {
        assert!(
            refused.contains(field),
            "API server omits {field}: {refused}"
        );
        assert!(offline.contains(field), "offline omits {field}: {offline}");
    }
    // Nothing was stored; a good object still is.
    let listed = world.kubectl(&["get", "etcdclusters", "-n", NS, "-o", "name"])?;
    assert!(
        listed.trim().is_empty(),
        "refused objects were stored: {listed}"
    );
    world.apply(&cluster(
        "good",
        "storage: {size: 8Gi}, backup: {schedule: \"0 2 * * *\"}",
    ))?;
    let listed = world.kubectl(&["get", "etcdclusters", "-n", NS, "-o", "name"])?;
    assert_eq!(listed.trim(), "etcdcluster.etcdfleet.dev/good");
    Ok(())
}
