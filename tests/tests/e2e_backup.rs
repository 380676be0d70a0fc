//! Backups end to end on real etcd and a real S3-compatible server (moto on
//! loopback): scheduled backups land in S3 and in a directory, retention
//! prunes and keeps the newest success, a backup restores with every key
//! (3.4 and 3.5), a backup under a continuous writer loses nothing and takes
//! no member down, a failed attempt is reported and retried with backoff.
//! Issue 11.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::backup::{SnapshotMetadata, condition, metadata_key, phase};
use etcdfleet_api::conditions;
use etcdfleet_api::{
    EtcdBackup, EtcdBackupSchedule, EtcdBackupScheduleSpec, EtcdBackupSpec, ObjectStoreDestination,
    RetentionPolicy,
};
use etcdfleet_controllers::backup::schedule::{ScheduleOutcome, reconcile_schedule};
use etcdfleet_controllers::backup::{Clock, Context as BackupContext, Outcome, reconcile_backup};
use etcdfleet_controllers::etcd::{ClusterClient, MemberClient};
use etcdfleet_controllers::store::{Credentials, Store};
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::etcd_harness::{
    AckedWriter, EtcdBinary, EtcdVersion, LocalEtcdCluster, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::s3::{
    ACCESS_KEY_ID, CREDENTIALS, S3Server, SECRET_ACCESS_KEY, put_credentials,
};
use etcdfleet_tests::scenario::{NS, cluster, etcd_of, get, running};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// A clock the test moves forward (schedules fire without waiting minutes).
struct TestClock(Arc<AtomicI64>);

impl TestClock {
    fn new() -> (TestClock, Clock) {
        let offset = Arc::new(AtomicI64::new(0));
        let read = offset.clone();
        let clock: Clock = Arc::new(move || {
            Timestamp::now() + Duration::from_secs(read.load(Ordering::SeqCst) as u64)
        });
        (TestClock(offset), clock)
    }

    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_secs() as i64, Ordering::SeqCst);
    }
}

fn backup_context(ctl: &TestController, clock: Clock) -> BackupContext {
    BackupContext::with_clock(ctl.ctx.clone(), clock)
}

fn test_credentials() -> Credentials {
    Credentials {
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    }
}

fn open(destination: &ObjectStoreDestination) -> Result<Store> {
    let creds = destination
        .credentials_secret_name
        .as_ref()
        .map(|_| test_credentials());
    Ok(Store::open(destination, creds.as_ref())?)
}

async fn create_backup(
    fleet: &Fleet,
    name: &str,
    cluster: &str,
    destination: ObjectStoreDestination,
) -> Result<()> {
    let mut b = EtcdBackup::new(
        name,
        EtcdBackupSpec {
            cluster_name: cluster.into(),
            destination: Some(destination),
        },
    );
    b.metadata.namespace = Some(NS.into());
    Api::<EtcdBackup>::namespaced(fleet.management_direct(), NS)
        .create(&PostParams::default(), &b)
        .await?;
    Ok(())
}

async fn get_backup(fleet: &Fleet, name: &str) -> Result<EtcdBackup> {
    Ok(Api::<EtcdBackup>::namespaced(fleet.management_direct(), NS)
        .get(name)
        .await?)
}

async fn list_backups(fleet: &Fleet) -> Result<Vec<EtcdBackup>> {
    Ok(Api::<EtcdBackup>::namespaced(fleet.management_direct(), NS)
        .list(&Default::default())
        .await?
        .items)
}

