//! The offline subcommands, from YAML fixtures.

use std::time::Duration;

use etcdfleet_api::version::VersionChange;

use super::*;

const TEMPLATES: &str = r#"
apiVersion: etcdfleet.dev/v1alpha1
kind: ClusterEtcdTemplate
metadata: {name: ha-3}
spec:
  version: 3.5.1
  replicas: 3
  storage: {size: 20Gi}
  tls: {enabled: true}
---
apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdTemplate
metadata: {name: payments, namespace: team-pay}
spec:
  baseTemplate: ha-3
  replicas: 5
"#;

fn now() -> k8s_openapi::jiff::Timestamp {
    "2025-06-01T12:00:00Z".parse().unwrap()
}

fn plan(yaml: &str) -> Vec<ClusterPlan> {
    let mut m = Manifests::parse(TEMPLATES, "templates.yaml").unwrap();
    m.extend(Manifests::parse(yaml, "clusters.yaml").unwrap());
    plan_all(&m, now(), Duration::from_secs(120))
}

fn member(ordinal: u32, version: &str, leader: bool, healthy: bool) -> String {
    format!(
        "      - name: c-etcd-{ordinal}\n        id: \"{:x}\"\n        version: {version}\n        leader: {leader}\n        healthy: {healthy}\n",
        0xa0 + ordinal
    )
}

/// `n` healthy members on `version`, the first one leading.
fn healthy(n: u32, version: &str) -> Vec<String> {
    (0..n).map(|o| member(o, version, o == 0, true)).collect()
}

fn cluster(spec: &str, current: &str, members: &[String]) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{name: c, namespace: team-pay}}\nspec:\n  clusterRef: {{name: c}}\n{spec}status:\n  currentVersion: {current}\n  members:\n{}",
        members.concat()
    )
}

#[test]
fn parses_multi_doc_and_lists() {
    let yaml = format!(
        "{TEMPLATES}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: etcdfleet.dev/v1alpha1\n  kind: EtcdCluster\n  metadata: {{name: a, namespace: n}}\n  spec: {{clusterRef: {{name: a}}, version: 3.5.1, replicas: 1}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n"
    );
    let m = Manifests::parse(&yaml, "all.yaml").unwrap();
    assert_eq!(m.cluster_templates.len(), 1);
    assert_eq!(m.templates.len(), 1);
    assert_eq!(m.clusters.len(), 1);
    assert_eq!(m.ignored, vec!["ConfigMap x"]);
}

#[test]
fn bad_documents_are_named_and_do_not_hide_good_ones() {
    let m = Manifests::parse(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a}\nspec: {clusterRef: {name: a}, replicas: three}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: b}\nspec: {clusterRef: {name: b}, replicas: 3}\n",
        "bad.yaml",
    )
    .unwrap();
    assert_eq!(m.clusters.len(), 1, "the good cluster is kept");
    let err = m.invalid[0].to_string();
    assert_eq!(
        err,
        "bad.yaml: document 1: EtcdCluster \"a\" is invalid: spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"; <nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
    );
    let err = Manifests::parse("metadata: {name: a}\n", "x.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no kind"), "{err}");
}

#[test]
fn render_shows_sources_and_objects() {
    let mut m = Manifests::parse(TEMPLATES, "t.yaml").unwrap();
    m.extend(
        Manifests::parse(
            "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: shop, namespace: team-pay}\nspec:\n  clusterRef: {name: shop}\n  templateRef: {kind: EtcdTemplate, name: payments}\n  storage: {size: 50Gi}\n",
            "c.yaml",
        )
        .unwrap(),
    );
    let report = render_cluster(&m.clusters[0], &m).unwrap();
    assert_eq!(report.resolution.spec.replicas, 5);
    let text = report.to_string();
    assert!(text.contains("spec.version"), "{text}");
    assert!(text.contains("ClusterEtcdTemplate/ha-3"), "{text}");
    assert!(text.contains("EtcdTemplate/payments"), "{text}");
    assert!(text.contains("spec.storage.size"), "{text}");
    let kinds: Vec<&str> = report
        .objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "Service",
            "Service",
            "PodDisruptionBudget",
            "ConfigMap",
            "StatefulSet"
        ]
    );
    assert!(text.contains("kind: StatefulSet"));
    assert!(text.contains("image: gcr.io/etcd-development/etcd:v3.5.1"));
}

