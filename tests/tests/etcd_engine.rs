//! The etcd operations engine (controllers::etcd) against real etcd: scale
//! out and in by the membership rules, rolling 3.4 → 3.5 upgrades under a
//! continuous writer, member replacement, snapshot/restore, defragmentation,
//! the safety view refusing what would break quorum, and etcd's online
//! downgrade API (3.6 → 3.5, 3.7 → 3.6, cancel).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdError, UnsafeReason};
use etcdfleet_tests::etcd_harness::{
    AckedWriter, ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, require_etcd,
    verify_acknowledged,
};
use etcdfleet_tests::versions::{roll_by_hand, wait_statuses};

macro_rules! require {
    ($version:expr) => {
        match require_etcd($version) {
            Some(binary) => binary,
            None => return Ok(()),
        }
    };
}

async fn put(etcd: &ClusterClient, key: &str, value: &str) -> Result<()> {
    etcd.kv().put(key, value, None).await?;
    Ok(())
}

/// Reads `key` through every active member, each on its own, linearizably.
async fn assert_readable_everywhere(
    cluster: &LocalEtcdCluster,
    key: &str,
    value: &str,
) -> Result<()> {
    for i in cluster.active() {
        let url = cluster.member(i).client_url();
        let mut kv = ClusterClient::connect(std::slice::from_ref(&url), &cluster.etcd_config())
            .await?
            .kv();
        let resp = kv
            .get(key, None)
            .await
            .with_context(|| format!("get via {url}"))?;
        let got = resp.kvs().first().map(|kv| kv.value_str()).transpose()?;
        ensure!(got == Some(value), "{key} via {url}: {got:?}");
    }
    Ok(())
}

