//! Fleet rollouts on real Kubernetes and real etcd: an `EtcdFleetRollout`
//! moves single-member clusters (several per workload cluster) to a new
//! etcd version in waves, through the controller's ServiceAccount under
//! the shipped RBAC, planned over a reflector of the EtcdClusters as
//! `etcdfleet run` plans it. What the rollout wrote is counted from the
//! management API server's audit log.

use std::time::Duration;

use anyhow::{Context as _, Result};
use etcdfleet_api::EtcdFleetRolloutStatus;
use etcdfleet_api::rollout::{cluster_state, condition, phase};
use etcdfleet_tests::control_plane::rollouts::{
    RolloutDriver, drive_until, rollout_writes, rollout_yaml,
};
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, get, installed_world, patch_spec,
};
use etcdfleet_tests::controller_process::etcdfleet_binary;
use serde_json::json;

const FROM: &str = "3.5.1";
const TO: &str = "3.5.21";

fn state_of<'a>(status: &'a EtcdFleetRolloutStatus, name: &str) -> &'a str {
    let key = format!("{NS}/{name}");
    status
        .clusters
        .iter()
        .find(|c| c.name == key)
        .map_or("absent", |c| c.state.as_str())
}

fn condition_true(status: &EtcdFleetRolloutStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

async fn spec_version(
    world: &etcdfleet_tests::control_plane::KubeWorld,
    name: &str,
) -> Result<String> {
    get(world, name)
        .await?
        .spec
        .config
        .version
        .context("no spec.version")
}

/// Ten clusters, a canary and two waves of five and four. The controller
/// restarts in the middle of wave 2; the rollout is paused and resumed
/// in wave 3; a person moves one wave-3 cluster elsewhere meanwhile. Every
/// cluster but that one is written exactly once and ends on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_rollout_of_ten_clusters_in_three_waves_through_a_restart_a_pause_and_a_persons_edit()
-> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let names: Vec<String> = (0..10).map(|i| format!("c{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut ctl = world.controller().await?;
    for name in &names {
        world.apply(&cluster_yaml(name, "w1", 1, FROM))?;
    }
    converge_real(&mut ctl, &names).await?;

    let strategy = "    canary: 1\n    waveSize: 5\n    maxInFlight: 3\n    soak: 2s\n    progressDeadline: 3m";
    world.apply(&rollout_yaml("to-21", TO, strategy, ""))?;
    let mut driver = RolloutDriver::start(&ctl).await?;
    let long = Duration::from_secs(180);

    // Mid wave 2: some of its clusters written, not all done.
    let status = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.clusters
            .iter()
            .any(|c| c.wave == 2 && c.state == cluster_state::IN_PROGRESS)
    })
    .await?;
    assert_eq!(
        status.waves.iter().map(|w| w.clusters).collect::<Vec<_>>(),
        [1, 5, 4],
        "{status:#?}"
    );
    assert_eq!(state_of(&status, "c00"), cluster_state::DONE);
    assert!(
        names[6..]
            .iter()
            .all(|n| state_of(&status, n) == cluster_state::PENDING),
        "wave 3 untouched while wave 2 runs: {status:#?}"
    );
    // The controller dies and a new one (new caches) takes over.
    ctl.restart();
    driver.restart(&ctl).await?;

    // A person moves c09 (wave 3, pending) to another version themselves.
    patch_spec(&world, "c09", json!({ "version": "3.5.35" }))?;

    // Wave 3 under way: pause. Nothing more is written while paused.
    drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.clusters
            .iter()
            .any(|c| c.wave == 3 && c.state != cluster_state::PENDING && c.name != "team-a/c09")
    })
    .await?;
    world.kubectl(&[
        "patch",
        "etcdfleetrollout/to-21",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ])?;
    let paused = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::PAUSED)
    })
    .await?;
    let writes_when_paused = rollout_writes(&world, "to-21")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::PAUSED)
    })
    .await?;
    assert_eq!(
        rollout_writes(&world, "to-21")?,
        writes_when_paused,
        "nothing written while paused"
    );
    assert_eq!(still.counts.pending, paused.counts.pending, "{still:#?}");
    assert!(
        still.counts.pending > 0,
        "paused before the end: {still:#?}"
    );

    world.kubectl(&[
        "patch",
        "etcdfleetrollout/to-21",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":false}}"#,
    ])?;
    let done = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::COMPLETE)
    })
    .await?;
    converge_real(&mut ctl, &names).await?;

    assert!(condition_true(&done, condition::COMPLETE), "{done:#?}");
    assert!(!condition_true(&done, condition::HALTED), "{done:#?}");
    assert_eq!((done.counts.done, done.counts.skipped), (9, 1), "{done:#?}");
    let edited = done
        .clusters
        .iter()
        .find(|c| c.name == "team-a/c09")
        .context("c09 recorded")?;
    assert_eq!(edited.state, cluster_state::SKIPPED, "{edited:#?}");
    assert_eq!(
        edited.reason.as_deref(),
        Some("EditedByPerson"),
        "{edited:#?}"
    );
    assert!(
        edited
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("3.5.35"),
        "{edited:#?}"
    );

    // Each of the nine written exactly once, across the restart; the
    // person's cluster never.
    let writes = rollout_writes(&world, "to-21")?;
    let expected: std::collections::BTreeMap<String, usize> =
        names[..9].iter().map(|n| (n.to_string(), 1)).collect();
    assert_eq!(writes, expected);
    for name in &names[..9] {
        let cluster = get(&world, name).await?;
        assert_eq!(cluster.spec.config.version.as_deref(), Some(TO), "{name}");
        let status = cluster.status.context("status")?;
        assert_eq!(status.current_version.as_deref(), Some(TO), "{name}");
        assert_eq!(
            status.rollout.map(|r| r.name).as_deref(),
            Some("to-21"),
            "{name} says which rollout changed it"
        );
    }
    assert_eq!(spec_version(&world, "c09").await?, "3.5.35");
    let c09 = get(&world, "c09").await?.status.context("status")?;
    assert_eq!(c09.current_version.as_deref(), Some("3.5.35"));
    assert!(c09.rollout.is_none(), "{c09:#?}");
    Ok(())
}

