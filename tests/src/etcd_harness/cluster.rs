//! A whole local etcd cluster on 127.0.0.1, plain or mutual TLS: members
//! started as a new cluster, joined one at a time, restored or seeded from a
//! snapshot, stopped, killed, restarted on another binary and wiped; the
//! clients and `etcdctl` that reach it; and its data directories, removed
//! with it.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient, TlsMaterial};
use etcdfleet_controllers::pki::{CertUsage, CertificateAuthority, LeafSpec};

use super::binaries::EtcdBinary;
use super::process::{EtcdProcess, ProcessSpec, free_ports, log_tail};

/// The files of a cluster's TLS material.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    pub ca_file: PathBuf,
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
    /// What the controller uses: CA plus the client identity.
    pub material: TlsMaterial,
}

impl ClusterTls {
    /// A CA, one peer/server certificate for 127.0.0.1/localhost shared by all
    /// members, and a client identity, written into `dir`.
    pub fn generate(dir: &Path) -> Result<ClusterTls> {
        let ca = CertificateAuthority::generate("etcdfleet-test-ca")?;
        let server = ca.issue(&LeafSpec {
            common_name: "etcd-member".into(),
            dns_names: vec!["localhost".into()],
            ip_addresses: vec!["127.0.0.1".parse()?],
            usage: CertUsage::Peer,
            validity_days: 2,
        })?;
        let client = ca.issue(&LeafSpec::client("etcdfleet-controller", 2))?;
        let write = |name: &str, pem: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            fs::write(&path, pem)?;
            Ok(path)
        };
        Ok(ClusterTls {
            ca_file: write("ca.crt", ca.cert_pem())?,
            server_cert_file: write("server.crt", &server.cert_pem)?,
            server_key_file: write("server.key", &server.key_pem)?,
            client_cert_file: write("client.crt", &client.cert_pem)?,
            client_key_file: write("client.key", &client.key_pem)?,
            material: TlsMaterial {
                ca_pem: ca.cert_pem().to_string(),
                client_cert_pem: Some(client.cert_pem),
                client_key_pem: Some(client.key_pem),
                server_name: None,
            },
        })
    }
}

/// Options of a [`LocalEtcdCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub size: usize,
    pub binary: EtcdBinary,
    /// Mutual TLS on client and peer ports.
    pub tls: bool,
    /// Extra flags for every member (e.g. `--quota-backend-bytes=...`).
    pub extra_args: Vec<String>,
    /// Each member also gets the flags the controller renders for its
    /// release (`version_flags`: corruption checks in that release's
    /// spelling), as the pods do.
    pub version_flags: bool,
}

impl ClusterOptions {
    pub fn new(size: usize, binary: EtcdBinary) -> Self {
        ClusterOptions {
            size,
            binary,
            tls: false,
            extra_args: Vec::new(),
            version_flags: false,
        }
    }

    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Members run with the flags the controller renders for their release.
    pub fn with_version_flags(mut self) -> Self {
        self.version_flags = true;
        self
    }
}

/// What [`LocalEtcdCluster::seeded_single`] hands its seeder.
#[derive(Debug, Clone)]
pub struct SeedTarget {
    pub data_dir: PathBuf,
    pub name: String,
    pub initial_cluster: String,
    pub peer_url: String,
    pub token: String,
}

/// One member slot of a [`LocalEtcdCluster`].
#[derive(Debug)]
pub struct LocalMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub metrics_port: u16,
    pub data_dir: PathBuf,
    pub binary: EtcdBinary,
    /// Removed from the etcd membership (the harness no longer lists it).
    pub removed: bool,
    process: Option<EtcdProcess>,
    log_file: PathBuf,
    scheme: &'static str,
}

impl LocalMember {
    pub fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.peer_port)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.metrics_port)
    }

    pub fn is_running(&self) -> bool {
        self.process.as_ref().is_some_and(EtcdProcess::is_running)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_file, lines)
    }
}

/// A local etcd cluster on 127.0.0.1 with free ports and temporary data
/// dirs; everything is killed and deleted on drop.
#[derive(Debug)]
pub struct LocalEtcdCluster {
    members: Vec<LocalMember>,
    tls: Option<ClusterTls>,
    token: String,
    extra_args: Vec<String>,
    version_flags: bool,
    dir: tempfile::TempDir,
}

/// Flags that keep elections and snapshots fast enough for tests.
pub const FAST_ETCD_FLAGS: &[&str] = &[
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--snapshot-count=2000",
    "--logger=zap",
    "--log-level=warn",
];

const READY_TIMEOUT: Duration = Duration::from_secs(20);