async fn scale_out_1_3_5(tls: bool) -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let started = Instant::now();
    let mut cluster =
        LocalEtcdCluster::start(ClusterOptions::new(1, v35.clone()).with_tls(tls)).await?;
    put(
        &cluster.cluster_client().await?,
        "/scale/first",
        "written-at-size-1",
    )
    .await?;

    for expected in [2usize, 3, 4, 5] {
        let (slot, id) = cluster.scale_out_with_module(v35.clone()).await?;
        let members = cluster.cluster_client().await?.list_members().await?;
        ensure!(
            members.len() == expected,
            "{expected} members expected: {members:?}"
        );
        let me = members
            .iter()
            .find(|m| m.id == id)
            .context("new member listed")?;
        ensure!(
            !me.is_learner,
            "member {slot} still a learner after promote"
        );
        ensure!(me.name == cluster.member(slot).name);
    }
    let health = cluster.cluster_client().await?.observe().await?;
    ensure!(health.voter_count() == 5 && health.healthy_voter_count() == 5);
    ensure!(health.learners().count() == 0);
    assert_readable_everywhere(&cluster, "/scale/first", "written-at-size-1").await?;
    eprintln!("scale-out 1→3→5 (tls={tls}) took {:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_1_to_3_to_5_plain() -> Result<()> {
    scale_out_1_3_5(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_1_to_3_to_5_mutual_tls() -> Result<()> {
    scale_out_1_3_5(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_5_to_3_to_1_moves_leadership_before_removing() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let mut cluster = LocalEtcdCluster::start(ClusterOptions::new(5, v35)).await?;
    put(&cluster.cluster_client().await?, "/scale/in", "kept").await?;
    let mut moved_leadership = false;

    for target in [3usize, 1] {
        while cluster.active().len() > target {
            let etcd = cluster.cluster_client().await?;
            let health = etcd.observe().await?;
            // Always remove the current leader while there is one to remove,
            // so the move-leader path is exercised on every step.
            let leader = health.leader().context("a leader")?;
            let victim_slot = cluster.slot_of(leader).await?;
            ensure!(
                health.can_remove(leader).map_err(|r| r.reason()) == Err("RemovingLeader"),
                "removing the leader must be refused"
            );
            let successor = health
                .voters()
                .map(|m| m.member.id)
                .find(|&id| id != leader)
                .context("another voter")?;
            etcd.move_leader(successor).await?;
            moved_leadership = true;
            let health = etcd.observe().await?;
            ensure!(health.leader() == Some(successor), "leadership moved");
            health.can_remove(leader)?;
            let members = etcd.remove_member(leader).await?;
            ensure!(members.iter().all(|m| m.id != leader));
            cluster.mark_removed(victim_slot).await;
        }
        let health = cluster.cluster_client().await?.observe().await?;
        ensure!(health.voter_count() == target && health.has_quorum());
        assert_readable_everywhere(&cluster, "/scale/in", "kept").await?;
    }
    ensure!(moved_leadership);
    // The last member is refused.
    let health = cluster.cluster_client().await?.observe().await?;
    let last = health.voters().next().context("one voter")?.member.id;
    ensure!(health.can_remove(last).map_err(|r| r.reason()) == Err("LastMember"));
    Ok(())
}

async fn rolling_upgrade(tls: bool) -> Result<()> {
    let v34 = require!(EtcdVersion::V3_4);
    let v35 = require!(EtcdVersion::V3_5);
    let started = Instant::now();
    let mut cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v34).with_tls(tls)).await?;
    ensure!(cluster.cluster_version(0)?.starts_with("3.4"));
    let endpoints = cluster.client_urls();
    let config = cluster.etcd_config();
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "/upgrade").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let etcd = cluster.cluster_client().await?;
    let health = etcd.observe().await?;
    let leader = health.leader().context("a leader")?;
    let mut order: Vec<u64> = health
        .voters()
        .map(|m| m.member.id)
        .filter(|&id| id != leader)
        .collect();
    order.push(leader);

    for id in order {
        let health = etcd.observe().await?;
        if health.leader() == Some(id) {
            let to = health
                .voters()
                .map(|m| m.member.id)
                .find(|&m| m != id)
                .context("voter")?;
            etcd.move_leader(to).await?;
        }
        let health = etcd.observe().await?;
        ensure!(
            health.leader() != Some(id),
            "the member being upgraded does not lead"
        );
        health.can_restart(id)?;
        let slot = cluster.slot_of(id).await?;
        cluster.restart(slot, Some(v35.clone())).await?;
        let status = cluster.member_client(slot).await?.status().await?;
        ensure!(
            status.version == "3.5.1",
            "member {slot} runs {}",
            status.version
        );
        // Let the writer run against the mixed cluster for a moment.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "/upgrade").await?;
    // Proves the writer kept writing through the roll; how many it manages
    // depends on the machine's load, so the floor is modest.
    ensure!(checked >= 20, "only {checked} acknowledged writes");
    eprintln!(
        "upgrade (tls={tls}): {checked} acknowledged writes all readable, {} failed during restarts",
        report.failed
    );
    // The leader raises the cluster version once every member runs 3.5.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Just after the last restart the gauge can be missing for a moment
        // (the restarted member has not learnt the cluster version yet).
        let version = match cluster.cluster_version(0) {
            Ok(v) => v,
            Err(e) => e.to_string(),
        };
        if version.starts_with("3.5") {
            break;
        }
        ensure!(Instant::now() < deadline, "cluster version still {version}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("rolling upgrade (tls={tls}) took {:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_3_4_to_3_5_plain() -> Result<()> {
    rolling_upgrade(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_3_4_to_3_5_mutual_tls() -> Result<()> {
    rolling_upgrade(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_member_whose_data_dir_was_wiped() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let mut cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v35.clone())).await?;
    put(&cluster.cluster_client().await?, "/replace/key", "survives").await?;

    // Pick a follower as the casualty, lose its disk.
    let health = cluster.cluster_client().await?.observe().await?;
    let leader = health.leader().context("a leader")?;
    let lost = health
        .voters()
        .map(|m| m.member.id)
        .find(|&id| id != leader)
        .context("follower")?;
    let lost_slot = cluster.slot_of(lost).await?;
    cluster.wipe(lost_slot).await?;
    ensure!(!cluster.member(lost_slot).data_dir.exists());

    let etcd = cluster.cluster_client().await?;
    let health = etcd.observe().await?;
    let observed = health.member(lost).context("still listed")?;
    ensure!(!observed.healthy, "wiped member must be seen unhealthy");
    ensure!(observed.error.is_some());
    ensure!(health.healthy_voter_count() == 2);
    health.can_remove(lost)?;
    etcd.remove_member(lost).await?;
    cluster.mark_removed(lost_slot).await;

    let (slot, id) = cluster.scale_out_with_module(v35).await?;
    ensure!(slot != lost_slot && id != lost);
    let health = cluster.cluster_client().await?.observe().await?;
    ensure!(health.voter_count() == 3 && health.healthy_voter_count() == 3);
    assert_readable_everywhere(&cluster, "/replace/key", "survives").await?;
    Ok(())
}

fn sha256sum(path: &std::path::Path) -> Result<String> {
    let out = std::process::Command::new("sha256sum").arg(path).output()?;
    ensure!(out.status.success());
    Ok(String::from_utf8(out.stdout)?
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_from_healthy_member_restores_into_new_cluster() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v35.clone())).await?;
    let etcd = cluster.cluster_client().await?;
    for n in 0..100 {
        put(&etcd, &format!("/snap/{n:03}"), &format!("v{n}")).await?;
    }
    let health = etcd.observe().await?;
    let source = health
        .members()
        .iter()
        .find(|m| m.healthy)
        .context("healthy member")?;
    let member = etcd.member(&source.member.client_urls[0]).await?;

    let path = cluster.dir().join("backup.db");
    let mut file = tokio::fs::File::create(&path).await?;
    let info = member.snapshot(&mut file).await?;
    drop(file);
    ensure!(
        info.etcd_digest_verified,
        "etcd sent its digest and it matched"
    );
    ensure!(info.bytes_written == std::fs::metadata(&path)?.len());
    ensure!(
        info.bytes_written == info.db_size + 32,
        "db plus 32-byte digest trailer"
    );
    ensure!(info.sha256 == sha256sum(&path)?);

    let restored = LocalEtcdCluster::restore_single(v35, &path, false).await?;
    let mut kv = restored.cluster_client().await?.kv();
    let resp = kv
        .get("/snap/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await?;
    ensure!(
        resp.kvs().len() == 100,
        "{} keys restored",
        resp.kvs().len()
    );
    ensure!(resp.kvs()[42].value_str()? == "v42");
    let members = restored.cluster_client().await?.list_members().await?;
    ensure!(
        members.len() == 1,
        "restored into a new single-member cluster"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_each_member_leader_last() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v35)).await?;
    let etcd = cluster.cluster_client().await?;
    let mut kv = etcd.kv();
    // ~10 MB written, then deleted and compacted: free pages for defrag.
    let value = "x".repeat(8 * 1024);
    for batch in 0..40 {
        let ops: Vec<_> = (0..32)
            .map(|n| {
                etcd_client::TxnOp::put(format!("/bulk/{batch:02}/{n:02}"), value.as_str(), None)
            })
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(ops)).await?;
    }
    let deleted = kv
        .delete(
            "/bulk/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
    ensure!(deleted.deleted() == 1280);
    let revision = deleted.header().context("header")?.revision();
    kv.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await?;

    let health = etcd.observe().await?;
    let leader = health.leader().context("a leader")?;
    let mut order: Vec<u64> = health
        .voters()
        .map(|m| m.member.id)
        .filter(|&id| id != leader)
        .collect();
    order.push(leader);
    let mut defragmented = Vec::new();
    for id in order {
        let health = etcd.observe().await?;
        if health.leader() == Some(id) {
            etcd.move_leader(defragmented[0]).await?;
            ensure!(etcd.observe().await?.leader() == Some(defragmented[0]));
        }
        let slot = cluster.slot_of(id).await?;
        let member = cluster.member_client(slot).await?;
        let before = member.status().await?;
        member.defragment().await?;
        let after = member.status().await?;
        eprintln!(
            "member {id:x}: db size {} -> {}, in use {} -> {}",
            before.db_size, after.db_size, before.db_size_in_use, after.db_size_in_use
        );
        ensure!(
            after.db_size * 2 < before.db_size,
            "defrag shrank the db file: {} -> {}",
            before.db_size,
            after.db_size
        );
        ensure!(after.db_size_in_use <= before.db_size_in_use + 64 * 1024);
        ensure!(after.db_size_in_use <= after.db_size);
        member.check_health().await?;
        defragmented.push(id);
    }
    ensure!(defragmented.len() == 3 && *defragmented.last().unwrap() == leader);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_view_refuses_unsafe_changes_on_a_real_cluster() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);

    // 3 members, one killed: removing a healthy one would lose quorum.
    let mut cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v35.clone())).await?;
    let health = cluster.cluster_client().await?.observe().await?;
    let leader = health.leader().context("a leader")?;
    let followers: Vec<u64> = health
        .voters()
        .map(|m| m.member.id)
        .filter(|&id| id != leader)
        .collect();
    let dead = followers[0];
    let alive = followers[1];
    let dead_slot = cluster.slot_of(dead).await?;
    cluster.kill(dead_slot).await;
    let health = cluster.cluster_client().await?.observe().await?;
    ensure!(!health.member(dead).context("listed")?.healthy);
    match health.can_remove(alive) {
        Err(UnsafeReason::WouldLoseQuorum {
            remaining_healthy: 1,
            required: 2,
            ..
        }) => {}
        other => anyhow::bail!("expected WouldLoseQuorum, got {other:?}"),
    }
    ensure!(
        health.can_restart(alive).is_err(),
        "no restart with one member down"
    );
    // Removing the dead one is what the planner would do instead.
    health.can_remove(dead)?;
    drop(cluster);

    // A single member: the last one cannot be removed; one learner at a time.
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(1, v35)).await?;
    let etcd = cluster.cluster_client().await?;
    let only = etcd
        .observe()
        .await?
        .voters()
        .next()
        .context("voter")?
        .member
        .id;
    ensure!(
        etcd.observe().await?.can_remove(only) == Err(UnsafeReason::LastMember { member_id: only })
    );
    let learner = etcd
        .add_learner(&["http://127.0.0.1:1".to_string()])
        .await?;
    let health = etcd.observe().await?;
    ensure!(
        health.can_add_learner()
            == Err(UnsafeReason::LearnerPresent {
                learner_id: learner.id
            })
    );
    ensure!(health.can_promote(learner.id).map_err(|r| r.reason()) == Err("LearnerNotObserved"));
    // etcd itself agrees, and the module reports it as a typed error.
    match etcd.add_learner(&["http://127.0.0.1:2".to_string()]).await {
        Err(EtcdError::TooManyLearners) => {}
        other => anyhow::bail!("expected TooManyLearners, got {other:?}"),
    }
    // Adding the same learner again is idempotent.
    let again = etcd
        .add_learner(&["http://127.0.0.1:1".to_string()])
        .await?;
    ensure!(again.id == learner.id);
    // An unstarted learner may always be removed.
    health.can_remove(learner.id)?;
    etcd.remove_member(learner.id).await?;
    match etcd.remove_member(learner.id).await {
        Err(EtcdError::MemberNotFound { .. }) => {}
        // Only if the first attempt timed out (see remove_member docs).
        Ok(members) if members.iter().all(|m| m.id != learner.id) => {}
        other => anyhow::bail!("expected MemberNotFound, got {other:?}"),
    }
    Ok(())
}