#[test]
fn render_errors_name_the_field() {
    let m = Manifests::parse(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a, namespace: n}\nspec:\n  clusterRef: {name: a}\n  templateRef: {kind: ClusterEtcdTemplate, name: nope}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: b, namespace: n}\nspec: {clusterRef: {name: b}, replicas: 3}\n---\napiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: c, namespace: n}\nspec: {clusterRef: {name: c}, version: 3.5.1, replicas: 4}\n",
        "c.yaml",
    )
    .unwrap();
    let errs: Vec<String> = m
        .clusters
        .iter()
        .map(|c| render_cluster(c, &m).unwrap_err().to_string())
        .collect();
    assert!(
        errs[0].contains("n/a: spec.templateRef: ClusterEtcdTemplate \"nope\" not found"),
        "{}",
        errs[0]
    );
    assert!(errs[1].contains("spec.version"), "{}", errs[1]);
    // An even replica count is refused by the CRD's rule before rendering.
    let invalid = m.invalid[0].to_string();
    assert!(
        invalid.contains("EtcdCluster \"c\" is invalid: spec.replicas: Invalid value"),
        "{invalid}"
    );
}

#[test]
fn plan_upgrade_restarts_a_follower_onto_the_new_image() {
    let members = healthy(3, "3.5.0");
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.0",
        &members,
    ))[0];
    assert_eq!(p.resolve, Ok(ResolutionBasis::Templates));
    assert!(
        p.version
            .as_ref()
            .unwrap()
            .to_string()
            .starts_with("accepted: patch upgrade"),
        "{p}"
    );
    assert_eq!(
        p.next,
        "upgrade: restart member c-etcd-1 onto gcr.io/etcd-development/etcd:v3.5.1"
    );
}

#[test]
fn plan_upgrade_moves_leadership_last() {
    let members = [
        member(0, "3.5.0", true, true),
        member(1, "3.5.1", false, true),
        member(2, "3.5.1", false, true),
    ];
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.0",
        &members,
    ))[0];
    assert_eq!(p.next, "upgrade: move leadership from c-etcd-0 to c-etcd-1");
}

#[test]
fn plan_scale_up_adds_a_learner() {
    let members = healthy(3, "3.5.1");
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 5\n",
        "3.5.1",
        &members,
    ))[0];
    assert_eq!(
        p.version,
        Some(VersionVerdict::Accepted(VersionChange::NoChange {
            version: "3.5.1".parse().unwrap()
        }))
    );
    assert!(p.to_string().contains("version: no-op"), "{p}");
    assert_eq!(p.next, "scale: add member 3 as a learner");
}

#[test]
fn plan_shows_the_volume_steps_of_a_growth_and_refuses_a_shrink() {
    let members = healthy(3, "3.5.1");
    let with_size = |size: &str| {
        cluster(
            &format!("  version: 3.5.1\n  replicas: 3\n  storage: {{size: {size}}}\n"),
            "3.5.1",
            &members,
        ) + "  volumeSize: 8Gi\n"
    };
    let p = &plan(&with_size("16Gi"))[0];
    assert_eq!(
        p.next,
        "storage: expand the volume of ordinal 1 to 16Gi (the StorageClass must allow \
         expansion: checked against the workload cluster)"
    );
    let p = &plan(&with_size("4Gi"))[0];
    assert!(p.next.starts_with("refused (StorageShrink)"), "{}", p.next);
    assert_eq!(plan(&with_size("8Gi"))[0].next, "no change");
}

#[test]
fn plan_waits_for_an_unhealthy_member() {
    let members = [
        member(0, "3.5.1", true, true),
        member(1, "3.5.1", false, true),
        member(2, "3.5.1", false, false),
    ];
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.1",
        &members,
    ))[0];
    assert!(
        p.next.starts_with("waiting: member c-etcd-2 is unhealthy"),
        "{}",
        p.next
    );
}

#[test]
fn plan_replaces_a_member_failed_past_the_grace() {
    let mut sick = member(2, "3.5.1", false, false);
    sick.push_str("        unhealthySince: \"2025-06-01T11:50:00Z\"\n");
    let members = [
        member(0, "3.5.1", true, true),
        member(1, "3.5.1", false, true),
        sick,
    ];
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.1",
        &members,
    ))[0];
    assert!(
        p.next.starts_with("repair: remove member c-etcd-2 (a2)"),
        "{}",
        p.next
    );
}

/// `cluster` with an `Available` condition in its status.
fn with_available(yaml: String, status: &str, reason: &str) -> String {
    format!(
        "{yaml}  conditions:\n      - type: Available\n        status: \"{status}\"\n        reason: {reason}\n        message: as reported\n        lastTransitionTime: \"2025-06-01T11:59:00Z\"\n"
    )
}