/// Reconciles one backup until it is done (or `max` reconciles passed);
/// returns the outcomes seen.
async fn drive_backup(fleet: &Fleet, bctx: &BackupContext, name: &str) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::new();
    for _ in 0..60 {
        let b = get_backup(fleet, name).await?;
        let outcome = reconcile_backup(&b, bctx).await?;
        let done = matches!(
            outcome,
            Outcome::Done | Outcome::Succeeded { .. } | Outcome::AttemptFailed { .. }
        );
        outcomes.push(outcome);
        if done {
            return Ok(outcomes);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("backup {name} did not finish: {outcomes:?}")
}

fn status_of(b: &EtcdBackup) -> Result<&etcdfleet_api::EtcdBackupStatus> {
    b.status.as_ref().context("backup has no status")
}

/// Checks the snapshot object and its metadata object in the store.
async fn assert_stored(b: &EtcdBackup) -> Result<()> {
    let s = status_of(b)?;
    let destination = s.destination.as_ref().context("no destination in status")?;
    let key = s.object_key.as_ref().context("no object key")?;
    let store = open(destination)?;
    let size = s.size_bytes.context("no size")? as u64;
    let sha = s.sha256.as_ref().context("no sha256")?;
    store.verify(key, size, sha).await?;
    let meta: SnapshotMetadata =
        serde_json::from_slice(&store.get_small(&metadata_key(key)).await?)?;
    ensure!(meta.sha256 == *sha && meta.size_bytes == size, "{meta:?}");
    ensure!(meta.revision == s.revision.unwrap_or_default(), "{meta:?}");
    ensure!(meta.etcd_version.starts_with("3."), "{meta:?}");
    ensure!(!meta.cluster_uid.is_empty(), "{meta:?}");
    Ok(())
}

async fn put_keys(fleet: &Fleet, workload: &str, name: &str, prefix: &str, n: usize) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, workload, name, 3).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    for i in 0..n {
        tokio::time::timeout(
            Duration::from_secs(5),
            kv.put(format!("{prefix}/{i:05}"), format!("value-{i}"), None),
        )
        .await??;
    }
    Ok(())
}

fn schedule(
    name: &str,
    cluster: &str,
    cron: &str,
    keep: i32,
    destination: ObjectStoreDestination,
) -> EtcdBackupSchedule {
    let mut s = EtcdBackupSchedule::new(
        name,
        EtcdBackupScheduleSpec {
            cluster_name: cluster.into(),
            schedule: Some(cron.into()),
            retention: Some(RetentionPolicy {
                count: Some(keep),
                max_age: None,
            }),
            suspend: None,
            destination: Some(destination),
            drill: None,
        },
    );
    s.metadata.namespace = Some(NS.into());
    s
}