/// The harness's private-hosts-file mode, which the end-to-end suite uses to
/// give etcd pods their DNS names: the process resolves a name only its own
/// /etc/hosts knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_with_private_hosts_file_resolves_pod_names() -> Result<()> {
    use etcdfleet_tests::etcd_harness::{EtcdProcess, ProcessSpec, free_ports};
    let v35: EtcdBinary = require!(EtcdVersion::V3_5);
    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n127.0.0.1 demo-etcd-0.demo-etcd.ns.svc\n",
    )?;
    let ports = free_ports(2)?;
    let name = "demo-etcd-0.demo-etcd.ns.svc";
    let peer = format!("http://{name}:{}", ports[1]);
    let spec = ProcessSpec {
        binary: v35.etcd.clone(),
        args: vec![
            "--name=demo-etcd-0".into(),
            format!("--data-dir={}", dir.path().join("data").display()),
            format!("--listen-client-urls=http://127.0.0.1:{}", ports[0]),
            format!("--advertise-client-urls=http://{name}:{}", ports[0]),
            format!("--listen-peer-urls=http://127.0.0.1:{}", ports[1]),
            format!("--initial-advertise-peer-urls={peer}"),
            // etcd resolves the names in --initial-cluster at bootstrap:
            // only the private hosts file makes this one resolvable.
            format!("--initial-cluster=demo-etcd-0={peer}"),
        ],
        env: vec![("ETCD_LOG_LEVEL".into(), "warn".into())],
        log_file: dir.path().join("etcd.log"),
        hosts_file: Some(hosts),
    };
    let process = EtcdProcess::spawn(&spec)?;
    let config = etcdfleet_controllers::etcd::EtcdConfig::default();
    let member = etcdfleet_controllers::etcd::MemberClient::connect(
        &format!("http://127.0.0.1:{}", ports[0]),
        &config,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while member.check_health().await.is_err() {
        ensure!(
            Instant::now() < deadline && process.is_running(),
            "etcd with private hosts did not come up:\n{}",
            process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let members = ClusterClient::connect(&[format!("http://127.0.0.1:{}", ports[0])], &config)
        .await?
        .list_members()
        .await?;
    ensure!(members[0].peer_urls == [peer]);
    let pid = process.pid();
    process.terminate(Duration::from_secs(5)).await;
    ensure!(!process.is_running());
    // The whole group is gone (no `unshare`/`sh` left behind).
    ensure!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}

/// Established TCP connections this process holds to loopback `port`: the
/// sockets among its own file descriptors, looked up in `/proc/net/tcp`
/// (which lists the whole network namespace, etcd's own connections too).
fn connections_to(port: u16) -> Result<usize> {
    let mut ours = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            ours.insert(inode.to_string());
        }
    }
    let table = std::fs::read_to_string("/proc/self/net/tcp")?;
    let remote = format!("0100007F:{port:04X}");
    Ok(table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&remote.as_str())
                && f.get(3) == Some(&"01")
                && f.get(9).is_some_and(|inode| ours.contains(*inode))
        })
        .count())
}

