//! Version changes end to end, shared by the upgrade and downgrade suites,
//! the real tier and the operations bench: a cluster rolled from one etcd
//! release to another under a continuous writer, with every acknowledged
//! write checked afterwards, and the check that every member pod runs with
//! flags its own release accepts (the members still on the old release keep
//! the old spelling during a roll). And a roll by hand with etcd's own calls
//! on a local cluster, for the engine tests (the operations bench's floor is
//! `crate::by_hand`, on the controller's own pods).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::etcd::{MemberClient, MemberStatus};
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::version_flags::version_flags;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::driver::{ConvergeLog, TestController, converge};
use crate::etcd_harness::{AckedWriter, EtcdBinary, LocalEtcdCluster, verify_acknowledged};
use crate::fleet::Fleet;
use crate::scenario::{NS, WORKLOAD_NS, etcd_of, get, patch_spec};

/// What a roll under a writer did.
#[derive(Debug)]
pub struct RollReport {
    pub log: ConvergeLog,
    /// Writes etcd acknowledged during the roll (every one verified after it).
    pub acknowledged: usize,
    /// Writes that failed or timed out (outcome unknown, not counted as lost).
    pub failed: u64,
    /// Fewest healthy voting members the status showed during the roll.
    pub min_ready: i32,
    /// From the spec edit to convergence.
    pub took: Duration,
    /// The roll as etcd and the pods showed it.
    pub timeline: RollTimeline,
}

impl RollReport {
    /// One line for the suite log: `<what> <from> -> <to>`, the time, the
    /// steps, the restarts and the writes.
    pub fn summary(&self, what: &str, from: &str, to: &str) -> String {
        format!(
            "{what} {from} -> {to}: {:.1} s, {} steps, members restarted {:?}, {} writes \
             acknowledged, 0 lost, {} failed during restarts, min ready members {}",
            self.took.as_secs_f64(),
            self.log.steps.len(),
            self.restarted(),
            self.acknowledged,
            self.failed,
            self.min_ready
        )
    }

    /// Ordinals of `RestartMember` steps, in order.
    pub fn restarted(&self) -> Vec<u32> {
        self.log
            .steps
            .iter()
            .filter_map(|(_, s)| match s {
                Step::RestartMember { ordinal, .. } => Some(*ordinal),
                _ => None,
            })
            .collect()
    }
}

/// One look at a roll from outside the controller: the member etcd reports
/// as leader, and each member pod's UID (`None` while it is deleting or
/// gone).
#[derive(Debug, Clone)]
pub struct RollSample {
    pub leader: Option<String>,
    pub pods: BTreeMap<String, Option<String>>,
}

/// A roll as etcd and the pods showed it, sampled every 50 ms by
/// [`RollWatch`]: never from the controller's own step log.
#[derive(Debug, Clone)]
pub struct RollTimeline {
    pub samples: Vec<RollSample>,
}

impl RollTimeline {
    /// Each member pod in the order it was restarted (its UID changed, or
    /// it was deleting or gone), with the leader etcd reported at the last
    /// sample before (`None`: no member answered with a leader then).
    pub fn restarts(&self) -> Vec<(String, Option<String>)> {
        let Some(first) = self.samples.first() else {
            return vec![];
        };
        let mut order = Vec::new();
        for (i, sample) in self.samples.iter().enumerate().skip(1) {
            for (pod, uid) in &first.pods {
                let moved = sample.pods.get(pod).cloned().flatten() != *uid;
                if moved && !order.iter().any(|(p, _)| p == pod) {
                    let before = self.samples[..i]
                        .iter()
                        .rev()
                        .find_map(|s| s.leader.clone());
                    order.push((pod.clone(), before));
                }
            }
        }
        order
    }