/// One scheduling round: reconcile the schedules until idle, and every
/// backup they made until done.
async fn schedule_round(fleet: &Fleet, bctx: &BackupContext, schedules: &[&str]) -> Result<()> {
    let api = Api::<EtcdBackupSchedule>::namespaced(fleet.management_direct(), NS);
    for _ in 0..10 {
        let mut idle = true;
        for name in schedules {
            let s = api.get(name).await?;
            match reconcile_schedule(&s, bctx).await? {
                ScheduleOutcome::Idle { .. } => {}
                ScheduleOutcome::Invalid(why) => bail!("schedule {name} invalid: {why}"),
                _ => idle = false,
            }
        }
        for b in list_backups(fleet).await? {
            let p = b.status.as_ref().and_then(|s| s.phase.clone());
            if p.as_deref() != Some(phase::SUCCEEDED) && p.as_deref() != Some(phase::FAILED) {
                drive_backup(fleet, bctx, &b.metadata.name.clone().unwrap_or_default()).await?;
                idle = false;
            }
        }
        if idle {
            return Ok(());
        }
    }
    bail!("schedules did not settle")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_backups_land_in_s3_and_a_directory_and_retention_keeps_the_newest() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("fleet-backups")?;
    let dir = tempfile::tempdir()?;
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    put_keys(&fleet, "a", "etcd-a", "data", 20).await?;
    let (clock, now) = TestClock::new();
    let bctx = backup_context(&ctl, now);

    let to_s3 = s3.destination("fleet-backups", CREDENTIALS);
    let to_dir = ObjectStoreDestination {
        path: Some(dir.path().display().to_string()),
        ..Default::default()
    };
    let api = Api::<EtcdBackupSchedule>::namespaced(fleet.management_direct(), NS);
    api.create(
        &PostParams::default(),
        &schedule("hourly-s3", "etcd-a", "0 * * * *", 2, to_s3),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &schedule("hourly-dir", "etcd-a", "0 * * * *", 1, to_dir),
    )
    .await?;

    // Nothing is due right after creation.
    schedule_round(&fleet, &bctx, &["hourly-s3", "hourly-dir"]).await?;
    assert!(list_backups(&fleet).await?.is_empty());
    let s = api.get("hourly-s3").await?.status.context("status")?;
    let next = s.next_run_time.context("next run")?.0;
    assert!(next > Timestamp::now(), "{next}");
    assert!(conditions::is_true(&s.conditions, condition::SCHEDULED));

    // Three hours pass, one run each; a controller that was down for all
    // three would catch up once, which the second step checks.
    for hour in 1..=3 {
        clock.advance(Duration::from_secs(3600));
        schedule_round(&fleet, &bctx, &["hourly-s3", "hourly-dir"]).await?;
        let backups = list_backups(&fleet).await?;
        let of = |s: &str| {
            backups
                .iter()
                .filter(|b| {
                    b.metadata
                        .name
                        .as_deref()
                        .unwrap_or_default()
                        .starts_with(s)
                })
                .count()
        };
        assert_eq!(of("hourly-s3"), hour.min(2), "hour {hour}: S3 keeps two");
        assert_eq!(of("hourly-dir"), 1, "hour {hour}: directory keeps one");
        for b in &backups {
            assert_eq!(
                status_of(b)?.phase.as_deref(),
                Some(phase::SUCCEEDED),
                "{b:#?}"
            );
            assert_stored(b).await?;
        }
    }
    // Down for five hours: one catch-up, not five.
    clock.advance(Duration::from_secs(5 * 3600));
    let before = list_backups(&fleet).await?.len();
    schedule_round(&fleet, &bctx, &["hourly-s3"]).await?;
    let after = list_backups(&fleet).await?;
    assert_eq!(after.len(), before, "one created, one pruned (count 2)");

    // The pruned backups' objects are gone from both stores; the kept ones are there.
    let kept: Vec<String> = after
        .iter()
        .filter_map(|b| status_of(b).ok()?.object_key.clone())
        .collect();
    let files: Vec<String> = walk(dir.path())
        .into_iter()
        .filter(|f| f.ends_with(".db"))
        .collect();
    assert_eq!(files.len(), 1, "directory holds one snapshot: {files:?}");
    assert!(
        kept.iter().any(|k| files[0].ends_with(k.as_str())),
        "{files:?} vs {kept:?}"
    );
    let status = api.get("hourly-s3").await?.status.context("status")?;
    let newest = status.last_successful_backup.context("last success")?;
    assert!(
        after
            .iter()
            .any(|b| b.metadata.name.as_deref() == Some(&newest))
    );
    assert!(status.last_success_time.is_some() && status.last_failure_time.is_none());
    let metrics = ctl.ctx.metrics.encode();
    assert!(
        metrics.contains(&format!(
            "etcdfleet_backup_size_bytes{{cluster=\"{NS}/etcd-a\"}}"
        )),
        "{metrics}"
    );
    // Every pruning delete names the UID it read: a same-named EtcdBackup
    // made since is not deleted in its place.
    let deletes: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|op| op.verb == "delete" && op.resource == "etcdbackups")
        .collect();
    assert!(!deletes.is_empty(), "retention pruned nothing");
    for op in &deletes {
        let uid = op
            .body
            .as_ref()
            .and_then(|b| b["preconditions"]["uid"].as_str());
        assert!(uid.is_some_and(|u| !u.is_empty()), "{op:?}");
    }
    Ok(())
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// Writes N keys, backs up to S3, downloads the object, restores it with
/// the version's own restore tool into a new single-member etcd and reads
/// all N keys back through etcd-client.
async fn backup_restores_every_key(version: EtcdVersion, etcd_version: &str) -> Result<()> {
    let Some(binary) = require_etcd(version) else {
        return Ok(());
    };
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("restore")?;
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, etcd_version)]).await?;
    put_credentials(&fleet).await?;
    const N: usize = 300;
    put_keys(&fleet, "a", "etcd-a", "restore", N).await?;
    let (_clock, now) = TestClock::new();
    let bctx = backup_context(&ctl, now);
    create_backup(
        &fleet,
        "one",
        "etcd-a",
        s3.destination("restore", CREDENTIALS),
    )
    .await?;
    let outcomes = drive_backup(&fleet, &bctx, "one").await?;
    let b = get_backup(&fleet, "one").await?;
    let s = status_of(&b)?;
    assert_eq!(
        s.phase.as_deref(),
        Some(phase::SUCCEEDED),
        "{outcomes:?} {s:#?}"
    );
    assert!(s.revision.unwrap_or_default() > N as i64, "{s:#?}");
    assert_eq!(s.etcd_version.as_deref(), Some(etcd_version));
    assert_stored(&b).await?;

    let local = tempfile::tempdir()?;
    let file = local.path().join("snapshot.db");
    let store = open(s.destination.as_ref().context("destination")?)?;
    let mut out = tokio::fs::File::create(&file).await?;
    let (size, sha) = store
        .read_through(s.object_key.as_ref().context("key")?, Some(&mut out))
        .await?;
    assert_eq!(Some(size as i64), s.size_bytes);
    assert_eq!(Some(&sha), s.sha256.as_ref());
    read_back(binary, &file, N).await
}