#[test]
fn plan_of_a_controller_cut_off_from_ready_members_holds_without_restore_advice() {
    // No member answered the last reconcile (the list is as last seen),
    // or only one did; their pods were Ready by etcd's own health check.
    let all_silent = healthy(3, "3.5.1");
    let one_answers = [
        member(0, "3.5.1", true, true),
        member(1, "3.5.1", false, false),
        member(2, "3.5.1", false, false),
    ];
    for members in [&all_silent[..], &one_answers[..]] {
        let yaml = cluster("  version: 3.5.1\n  replicas: 3\n", "3.5.1", members);
        let p = &plan(&with_available(
            yaml,
            "Unknown",
            "MembersUnreachableFromController",
        ))[0];
        assert!(
            p.next.starts_with("blocked, needs attention:")
                && p.next.contains("cut off")
                && p.next.contains("network")
                && !p.next.contains("quorum lost")
                && !p.next.contains("restore"),
            "{}",
            p.next
        );
        assert_eq!(p.outcome(), PlanOutcome::Blocked);
    }
    // Quorum lost by the members' own health: the advice stays.
    let yaml = cluster("  version: 3.5.1\n  replicas: 3\n", "3.5.1", &all_silent);
    let p = &plan(&with_available(yaml, "False", "QuorumLost"))[0];
    assert!(
        p.next.contains("quorum lost") && p.next.contains("restore"),
        "{}",
        p.next
    );
}

#[test]
fn plan_exit_code_prefers_input_errors_then_blocked_then_changes() {
    let members = healthy(3, "3.5.1");
    let converged = plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.1",
        &members,
    ));
    let scaling = plan(&cluster(
        "  version: 3.5.1\n  replicas: 5\n",
        "3.5.1",
        &members,
    ));
    let rejected = plan(&cluster(
        "  version: 3.4.0\n  replicas: 3\n",
        "3.5.1",
        &members,
    ));
    let paused = plan(&cluster(
        "  version: 3.5.1\n  replicas: 5\n  paused: true\n",
        "3.5.1",
        &members,
    ));
    assert_eq!(converged[0].outcome(), PlanOutcome::NoChange);
    assert_eq!(scaling[0].outcome(), PlanOutcome::Changes);
    assert_eq!(rejected[0].outcome(), PlanOutcome::Blocked);
    assert_eq!(paused[0].outcome(), PlanOutcome::NoChange);
    let all: Vec<ClusterPlan> = [&converged, &scaling, &rejected]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert_eq!(plan_exit_code(&converged, 0), EXIT_NO_CHANGE);
    assert_eq!(
        plan_exit_code(&[converged[0].clone(), scaling[0].clone()], 0),
        EXIT_CHANGES
    );
    assert_eq!(plan_exit_code(&all, 0), EXIT_BLOCKED);
    assert_eq!(plan_exit_code(&all, 1), EXIT_INPUT_ERROR);
}

/// One EtcdCluster with `spec` (YAML flow mapping fields).
fn cluster_with(spec: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{name: a, namespace: t}}\n\
         spec: {{clusterRef: {{name: a}}, version: 3.5.1, replicas: 3, {spec}}}\n"
    )
}