    /// Leader last, as etcd and the pods saw it: every member pod was
    /// restarted once, none while etcd reported it leader, and the member
    /// leading when the roll started was restarted last, after leadership
    /// had left it.
    pub fn assert_leader_last(&self) -> Result<()> {
        let first = self.samples.first().context("no sample")?;
        let leader = first
            .leader
            .clone()
            .context("no leader when the roll started")?;
        let restarts = self.restarts();
        let pods: Vec<&String> = restarts.iter().map(|(p, _)| p).collect();
        ensure!(
            pods.len() == first.pods.len(),
            "each member pod restarted once: {restarts:?} of {:?}",
            first.pods.keys()
        );
        for (pod, led_by) in &restarts {
            ensure!(
                led_by.as_ref() != Some(pod),
                "{pod} was restarted while etcd reported it leader: {restarts:?}"
            );
            ensure!(
                led_by.is_some(),
                "no leader was known before {pod}'s restart"
            );
        }
        ensure!(
            pods.last() == Some(&&leader),
            "{leader} led when the roll started and was not restarted last: {restarts:?}; \
             leaders seen: {:?}",
            self.leaders()
        );
        Ok(())
    }

    /// The leaders etcd reported, in order, each once per change.
    pub fn leaders(&self) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for l in self.samples.iter().filter_map(|s| s.leader.clone()) {
            if seen.last() != Some(&l) {
                seen.push(l);
            }
        }
        seen
    }
}

/// Samples a roll of `name` every 50 ms from outside the controller: the
/// leader from each member's own status, the member pods' UIDs from the
/// workload API. Members are named by their pods (member `i` answers at
/// the client URL of ordinal `i`).
pub struct RollWatch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Result<RollTimeline>>,
}

impl RollWatch {
    /// Starts watching `members` members of `name`; the first sample is
    /// taken before this returns.
    pub async fn start(fleet: &Fleet, workload: &str, name: &str, members: u32) -> Result<Self> {
        let (endpoints, config) = etcd_of(fleet, workload, name, members).await?;
        let names = etcdfleet_controllers::render::Names::new(name, WORKLOAD_NS);
        let pods: Api<Pod> = Api::namespaced(fleet.workload_client(workload), WORKLOAD_NS);
        let mut by_id = BTreeMap::new();
        let mut clients = Vec::new();
        for (ordinal, endpoint) in endpoints.iter().enumerate() {
            let client = MemberClient::connect(endpoint, &config).await?;
            let status = client.status().await?;
            by_id.insert(status.member_id, names.pod(ordinal as u32));
            clients.push(client);
        }
        let pod_names: Vec<String> = (0..members).map(|o| names.pod(o)).collect();
        let first = sample(&clients, &by_id, &pods, &pod_names).await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut samples = vec![first];
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    samples.push(sample(&clients, &by_id, &pods, &pod_names).await?);
                }
                Ok(RollTimeline { samples })
            }
        });
        Ok(RollWatch { stop, task })
    }

    pub async fn stop(self) -> Result<RollTimeline> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// One [`RollSample`]: a member that does not answer within 300 ms names
/// no leader.
async fn sample(
    clients: &[MemberClient],
    by_id: &BTreeMap<u64, String>,
    pods: &Api<Pod>,
    names: &[String],
) -> Result<RollSample> {
    let mut leader = None;
    for client in clients {
        let answer = tokio::time::timeout(Duration::from_millis(300), client.status()).await;
        if let Ok(Ok(status)) = answer
            && status.leader != 0
        {
            leader = Some(
                by_id
                    .get(&status.leader)
                    .cloned()
                    .unwrap_or_else(|| format!("{:x}", status.leader)),
            );
            break;
        }
    }
    let listed = pods.list(&ListParams::default()).await?.items;
    let pods = names
        .iter()
        .map(|n| {
            let uid = listed
                .iter()
                .find(|p| p.metadata.name.as_ref() == Some(n))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .and_then(|p| p.metadata.uid.clone());
            (n.clone(), uid)
        })
        .collect();
    Ok(RollSample { leader, pods })
}

/// The release a pod's image tag names (`…:v3.6.16` → `3.6.16`).
pub fn release_of_image(image: &str) -> Option<&str> {
    let tag = image.rsplit(':').next()?;
    Some(tag.trim_start_matches('v'))
}

/// Every member pod of `workload` runs with the flags of the release its
/// image names, and none that release refuses: no `--feature-gates` before
/// 3.6, no `--experimental-*` from 3.7. Returns `(pod, release)` pairs.
pub async fn pods_run_their_releases_flags(
    fleet: &Fleet,
    workload: &str,
) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client(workload), WORKLOAD_NS);
    let mut seen = BTreeMap::new();
    for pod in pods.list(&ListParams::default()).await?.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .context("pod without container")?;
        let image = container.image.clone().unwrap_or_default();
        let release = release_of_image(&image)
            .with_context(|| format!("{name}: image {image} has no tag"))?
            .to_string();
        let args = container.args.clone().unwrap_or_default();
        check_flags(&name, &release, &args)?;
        seen.insert(name, release);
    }
    Ok(seen)
}