impl LocalEtcdCluster {
    /// Starts `options.size` members as a new cluster and waits until every
    /// member answers a linearizable read.
    pub async fn start(options: ClusterOptions) -> Result<LocalEtcdCluster> {
        ensure!(options.size >= 1, "a cluster needs at least one member");
        let dir = tempfile::Builder::new().prefix("etcdfleet-").tempdir()?;
        let tls = if options.tls {
            Some(ClusterTls::generate(dir.path())?)
        } else {
            None
        };
        let mut cluster = LocalEtcdCluster {
            members: Vec::new(),
            tls,
            token: format!("etcdfleet-{}", std::process::id()),
            extra_args: options.extra_args,
            version_flags: options.version_flags,
            dir,
        };
        for _ in 0..options.size {
            cluster.allocate_member(options.binary.clone())?;
        }
        let initial = cluster.initial_cluster();
        for i in 0..options.size {
            cluster.spawn(i, "new", &initial)?;
        }
        for i in 0..options.size {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn tls(&self) -> Option<&ClusterTls> {
        self.tls.as_ref()
    }

    /// How the controller module reaches this cluster.
    pub fn etcd_config(&self) -> EtcdConfig {
        EtcdConfig {
            tls: self.tls.as_ref().map(|t| t.material.clone()),
            ..EtcdConfig::default()
        }
    }

    pub fn member(&self, i: usize) -> &LocalMember {
        &self.members[i]
    }

    pub fn member_mut(&mut self, i: usize) -> &mut LocalMember {
        &mut self.members[i]
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Slots of members that are still part of the cluster.
    pub fn active(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| !self.members[i].removed)
            .collect()
    }

    /// Client URLs of all members still part of the cluster.
    pub fn client_urls(&self) -> Vec<String> {
        self.active()
            .into_iter()
            .map(|i| self.members[i].client_url())
            .collect()
    }

    /// A module client balanced over all active members.
    pub async fn cluster_client(&self) -> Result<ClusterClient> {
        Ok(ClusterClient::connect(&self.client_urls(), &self.etcd_config()).await?)
    }

    /// A module client for member `i` only.
    pub async fn member_client(&self, i: usize) -> Result<MemberClient> {
        Ok(MemberClient::connect(&self.members[i].client_url(), &self.etcd_config()).await?)
    }

    /// Reserves a new member slot (ports, data dir, name) without starting it.
    pub fn allocate_member(&mut self, binary: EtcdBinary) -> Result<usize> {
        let i = self.members.len();
        let ports = free_ports(3)?;
        let name = format!("m{i}");
        self.members.push(LocalMember {
            data_dir: self.dir.path().join(format!("{name}.etcd")),
            log_file: self.dir.path().join(format!("{name}.log")),
            name,
            client_port: ports[0],
            peer_port: ports[1],
            metrics_port: ports[2],
            binary,
            removed: false,
            process: None,
            scheme: if self.tls.is_some() { "https" } else { "http" },
        });
        Ok(i)
    }

    fn initial_cluster(&self) -> String {
        self.active()
            .into_iter()
            .map(|i| format!("{}={}", self.members[i].name, self.members[i].peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The etcd command line of member `i`.
    pub fn member_args(&self, i: usize, state: &str, initial_cluster: &str) -> Vec<String> {
        let m = &self.members[i];
        let mut args = vec![
            format!("--name={}", m.name),
            format!("--data-dir={}", m.data_dir.display()),
            format!("--listen-client-urls={}", m.client_url()),
            format!("--advertise-client-urls={}", m.client_url()),
            format!("--listen-peer-urls={}", m.peer_url()),
            format!("--initial-advertise-peer-urls={}", m.peer_url()),
            format!("--listen-metrics-urls={}", m.metrics_url()),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-state={state}"),
            format!("--initial-cluster-token={}", self.token),
        ];
        args.extend(FAST_ETCD_FLAGS.iter().map(|s| s.to_string()));
        if let Some(tls) = &self.tls {
            let (ca, cert, key) = (
                tls.ca_file.display(),
                tls.server_cert_file.display(),
                tls.server_key_file.display(),
            );
            args.extend([
                format!("--cert-file={cert}"),
                format!("--key-file={key}"),
                format!("--trusted-ca-file={ca}"),
                "--client-cert-auth".into(),
                format!("--peer-cert-file={cert}"),
                format!("--peer-key-file={key}"),
                format!("--peer-trusted-ca-file={ca}"),
                "--peer-client-cert-auth".into(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        if self.version_flags {
            for flag in etcdfleet_controllers::version_flags::version_flags(&m.binary.release) {
                if !args.contains(&flag) {
                    args.push(flag);
                }
            }
        }
        args
    }

    fn spawn(&mut self, i: usize, state: &str, initial_cluster: &str) -> Result<()> {
        ensure!(
            !self.members[i].is_running(),
            "member {i} is already running"
        );
        let spec = ProcessSpec {
            binary: self.members[i].binary.etcd.clone(),
            args: self.member_args(i, state, initial_cluster),
            env: Vec::new(),
            log_file: self.members[i].log_file.clone(),
            hosts_file: None,
        };
        self.members[i].process = Some(EtcdProcess::spawn(&spec)?);
        Ok(())
    }

    /// Starts member `i` (already added to etcd with `member add`) with
    /// `--initial-cluster-state=existing` and the full member list. Does not
    /// wait: a learner only answers status, see [`wait_answering`](Self::wait_answering).
    pub fn start_joining(&mut self, i: usize) -> Result<()> {
        let initial = self.initial_cluster();
        self.spawn(i, "existing", &initial)
    }

    /// A new single-member cluster whose data dir is restored from
    /// `snapshot` with `binary`'s restore tool (`etcdutl snapshot restore`
    /// for 3.5, `etcdctl snapshot restore` for 3.4), started and healthy.
    pub async fn restore_single(
        binary: EtcdBinary,
        snapshot: &Path,
        tls: bool,
    ) -> Result<LocalEtcdCluster> {
        let dir = tempfile::Builder::new()
            .prefix("etcdfleet-restore-")
            .tempdir()?;
        let tls = if tls {
            Some(ClusterTls::generate(dir.path())?)
        } else {
            None
        };
        let mut cluster = LocalEtcdCluster {
            members: Vec::new(),
            tls,
            token: format!("etcdfleet-restored-{}", std::process::id()),
            extra_args: Vec::new(),
            version_flags: false,
            dir,
        };
        let i = cluster.allocate_member(binary.clone())?;
        let m = &cluster.members[i];
        let out = binary
            .snapshot_restore()
            .arg(snapshot)
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--name={}", m.name))
            .arg(format!("--initial-cluster={}={}", m.name, m.peer_url()))
            .arg(format!("--initial-advertise-peer-urls={}", m.peer_url()))
            .arg(format!("--initial-cluster-token={}", cluster.token))
            .output()?;
        ensure!(
            out.status.success(),
            "snapshot restore failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let initial = cluster.initial_cluster();
        cluster.spawn(i, "new", &initial)?;
        cluster.wait_healthy(i).await?;
        Ok(cluster)
    }

    /// A one-member cluster whose data directory `seed` fills before etcd
    /// starts on it (as an init container would): `seed` gets the member's
    /// data dir, name, initial cluster, peer URL and cluster token.
    pub async fn seeded_single<F, Fut>(binary: EtcdBinary, seed: F) -> Result<LocalEtcdCluster>
    where
        F: FnOnce(SeedTarget) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let dir = tempfile::Builder::new()
            .prefix("etcdfleet-seeded-")
            .tempdir()?;
        let mut cluster = LocalEtcdCluster {
            members: Vec::new(),
            tls: None,
            token: format!("etcdfleet-seeded-{}", std::process::id()),
            extra_args: Vec::new(),
            version_flags: false,
            dir,
        };
        let i = cluster.allocate_member(binary)?;
        let m = &cluster.members[i];
        seed(SeedTarget {
            data_dir: m.data_dir.clone(),
            name: m.name.clone(),
            initial_cluster: format!("{}={}", m.name, m.peer_url()),
            peer_url: m.peer_url(),
            token: cluster.token.clone(),
        })
        .await?;
        let initial = cluster.initial_cluster();
        cluster.spawn(i, "new", &initial)?;
        cluster.wait_healthy(i).await?;
        Ok(cluster)
    }

    /// One scale-out step by the rules, through the controller module: check
    /// the health view allows a learner, `member add --learner`, start the
    /// process with `--initial-cluster-state=existing`, promote once caught
    /// up (the module retries "not in sync"). Returns the slot and member id.
    pub async fn scale_out_with_module(&mut self, binary: EtcdBinary) -> Result<(usize, u64)> {
        let etcd = self.cluster_client().await?;
        etcd.observe().await?.can_add_learner()?;
        let i = self.allocate_member(binary)?;
        let added = etcd.add_learner(&[self.members[i].peer_url()]).await?;
        self.start_joining(i)?;
        self.wait_answering(i).await?;
        etcd.promote_learner(added.id).await?;
        self.wait_healthy(i).await?;
        Ok((i, added.id))
    }

    /// The etcd member id of slot `i`, looked up by peer URL (names are
    /// empty until a member starts).
    pub async fn member_id(&self, i: usize) -> Result<u64> {
        let peer = self.members[i].peer_url();
        self.cluster_client()
            .await?
            .list_members()
            .await?
            .into_iter()
            .find(|m| m.peer_urls.contains(&peer))
            .map(|m| m.id)
            .ok_or_else(|| anyhow!("member {i} ({peer}) is not in the member list"))
    }

    /// The slot whose peer URL etcd lists under `member_id`.
    pub async fn slot_of(&self, member_id: u64) -> Result<usize> {
        let members = self.cluster_client().await?.list_members().await?;
        let member = members
            .iter()
            .find(|m| m.id == member_id)
            .ok_or_else(|| anyhow!("member {member_id:x} not in the member list"))?;
        self.members
            .iter()
            .position(|m| member.peer_urls.contains(&m.peer_url()))
            .ok_or_else(|| anyhow!("member {member_id:x} is not one of this harness"))
    }

    /// SIGTERM, then wait for the exit.
    pub async fn stop(&mut self, i: usize) {
        if let Some(p) = self.members[i].process.take() {
            p.terminate(Duration::from_secs(10)).await;
        }
    }

    /// SIGKILL, no chance to clean up.
    pub async fn kill(&mut self, i: usize) {
        if let Some(p) = self.members[i].process.take() {
            p.kill().await;
        }
    }

    /// Starts a stopped member again on its data dir, optionally with another
    /// binary (a rolling upgrade), and waits until it is healthy.
    pub async fn restart(&mut self, i: usize, binary: Option<EtcdBinary>) -> Result<()> {
        self.stop(i).await;
        if let Some(b) = binary {
            self.members[i].binary = b;
        }
        let initial = self.initial_cluster();
        self.spawn(i, "existing", &initial)?;
        let started = Instant::now();
        let healthy = self.wait_healthy(i).await;
        tracing::debug!(member = i, took = ?started.elapsed(), "restarted member healthy");
        healthy
    }

    /// Stops member `i` and deletes its data dir (a lost disk).
    pub async fn wipe(&mut self, i: usize) -> Result<()> {
        self.kill(i).await;
        let dir = &self.members[i].data_dir;
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        Ok(())
    }

    /// Records that member `i` was removed from the etcd membership and stops it.
    pub async fn mark_removed(&mut self, i: usize) {
        self.stop(i).await;
        self.members[i].removed = true;
    }

    /// Waits until member `i` answers a linearizable read.
    pub async fn wait_healthy(&mut self, i: usize) -> Result<()> {
        let client = self.member_client(i).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match client.check_health().await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() < deadline && self.members[i].is_running() => {
                    tracing::debug!(member = i, error = %e, "waiting for member");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => bail!(
                    "member {i} not healthy: {e}\n--- log ---\n{}",
                    self.members[i].log_tail(30)
                ),
            }
        }
    }

    /// Waits until member `i` answers status and knows a leader (what a
    /// learner can do).
    pub async fn wait_answering(&mut self, i: usize) -> Result<()> {
        let client = self.member_client(i).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let last = match client.status().await {
                Ok(s) if s.leader != 0 => return Ok(()),
                Ok(_) => "no leader yet".to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline || !self.members[i].is_running() {
                bail!(
                    "member {i} not answering: {last}\n--- log ---\n{}",
                    self.members[i].log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The cluster version etcd reports through member `i` (e.g. "3.5.0"):
    /// without TLS from `GET /version` (`etcdcluster`) on the client URL; with
    /// mutual TLS from the `etcd_cluster_version` gauge on the plain metrics
    /// listener (as "3.5", etcd labels it MAJOR.MINOR).
    pub fn cluster_version(&self, i: usize) -> Result<String> {
        let m = &self.members[i];
        if self.tls.is_none() {
            let body = http_get(&format!("127.0.0.1:{}", m.client_port), "/version")?;
            let v: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("parsing /version answer {body:?}"))?;
            return v["etcdcluster"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no etcdcluster in {body}"));
        }
        let body = http_get(&format!("127.0.0.1:{}", m.metrics_port), "/metrics")?;
        body.lines()
            // Superseded versions stay in the output with value 0.
            .filter(|l| l.starts_with("etcd_cluster_version{") && l.ends_with("} 1"))
            .find_map(|l| {
                let label = l.split("cluster_version=\"").nth(1)?;
                Some(label.split('"').next()?.to_string())
            })
            .ok_or_else(|| anyhow!("no etcd_cluster_version metric"))
    }

    /// An `etcdctl` command (v3 API) aimed at `endpoints`, with this cluster's
    /// TLS flags, using member `binary`'s etcdctl.
    pub fn etcdctl(&self, binary: &EtcdBinary, endpoints: &[String]) -> Command {
        let mut cmd = Command::new(&binary.etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg("--command-timeout=5s");
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cacert={}", tls.ca_file.display()))
                .arg(format!("--cert={}", tls.client_cert_file.display()))
                .arg(format!("--key={}", tls.client_key_file.display()));
        }
        cmd
    }
}

/// A minimal HTTP/1.0 GET over plain TCP (for `/version` and `/metrics`).
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP answer from {addr}{path}"))?;
    ensure!(head.contains(" 200 "), "GET {addr}{path}: {head}");
    Ok(body.to_string())
}