/// Before the controller stops a member it closes its own connection to it
/// (etcd's graceful shutdown waits for connected clients); every clone of
/// the cluster client loses that connection, and the next call dials anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_a_member_closes_the_connection_and_the_next_call_redials() -> Result<()> {
    let v35 = require!(EtcdVersion::V3_5);
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(1, v35).with_tls(true)).await?;
    let etcd = cluster.cluster_client().await?;
    let url = cluster.member(0).client_url();
    let port = cluster.member(0).client_port;
    let held = etcd.clone();
    // The harness's start-up clients are dropped; their connections close
    // on their own (under load, not at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections_to(port)? > 0 {
        ensure!(
            Instant::now() < deadline,
            "connections from the harness's clients are still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let others = 0;
    etcd.list_members().await?;
    ensure!(
        connections_to(port)? == others + 1,
        "one more connection after a call: {} (harness: {others})",
        connections_to(port)?
    );

    held.disconnect(&url).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while connections_to(port)? > others {
        ensure!(
            Instant::now() < deadline,
            "the connection to {url} is still open after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The other clone uses the fresh connection.
    let members = etcd.list_members().await?;
    ensure!(members.len() == 1);
    ensure!(
        connections_to(port)? == others + 1,
        "the next call dials again"
    );
    Ok(())
}

/// The cluster version through member 0 once it is `want` (within 20 s:
/// etcd moves it on its own after the last member changes binary, or
/// after a downgrade is cancelled).
async fn wait_cluster_version(cluster: &LocalEtcdCluster, want: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let version = cluster.cluster_version(0).unwrap_or_else(|e| e.to_string());
        if version.starts_with(want) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "cluster version still {version}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// etcd's online downgrade through the engine, on mutual TLS, under a
/// writer: `validate` refuses two minors down and accepts one, `enable`
/// moves every member's storage version down (a second `enable` is a
/// success, as after a lost answer), then each member is restarted on the
/// older binary, leader last; the leader ends the downgrade itself and no
/// acknowledged write is lost.
async fn online_downgrade(from: EtcdVersion, to: EtcdVersion, refused: &str) -> Result<()> {
    let new = require!(from);
    let old = require!(to);
    let mut cluster =
        LocalEtcdCluster::start(ClusterOptions::new(3, new.clone()).with_tls(true)).await?;
    let endpoints = cluster.client_urls();
    let config = cluster.etcd_config();
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "/down").await?;
    let etcd = cluster.cluster_client().await?;
    let err = etcd
        .validate_downgrade(refused)
        .await
        .expect_err("two minors down");
    ensure!(
        err.to_string().contains("invalid downgrade target version"),
        "{err}"
    );
    let target = old
        .release
        .rsplit_once('.')
        .context("release")?
        .0
        .to_string();
    let answer = etcd.validate_downgrade(&target).await?;
    ensure!(
        answer.cluster_version.starts_with(&new.release[..3]),
        "{answer:?}"
    );
    etcd.enable_downgrade(&target).await?;
    etcd.enable_downgrade(&target).await?;
    let storage = format!("{target}.0");
    let seen = wait_statuses(&cluster, "migrated", |s| {
        s.storage_version == storage && s.downgrade_target.as_deref() == Some(storage.as_str())
    })
    .await?;
    eprintln!("after enable: {seen:?}");
    roll_by_hand(&mut cluster, &old).await?;
    for i in 0..3 {
        let status = cluster.member_client(i).await?.status().await?;
        ensure!(status.version == old.release, "member {i}: {status:?}");
    }
    wait_cluster_version(&cluster, &target).await?;
    let report = writer.stop().await?;
    let checked = verify_acknowledged(&report, &endpoints, &config, "/down").await?;
    ensure!(checked >= 20, "only {checked} acknowledged writes");
    eprintln!(
        "downgrade {} -> {}: {checked} acknowledged writes all readable, {} failed during restarts",
        new.release, old.release, report.failed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_downgrade_3_6_to_3_5_through_the_api() -> Result<()> {
    online_downgrade(EtcdVersion::V3_6, EtcdVersion::V3_5Latest, "3.4").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_downgrade_3_7_to_3_6_through_the_api() -> Result<()> {
    online_downgrade(EtcdVersion::V3_7, EtcdVersion::V3_6, "3.5").await
}

/// Cancelling an enabled downgrade before any member changed binary
/// brings the cluster back: storage version and cluster version return to
/// 3.6, no member reports a downgrade, and a second cancel is no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_downgrade_leaves_the_cluster_as_it_was() -> Result<()> {
    let v36 = require!(EtcdVersion::V3_6);
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v36).with_tls(true)).await?;
    let etcd = cluster.cluster_client().await?;
    let before =
        wait_statuses(&cluster, "on 3.6 storage", |s| s.storage_version == "3.6.0").await?;
    ensure!(before.iter().all(|s| s.downgrade_target.is_none()));
    etcd.enable_downgrade("3.5").await?;
    wait_statuses(&cluster, "migrated", |s| s.storage_version == "3.5.0").await?;
    wait_cluster_version(&cluster, "3.5").await?;
    etcd.cancel_downgrade().await?;
    etcd.cancel_downgrade().await?;
    wait_statuses(&cluster, "back on 3.6 storage", |s| {
        s.storage_version == "3.6.0" && s.downgrade_target.is_none()
    })
    .await?;
    wait_cluster_version(&cluster, "3.6").await?;
    Ok(())
}

/// What a backup records as its fingerprint (and a restore drill compares):
/// every member answers the same `HashKV` at one revision, with the
/// compacted revision it hashed above, and the count of keys then, also
/// after newer writes and a compaction below that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_drill_hashes_and_counts_the_same_on_every_member() -> Result<()> {
    let v36 = require!(EtcdVersion::V3_6);
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v36).with_tls(true)).await?;
    let client = cluster.cluster_client().await?;
    for i in 0..7 {
        put(&client, &format!("/fp/{i}"), "v").await?;
    }
    let at = cluster.member_client(0).await?.revision().await?;
    put(&client, "/fp/later", "v").await?;
    let mut seen = Vec::new();
    for i in 0..3 {
        let member = cluster.member_client(i).await?;
        seen.push(
            member
                .fingerprint(at)
                .await
                .with_context(|| format!("member {i}"))?,
        );
    }
    ensure!(seen[0].key_count == 7, "{seen:?}");
    ensure!(
        seen.iter().all(|f| *f == seen[0]),
        "members differ: {seen:?}"
    );
    // Compacted below `at` on one member: the hash starts above the new
    // compaction and still agrees once the other is compacted the same way.
    let first = cluster.member_client(0).await?;
    first.compact_to(at - 3).await?;
    let compacted = first.fingerprint(at).await?;
    ensure!(compacted.compact_revision == at - 3, "{compacted:?}");
    ensure!(compacted.key_count == 7, "{compacted:?}");
    Ok(())
}