/// The flag rules of [`pods_run_their_releases_flags`] for one command line.
pub fn check_flags(pod: &str, release: &str, args: &[String]) -> Result<()> {
    for flag in version_flags(release) {
        ensure!(
            args.contains(&flag),
            "{pod} runs {release} without {flag}: {args:?}"
        );
    }
    let (minor, _) = minor_of(release)?;
    for arg in args {
        ensure!(
            !(minor >= 7 && arg.starts_with("--experimental-")),
            "{pod} runs {release} with {arg}, which 3.7 removed"
        );
        ensure!(
            !(minor < 6 && arg.starts_with("--feature-gates")),
            "{pod} runs {release} with {arg}, which only 3.6+ accepts"
        );
    }
    Ok(())
}

pub fn minor_of(release: &str) -> Result<(u64, u64)> {
    let mut parts = release.split('.').skip(1);
    let minor = parts.next().and_then(|m| m.parse().ok());
    let patch = parts.next().and_then(|p| p.parse().ok());
    minor
        .zip(patch)
        .with_context(|| format!("{release} is no release"))
}

/// Edits `spec.version` of `name` (3 members in `workload`, converged) to
/// `to` and converges with a writer running throughout and a new controller
/// after every step. Checks, at every round, that each pod
/// runs its own release's flags. Every acknowledged write is verified.
pub async fn roll_under_a_writer(
    fleet: &Fleet,
    ctl: &mut TestController,
    name: &str,
    workload: &str,
    to: &str,
    timeout: Duration,
) -> Result<RollReport> {
    let (endpoints, config) = etcd_of(fleet, workload, name, 3).await?;
    let prefix = format!("roll-{name}");
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), &prefix).await?;
    // Let the writer reach its pace before the roll starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let watch = RollWatch::start(fleet, workload, name, 3).await?;
    let started = Instant::now();
    patch_spec(fleet, name, serde_json::json!({ "version": to })).await?;
    let min_ready = Arc::new(AtomicI32::new(3));
    let log = converge(
        ctl,
        &[(NS, name)],
        timeout,
        || {
            let min_ready = min_ready.clone();
            async move {
                fleet.sync_all().await?;
                pods_run_their_releases_flags(fleet, workload).await?;
                if let Some(s) = get(fleet, name).await?.status {
                    min_ready.fetch_min(s.ready_members, Ordering::SeqCst);
                }
                Ok(())
            }
        },
        |_, _, ctl| {
            // The controller dies after every step; a new one takes over.
            ctl.restart();
            Ok(())
        },
    )
    .await?;
    let took = started.elapsed();
    let timeline = watch.stop().await?;
    let report = writer.stop().await?;
    let verified = verify_acknowledged(&report, &endpoints, &config, &prefix).await?;
    Ok(RollReport {
        log,
        acknowledged: verified,
        failed: report.failed,
        min_ready: min_ready.load(Ordering::SeqCst),
        took,
        timeline,
    })
}

/// What a pod logged since its container last started (the runtime
/// appends every start to one log, each after a `--- <time> starting` line).
pub fn last_run_log(fleet: &Fleet, workload: &str, pod: &str) -> String {
    let log = fleet
        .runtime(workload)
        .pod_log_tail(WORKLOAD_NS, pod, 1_000_000);
    match log.rfind("\n--- ") {
        Some(start) => log[start + 1..].to_string(),
        None => log,
    }
}