async fn read_back(binary: EtcdBinary, snapshot: &Path, n: usize) -> Result<()> {
    let restored = LocalEtcdCluster::restore_single(binary, snapshot, false).await?;
    let mut kv =
        ClusterClient::connect(&[restored.member(0).client_url()], &restored.etcd_config())
            .await?
            .kv();
    let resp = kv
        .get(
            "restore/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    assert_eq!(resp.kvs().len(), n, "every key is in the restored etcd");
    for (i, kv) in resp.kvs().iter().enumerate() {
        assert_eq!(kv.key_str()?, format!("restore/{i:05}"));
        assert_eq!(kv.value_str()?, format!("value-{i}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_in_s3_restores_every_key_with_etcd_3_5() -> Result<()> {
    backup_restores_every_key(EtcdVersion::V3_5, "3.5.1").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_in_s3_restores_every_key_with_etcd_3_4() -> Result<()> {
    backup_restores_every_key(EtcdVersion::V3_4, "3.4.23").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_a_continuous_writer_loses_no_write_and_takes_no_member_down() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put_keys(&fleet, "a", "etcd-a", "bulk", 500).await?;
    let before = get(&fleet, "etcd-a").await?.status.context("status")?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (_clock, now) = TestClock::new();
    let bctx = backup_context(&ctl, now);
    let to_dir = ObjectStoreDestination {
        path: Some(dir.path().display().to_string()),
        ..Default::default()
    };
    create_backup(&fleet, "under-load", "etcd-a", to_dir).await?;
    drive_backup(&fleet, &bctx, "under-load").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = writer.stop().await?;
    let b = get_backup(&fleet, "under-load").await?;
    assert_eq!(
        status_of(&b)?.phase.as_deref(),
        Some(phase::SUCCEEDED),
        "{b:#?}"
    );
    assert_stored(&b).await?;

    // The snapshot came from a follower, not the leader.
    let member = status_of(&b)?.member.clone().context("member")?;
    let leader = before
        .members
        .iter()
        .find(|m| m.leader)
        .map(|m| m.name.clone());
    assert_ne!(Some(member), leader, "snapshot from a follower");

    assert!(!report.acknowledged.is_empty(), "the writer wrote");
    let verified = verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    assert_eq!(verified, report.acknowledged.len());
    // No member went down: each answers a linearizable read through its own
    // URL, and the membership is the one from before the backup.
    for ep in &endpoints {
        MemberClient::connect(ep, &config)
            .await?
            .check_health()
            .await
            .with_context(|| format!("{ep} is not healthy after the backup"))?;
    }
    let members = ClusterClient::connect(&endpoints, &config)
        .await?
        .list_members()
        .await?;
    assert_eq!(members.iter().filter(|m| !m.is_learner).count(), 3);
    let ids = |s: &etcdfleet_api::EtcdClusterStatus| {
        let mut v: Vec<Option<String>> = s.members.iter().map(|m| m.id.clone()).collect();
        v.sort();
        v
    };
    let mut ids_now: Vec<Option<String>> = members
        .iter()
        .map(|m| Some(format!("{:x}", m.id)))
        .collect();
    ids_now.sort();
    assert_eq!(ids(&before), ids_now);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_attempt_sets_a_condition_and_is_retried_after_backoff() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    let (fleet, ctl) = running(&["a"], &[cluster("etcd-a", "a", 3, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    let (clock, now) = TestClock::new();
    let bctx = backup_context(&ctl, now);
    // The bucket does not exist yet: the upload fails.
    create_backup(
        &fleet,
        "early",
        "etcd-a",
        s3.destination("late-bucket", CREDENTIALS),
    )
    .await?;
    let outcomes = drive_backup(&fleet, &bctx, "early").await?;
    assert!(
        matches!(outcomes.last(), Some(Outcome::AttemptFailed { .. })),
        "{outcomes:?}"
    );
    let b = get_backup(&fleet, "early").await?;
    let s = status_of(&b)?;
    assert_eq!(s.phase.as_deref(), Some(phase::PENDING));
    assert_eq!(s.attempts, 1);
    let failed = conditions::find(&s.conditions, condition::FAILED).context("Failed condition")?;
    assert_eq!(failed.status, "True");
    assert!(failed.message.contains("retrying in 10s"), "{failed:?}");
    assert!(s.next_attempt_at.is_some());

    // Before the backoff ends nothing is tried.
    let outcome = reconcile_backup(&b, &bctx).await?;
    assert!(matches!(outcome, Outcome::Waiting { .. }), "{outcome:?}");

    s3.create_bucket("late-bucket")?;
    clock.advance(Duration::from_secs(11));
    drive_backup(&fleet, &bctx, "early").await?;
    let b = get_backup(&fleet, "early").await?;
    let s = status_of(&b)?;
    assert_eq!(s.phase.as_deref(), Some(phase::SUCCEEDED), "{s:#?}");
    assert_eq!(s.attempts, 2);
    assert!(conditions::find(&s.conditions, condition::FAILED).is_none());
    assert_stored(&b).await?;
    let metrics = ctl.ctx.metrics.encode();
    assert!(
        metrics.contains("etcdfleet_backup_failures_total{cluster=\"team-a/etcd-a\""),
        "{metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_store_outage_while_streaming_a_backup_is_reported_as_a_store_error() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("outage")?;
    let destination = s3.destination("outage", CREDENTIALS);
    let (fleet, _) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    // More than one upload part: the store is first written to while etcd
    // is still streaming the snapshot.
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 1).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    let value = vec![b'x'; 1 << 20];
    for i in 0..12 {
        tokio::time::timeout(
            Duration::from_secs(5),
            kv.put(format!("big/{i:02}"), value.clone(), None),
        )
        .await??;
    }
    // The object store goes down; etcd is fine. The store client retries
    // its request before it gives up (a few seconds here); the snapshot
    // deadline is made long, so what ends the attempt is the store's error.
    drop(s3);
    let mut settings = etcdfleet_tests::driver::fast_settings();
    settings.etcd_deadlines.snapshot = Duration::from_secs(300);
    let ctl = etcdfleet_tests::scenario::controller_with(&fleet, settings);
    let (_clock, now) = TestClock::new();
    let bctx = backup_context(&ctl, now);
    create_backup(&fleet, "during-outage", "etcd-a", destination).await?;
    let outcomes = drive_backup(&fleet, &bctx, "during-outage").await?;
    let Some(Outcome::AttemptFailed { reason, message }) = outcomes.last() else {
        panic!("expected a failed attempt: {outcomes:?}");
    };
    assert_eq!(reason, "ObjectStoreError", "{message}");
    assert!(
        !message.starts_with("etcd") && message.contains("during-outage"),
        "{message}"
    );
    let b = get_backup(&fleet, "during-outage").await?;
    let failed = conditions::find(&status_of(&b)?.conditions, condition::FAILED)
        .context("Failed condition")?;
    assert_eq!(failed.reason, "ObjectStoreError", "{failed:?}");
    let metrics = ctl.ctx.metrics.encode();
    assert!(
        metrics.contains(
            "etcdfleet_backup_failures_total{cluster=\"team-a/etcd-a\",reason=\"ObjectStoreError\"} 1"
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("IOError"), "{metrics}");
    Ok(())
}

/// An identity endpoint the test owns, as an EKS Pod Identity agent
/// answers (temporary keys, which moto accepts): counts the requests.
struct IdentityEndpoint {
    url: String,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl IdentityEndpoint {
    async fn start() -> Result<IdentityEndpoint> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1/credentials", listener.local_addr()?);
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = format!(
                        r#"{{"AccessKeyId":"{ACCESS_KEY_ID}","SecretAccessKey":"{SECRET_ACCESS_KEY}","Token":"t","Expiration":"2099-01-01T00:00:00Z"}}"#
                    );
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        Ok(IdentityEndpoint { url, requests })
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Issue 52: a tenant's bucket destination without `credentialsSecretName`
/// is refused before any request, in a namespace the platform lends no
/// identity to, and the identity endpoint the controller knows is never
/// asked; lent to the namespace, the same backup is taken as that identity
/// (which shows the endpoint is the one a lent identity asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_bucket_without_credentials_is_refused_and_no_identity_is_asked() -> Result<()> {
    use etcdfleet_controllers::tenancy::{Fence, TenancyConfig, WorkloadIdentity};
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("tenants")?;
    let identity = IdentityEndpoint::start().await?;
    let token = tempfile::NamedTempFile::new()?;
    std::fs::write(token.path(), "projected-token")?;
    let lent_to = |namespaces: &[&str]| {
        let config = TenancyConfig {
            workload_identity_namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        Fence::new(
            &config,
            Some(WorkloadIdentity::PodIdentity {
                full_uri: identity.url.clone(),
                token_file: token.path().display().to_string(),
            }),
        )
    };
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    let mut destination = s3.destination("tenants", CREDENTIALS);
    destination.credentials_secret_name = None;

    ctl.set_fence(lent_to(&["another-team"]));
    let (_clock, now) = TestClock::new();
    create_backup(&fleet, "no-keys", "etcd-a", destination.clone()).await?;
    let outcomes = drive_backup(&fleet, &backup_context(&ctl, now.clone()), "no-keys").await?;
    let Some(Outcome::AttemptFailed { reason, message }) = outcomes.last() else {
        panic!("expected a refused attempt: {outcomes:?}");
    };
    assert_eq!(reason, "CredentialsRequired", "{message}");
    assert!(message.contains("credentialsSecretName"), "{message}");
    let b = get_backup(&fleet, "no-keys").await?;
    let failed = conditions::find(&status_of(&b)?.conditions, condition::FAILED)
        .context("Failed condition")?;
    assert_eq!(failed.reason, "CredentialsRequired", "{failed:?}");
    assert_eq!(identity.requests(), 0, "the identity endpoint was asked");

    ctl.set_fence(lent_to(&[NS]));
    create_backup(&fleet, "lent", "etcd-a", destination).await?;
    drive_backup(&fleet, &backup_context(&ctl, now), "lent").await?;
    let b = get_backup(&fleet, "lent").await?;
    assert_eq!(
        status_of(&b)?.phase.as_deref(),
        Some(phase::SUCCEEDED),
        "{b:#?}"
    );
    assert!(identity.requests() >= 1, "the lent identity was not used");
    Ok(())
}