/// Five clusters; one in wave 2 asks for a newer version than the target
/// (a downgrade the version policy refuses). The offline preview of the
/// live clusters names it; the rollout halts before wave 2 writes
/// anything; excluding it and resuming finishes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_rollout_halts_at_a_refused_cluster_in_wave_two_as_the_offline_preview_said()
-> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let names = ["r0", "r1", "r2", "r3", "r4"];
    let mut ctl = world.controller().await?;
    for name in names {
        let version = if name == "r2" { "3.5.35" } else { FROM };
        world.apply(&cluster_yaml(name, "w1", 1, version))?;
    }
    converge_real(&mut ctl, &names).await?;

    let strategy = "    canary: 1\n    waveSize: 2\n    maxInFlight: 2\n    soak: 1s\n    progressDeadline: 3m";
    let rollout = rollout_yaml("to-21", TO, strategy, "");

    // The preview, offline, of the clusters as the API server has them.
    let dir = tempfile::tempdir()?;
    let clusters = world.kubectl(&["get", "etcdclusters", "-n", NS, "-o", "yaml"])?;
    std::fs::write(dir.path().join("clusters.yaml"), &clusters)?;
    std::fs::write(dir.path().join("rollout.yaml"), &rollout)?;
    let out = std::process::Command::new(etcdfleet_binary())
        .arg("plan")
        .arg("-f")
        .arg(dir.path().join("clusters.yaml"))
        .arg("-f")
        .arg(dir.path().join("rollout.yaml"))
        .output()?;
    let preview = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{preview}");
    assert_eq!(out.status.code(), Some(4), "blocked: {preview}");
    let refused = preview
        .lines()
        .find(|l| l.trim_start().starts_with("team-a/r2"))
        .context("r2 in the preview's waves")?;
    assert!(refused.contains("REFUSED: Downgrade"), "{refused}");
    assert!(preview.contains("wave 2 (2 clusters)"), "{preview}");
    assert!(preview.contains("# refused (1): team-a/r2"), "{preview}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("clusters.yaml"))?,
        clusters
    );

    world.apply(&rollout)?;
    let driver = RolloutDriver::start(&ctl).await?;
    let long = Duration::from_secs(120);
    let halted = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::HALTED)
    })
    .await?;
    assert!(condition_true(&halted, condition::HALTED), "{halted:#?}");
    assert_eq!(state_of(&halted, "r0"), cluster_state::DONE);
    assert_eq!(
        state_of(&halted, "r2"),
        cluster_state::FAILED,
        "{halted:#?}"
    );
    for name in ["r1", "r3", "r4"] {
        assert_eq!(state_of(&halted, name), cluster_state::PENDING, "{name}");
    }
    // A few more rounds: still halted, and only the canary was written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::HALTED)
    })
    .await?;
    let writes = rollout_writes(&world, "to-21")?;
    assert_eq!(writes.keys().collect::<Vec<_>>(), ["r0"], "{writes:?}");
    for name in ["r1", "r3", "r4"] {
        assert_eq!(spec_version(&world, name).await?, FROM, "{name} untouched");
    }
    assert_eq!(spec_version(&world, "r2").await?, "3.5.35");

    // A person excludes the refused cluster: the rollout goes on.
    world.kubectl(&[
        "patch",
        "etcdfleetrollout/to-21",
        "--type=merge",
        "-p",
        r#"{"spec":{"selector":{"exclude":["team-a/r2"]}}}"#,
    ])?;
    let done = drive_until(&world, &ctl, &driver, "to-21", &names, long, |s| {
        s.phase.as_deref() == Some(phase::COMPLETE)
    })
    .await?;
    assert_eq!((done.counts.done, done.counts.skipped), (4, 1), "{done:#?}");
    let writes = rollout_writes(&world, "to-21")?;
    assert_eq!(
        writes.into_iter().collect::<Vec<_>>(),
        ["r0", "r1", "r3", "r4"].map(|n| (n.to_string(), 1)),
    );
    assert_eq!(spec_version(&world, "r2").await?, "3.5.35");
    Ok(())
}