fn offline_errors(spec: &str) -> String {
    let m = Manifests::parse(&cluster_with(spec), "c.yaml").unwrap();
    m.invalid
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_recovery_policy_is_refused_offline_as_the_api_server_refuses_it() {
    for (spec, wanted) in [
        (
            "recovery: {quorumLoss: Sometimes}",
            "spec.recovery.quorumLoss: Unsupported value: \"Sometimes\"",
        ),
        (
            "recovery: {lostAfterSeconds: 5}",
            "lostAfterSeconds must be between 30 and 604800",
        ),
    ] {
        let errors = offline_errors(spec);
        assert!(errors.contains(wanted), "{spec}: {errors}");
    }
    assert_eq!(
        offline_errors("recovery: {quorumLoss: FromSurvivors, lostAfterSeconds: 600}"),
        ""
    );
    assert_eq!(offline_errors("recovery: {quorumLoss: FromBackup}"), "");
    assert!(
        offline_errors("recovery: {quorumLoss: FromSnapshot}").contains("FromSnapshot"),
        "{}",
        offline_errors("recovery: {quorumLoss: FromSnapshot}")
    );
}

#[test]
fn sizes_quantities_and_schedules_are_refused_offline_as_the_api_server_refuses_them() {
    for (spec, wanted) in [
        ("storage: {size: -5Gi}", "size must be a positive quantity"),
        ("storage: {size: \"0\"}", "size must be a positive quantity"),
        (
            "resources: {requests: {memory: lots}}",
            "spec.resources.requests.memory in body should match",
        ),
        (
            "resources: {limits: {cpu: \"-1\"}}",
            "spec.resources.limits.cpu in body should match",
        ),
        (
            "backup: {schedule: every night}",
            "five space-separated cron fields",
        ),
        (
            "backup: {schedule: \"61 * * * *\"}",
            "spec.backup.schedule: Invalid value: \"61 * * * *\"",
        ),
    ] {
        let errors = offline_errors(spec);
        assert!(errors.contains(wanted), "{spec}: {errors}");
    }
    assert_eq!(
        offline_errors("storage: {size: 8Gi}, backup: {schedule: \"0 2 * * *\"}"),
        ""
    );
}

#[test]
fn every_wrong_field_of_an_object_is_reported_at_once() {
    let errors = offline_errors(
        "storage: {size: -5Gi}, resources: {requests: {memory: lots}}, backup: {schedule: every night}",
    );
    for wanted in [
        "spec.storage.size",
        "spec.resources",
        "spec.backup.schedule",
    ] {
        assert!(errors.contains(wanted), "{wanted} missing from: {errors}");
    }
}

#[test]
fn a_status_with_a_version_but_no_members_tells_one_story() {
    let with = |version: &str| {
        format!(
            "apiVersion: etcdfleet.dev/v1beta1\nkind: EtcdCluster\nmetadata: {{name: c, namespace: team-pay}}\n\
             spec: {{clusterRef: {{name: c}}, version: {version}, replicas: 3}}\n\
             status: {{currentVersion: 3.5.1}}\n"
        )
    };
    // A downgrade is refused, and nothing is planned beside the refusal.
    let refused = plan(&with("3.4.23"))[0].to_string();
    assert!(refused.contains("Downgrade"), "{refused}");
    assert!(
        refused.contains("blocked: spec.version is refused"),
        "{refused}"
    );
    // The version the status says runs: no change of version, and no
    // bootstrap of a cluster that ran.
    let same = plan(&with("3.5.1"))[0].to_string();
    assert!(same.contains("lists no members"), "{same}");
    for contradiction in ["create:", "bootstrap member 0", "rejected"] {
        assert!(!same.contains(contradiction), "{contradiction}: {same}");
    }
    assert!(!refused.contains("create:"), "{refused}");
    // A new cluster (no version in status) is still created.
    let new = plan(&with("3.5.1").replace("status: {currentVersion: 3.5.1}\n", ""))[0].to_string();
    assert!(new.contains("create: no members in status yet"), "{new}");
}

#[test]
fn render_refuses_a_version_plan_refuses() {
    let m = Manifests::parse(
        &cluster_with("storage: {size: 8Gi}").replace("3.5.1", "3.9.0"),
        "c.yaml",
    )
    .unwrap();
    let err = render_cluster(&m.clusters[0], &m).unwrap_err().to_string();
    assert!(
        err.contains("spec.version") && err.contains("3.9.0"),
        "{err}"
    );
    let plans = plan_all(&m, now(), Duration::from_secs(120));
    assert!(
        plans.iter().all(|p| p.to_string().contains("3.9.0")),
        "plan refuses it too"
    );
}

#[test]
fn plan_converged_is_no_change() {
    let members = healthy(3, "3.5.1");
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.1",
        &members,
    ))[0];
    assert_eq!(p.next, "no change");
}

#[test]
fn plan_scale_down_removes_the_highest_member() {
    let members = healthy(5, "3.5.1");
    let p = &plan(&cluster(
        "  version: 3.5.1\n  replicas: 3\n",
        "3.5.1",
        &members,
    ))[0];
    assert_eq!(
        p.next,
        "scale: remove member c-etcd-4 (a4) to shrink the cluster"
    );
}

#[test]
fn plan_rejected_version_holds_the_running_version() {
    let members = healthy(3, "3.5.1");
    let p = &plan(&cluster(
        "  version: 3.4.0\n  replicas: 3\n",
        "3.5.1",
        &members,
    ))[0];
    let text = p.to_string();
    assert!(
        text.contains("version: rejected: VersionAccepted=False (Downgrade)"),
        "{text}"
    );
    assert_eq!(p.next, "no change");
}

#[test]
fn plan_reports_resolve_errors() {
    let p = &plan(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: missing}\n",
    )[0];
    assert_eq!(p.resolve.as_ref().unwrap_err().0, "TemplateNotFound");
    assert!(
        p.to_string()
            .contains("TemplateResolved=False (TemplateNotFound)")
    );
    assert!(p.next.starts_with("blocked:"));
}

#[test]
fn plan_new_cluster_bootstraps() {
    let p = &plan(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: payments}\n",
    )[0];
    assert!(
        p.version
            .as_ref()
            .unwrap()
            .to_string()
            .starts_with("accepted: create at 3.5.1")
    );
    assert!(p.next.starts_with("create:"), "{}", p.next);
    assert!(p.next.contains("of 5"), "{}", p.next);
}

#[test]
fn plan_materialized_cluster_ignores_templates() {
    let p = &plan(
        "apiVersion: etcdfleet.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {name: x, namespace: team-pay}\nspec:\n  clusterRef: {name: x}\n  templateRef: {kind: EtcdTemplate, name: gone}\n  version: 3.5.1\n  replicas: 1\nstatus:\n  template: {kind: EtcdTemplate, name: gone}\n",
    )[0];
    assert_eq!(p.resolve, Ok(ResolutionBasis::Materialized));
}