/// Every member of `name` restarted on its data with the initial corruption
/// check on, and the check passed (etcd runs it only on a restart).
pub fn initial_corruption_check_passed(fleet: &Fleet, workload: &str, name: &str) -> Result<()> {
    let names = etcdfleet_controllers::render::Names::new(name, WORKLOAD_NS);
    for ordinal in 0..3 {
        let pod = names.pod(ordinal);
        let log = last_run_log(fleet, workload, &pod);
        ensure!(
            log.contains("initial corruption checking passed; no corruption"),
            "{pod} did not pass etcd's initial corruption check when it restarted:\n{}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}

/// After a roll to `release`: every pod runs it, the status says so, and
/// etcd's cluster version reaches its minor (within 20 s: the leader raises
/// it once every member runs the new minor).
pub async fn assert_runs(fleet: &Fleet, workload: &str, name: &str, release: &str) -> Result<()> {
    let pods = pods_run_their_releases_flags(fleet, workload).await?;
    ensure!(
        pods.len() == 3 && pods.values().all(|r| r == release),
        "pods do not all run {release}: {pods:?}"
    );
    let cluster: EtcdCluster = get(fleet, name).await?;
    let status = cluster.status.context("status")?;
    ensure!(
        status.current_version.as_deref() == Some(release),
        "status.currentVersion {:?}, want {release}",
        status.current_version
    );
    let (minor, _) = minor_of(release)?;
    let want = format!("3.{minor}");
    let mut seen = String::new();
    for _ in 0..100 {
        seen = crate::scenario::cluster_version(fleet, workload, name, 0)?;
        if seen == want {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("etcd reports cluster version {seen}, want {want}")
}

/// The members of `etcd`, leader last (the order etcd's guides restart them in).
pub async fn followers_then_leader(etcd: &LocalEtcdCluster) -> Result<Vec<usize>> {
    let (_, leader) = etcd.cluster_client().await?.leader().await?;
    let mut slots = Vec::new();
    let mut leader_slot = None;
    for i in etcd.active() {
        if etcd.member_id(i).await? == leader.member_id {
            leader_slot = Some(i);
        } else {
            slots.push(i);
        }
    }
    slots.push(leader_slot.context("the leader is not a member of this harness")?);
    Ok(slots)
}

/// A roll by hand with etcd's own calls, as etcd's upgrade and downgrade
/// guides do it: each follower restarted on `to` (healthy before the next),
/// then leadership moved to a member already restarted, then the old
/// leader. What the controller's roll is measured against.
pub async fn roll_by_hand(etcd: &mut LocalEtcdCluster, to: &EtcdBinary) -> Result<()> {
    let order = followers_then_leader(etcd).await?;
    let (leader_slot, followers) = order.split_last().context("no member")?;
    for &i in followers {
        etcd.restart(i, Some(to.clone())).await?;
    }
    let first = etcd.member_id(followers[0]).await?;
    etcd.cluster_client().await?.move_leader(first).await?;
    etcd.restart(*leader_slot, Some(to.clone())).await
}

/// Waits (up to 20 s) until every member's status passes `ok`; returns the
/// statuses seen last.
pub async fn wait_statuses(
    etcd: &LocalEtcdCluster,
    what: &str,
    ok: impl Fn(&MemberStatus) -> bool,
) -> Result<Vec<MemberStatus>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut seen = Vec::new();
        for i in etcd.active() {
            seen.push(etcd.member_client(i).await?.status().await?);
        }
        if seen.iter().all(&ok) {
            return Ok(seen);
        }
        ensure!(
            Instant::now() < deadline,
            "members not {what} after 20 s: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sets (or with `None` removes) an annotation on EtcdCluster `name`.
pub async fn annotate(fleet: &Fleet, name: &str, key: &str, value: Option<&str>) -> Result<()> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// What each of the 3 members of `name` says in `Status` (version, storage
/// version, downgrade target).
pub async fn member_statuses(
    fleet: &Fleet,
    workload: &str,
    name: &str,
) -> Result<Vec<MemberStatus>> {
    let (endpoints, config) = etcd_of(fleet, workload, name, 3).await?;
    let mut seen = Vec::new();
    for ep in endpoints {
        let member = etcdfleet_controllers::etcd::MemberClient::connect(&ep, &config).await?;
        seen.push(member.status().await?);
    }
    Ok(seen)
}

/// Waits (up to 20 s) until every member of `name` says what `ok` wants
/// (etcd moves storage and cluster versions on its own, within seconds).
pub async fn wait_member_statuses(
    fleet: &Fleet,
    workload: &str,
    name: &str,
    ok: impl Fn(&MemberStatus) -> bool,
) -> Result<Vec<MemberStatus>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = member_statuses(fleet, workload, name).await?;
        if seen.iter().all(&ok) {
            return Ok(seen);
        }
        ensure!(Instant::now() < deadline, "after 20 s: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
