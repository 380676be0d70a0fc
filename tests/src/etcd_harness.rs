//! Real local etcd for tests: locating the etcd releases this project
//! tests against (3.4.23, 3.5.1, and the 3.5, 3.6 and 3.7 patches built from
//! `hack/upstream`), running etcd processes that always die with the test, whole
//! local clusters (plain or mutual TLS) whose members can be stopped, killed,
//! restarted on another binary, wiped and joined, and an acknowledged-write
//! checker that proves no acknowledged write is lost across an operation.
//!
//! [`EtcdProcess`] is deliberately independent of [`LocalEtcdCluster`]: the
//! end-to-end harness plays kubelet with it, one process per etcd pod, each
//! with its own loopback IP and a private `/etc/hosts` ([`ProcessSpec::hosts_file`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient, TlsMaterial};
use etcdfleet_controllers::pki::{CertUsage, CertificateAuthority, LeafSpec};

/// The etcd releases the suite runs, by the role each plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtcdVersion {
    /// Debian's etcd-server 3.4.23 in /usr/bin (override: `ETCDFLEET_ETCD34_DIR`):
    /// the 3.4 → 3.5 path.
    V3_4,
    /// Upstream 3.5.1 in `.tools/etcd-v3.5.1` from PyPI (override:
    /// `ETCDFLEET_ETCD35_DIR`): the 3.5 most suites run.
    V3_5,
    /// An older 3.5 patch, below the 3.6 gate (`hack/upstream/etcd-3.5-old`).
    V3_5Old,
    /// The newest served 3.5 patch (`hack/upstream/etcd-3.5`).
    V3_5Latest,
    /// The newest served 3.6 patch (`hack/upstream/etcd-3.6`).
    V3_6,
    /// The newest served 3.7 patch (`hack/upstream/etcd-3.7`).
    V3_7,
}

impl EtcdVersion {
    /// Every release the suite runs, oldest first.
    pub const ALL: [EtcdVersion; 6] = [
        EtcdVersion::V3_4,
        EtcdVersion::V3_5,
        EtcdVersion::V3_5Old,
        EtcdVersion::V3_5Latest,
        EtcdVersion::V3_6,
        EtcdVersion::V3_7,
    ];

    pub fn label(self) -> &'static str {
        match self {
            EtcdVersion::V3_4 => "3.4",
            EtcdVersion::V3_5 => "3.5",
            EtcdVersion::V3_5Old => "3.5 (older patch)",
            EtcdVersion::V3_5Latest => "3.5 (newest patch)",
            EtcdVersion::V3_6 => "3.6",
            EtcdVersion::V3_7 => "3.7",
        }
    }

    /// The `hack/upstream` wrapper module that pins a built release.
    fn wrapper(self) -> Option<&'static str> {
        match self {
            EtcdVersion::V3_4 | EtcdVersion::V3_5 => None,
            EtcdVersion::V3_5Old => Some("etcd-3.5-old"),
            EtcdVersion::V3_5Latest => Some("etcd-3.5"),
            EtcdVersion::V3_6 => Some("etcd-3.6"),
            EtcdVersion::V3_7 => Some("etcd-3.7"),
        }
    }

    /// The full release (`3.6.16`): the package's for 3.4.23 and 3.5.1, the
    /// pin of the wrapper module (`go.etcd.io/etcd/server/v3 v3.6.16`) for
    /// the built ones; `None` if that pin cannot be read.
    pub fn release(self) -> Option<String> {
        match self.wrapper() {
            None if self == EtcdVersion::V3_4 => Some("3.4.23".to_string()),
            None => Some("3.5.1".to_string()),
            Some(dir) => pinned_etcd(dir),
        }
    }
}

/// The etcd release a `hack/upstream/<dir>/go.mod` pins.
pub fn pinned_etcd(dir: &str) -> Option<String> {
    let go_mod = workspace_root()
        .join("hack/upstream")
        .join(dir)
        .join("go.mod");
    fs::read_to_string(go_mod).ok()?.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == "go.etcd.io/etcd/server/v3")
            .then(|| words.next())?
            .map(|v| v.trim_start_matches('v').to_string())
    })
}

/// The binaries of one etcd release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdBinary {
    pub version: EtcdVersion,
    /// The full release, e.g. `3.6.16` (what `spec.version` names).
    pub release: String,
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    /// `etcdutl` (3.5+); 3.4 restores with `etcdctl snapshot restore`.
    pub etcdutl: Option<PathBuf>,
}

/// The workspace root, from this crate's manifest dir.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives inside the workspace")
        .to_path_buf()
}

/// Where the built releases are linked (`.tools`, or `ETCDFLEET_TOOLS_DIR`).
fn tools_dir() -> PathBuf {
    std::env::var_os("ETCDFLEET_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools"))
}

impl EtcdBinary {
    /// Where the binaries of `version` are expected (they may be missing).
    pub fn locate(version: EtcdVersion) -> EtcdBinary {
        let release = version.release().unwrap_or_else(|| "unknown".to_string());
        let (dir, etcdutl) = match version {
            EtcdVersion::V3_4 => (
                std::env::var_os("ETCDFLEET_ETCD34_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/usr/bin")),
                false,
            ),
            EtcdVersion::V3_5 => (
                std::env::var_os("ETCDFLEET_ETCD35_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| workspace_root().join(".tools/etcd-v3.5.1")),
                true,
            ),
            _ => (tools_dir().join(format!("etcd-v{release}")), true),
        };
        EtcdBinary {
            version,
            release,
            etcd: dir.join("etcd"),
            etcdctl: dir.join("etcdctl"),
            etcdutl: etcdutl.then(|| dir.join("etcdutl")),
        }
    }

    /// The image this release runs as in the test world (any repository:
    /// the runtime maps images by tag).
    pub fn image(&self) -> String {
        format!(
            "{}:v{}",
            etcdfleet_api::version::DEFAULT_IMAGE_REPOSITORY,
            self.release
        )
    }

    /// The first required binary that is missing, if any.
    pub fn missing(&self) -> Option<&Path> {
        [Some(&self.etcd), Some(&self.etcdctl), self.etcdutl.as_ref()]
            .into_iter()
            .flatten()
            .find(|p| !p.is_file())
            .map(PathBuf::as_path)
    }

    /// The tool that restores snapshots for this version, with its subcommand.
    pub fn snapshot_restore(&self) -> Command {
        let mut cmd = Command::new(self.etcdutl.as_ref().unwrap_or(&self.etcdctl));
        if self.etcdutl.is_none() {
            cmd.env("ETCDCTL_API", "3");
        }
        cmd.args(["snapshot", "restore"]);
        cmd
    }
}

/// One etcd release the test command built from its Go modules
/// (`hack/upstream/build.sh`), linked at `.tools/etcd-v<version>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltEtcd {
    /// `(major, minor, patch)`.
    pub version: (u64, u64, u64),
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    pub etcdutl: PathBuf,
}

impl BuiltEtcd {
    /// `3.6.16`.
    pub fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }
}

/// Every built etcd release under `.tools/` (or `ETCDFLEET_TOOLS_DIR`),
/// oldest first. The PyPI 3.5.1 (`.tools/etcd-v3.5.1`) counts too: it has
/// the same layout.
pub fn built_etcds() -> Vec<BuiltEtcd> {
    let tools = tools_dir();
    let mut found: Vec<BuiltEtcd> = fs::read_dir(&tools)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let mut parts = name
                .strip_prefix("etcd-v")?
                .split('.')
                .map(str::parse::<u64>);
            let version = (
                parts.next()?.ok()?,
                parts.next()?.ok()?,
                parts.next()?.ok()?,
            );
            let dir = entry.path();
            let built = BuiltEtcd {
                version,
                etcd: dir.join("etcd"),
                etcdctl: dir.join("etcdctl"),
                etcdutl: dir.join("etcdutl"),
            };
            built.etcd.is_file().then_some(built)
        })
        .collect();
    found.sort_by_key(|b| b.version);
    found
}

/// The newest built etcd (what the real control planes store objects in).
pub fn newest_built_etcd() -> Result<BuiltEtcd> {
    built_etcds()
        .pop()
        .ok_or_else(|| anyhow!("no etcd under .tools/etcd-v* (run hack/upstream/build.sh)"))
}

/// The binaries of `version`, or `None` after a loud `SKIPPED:` line on
/// stderr when they are missing. With `ETCDFLEET_REQUIRE_ETCD=1` (set by the
/// Makefile, so CI never skips silently) a missing binary panics instead.
pub fn require_etcd(version: EtcdVersion) -> Option<EtcdBinary> {
    let binary = EtcdBinary::locate(version);
    let Some(missing) = binary.missing().map(Path::to_path_buf) else {
        return Some(binary);
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let message = format!(
        "{test}: etcd {} ({}) not found at {} (run hack/install-tools.sh)",
        version.label(),
        binary.release,
        missing.display()
    );
    if std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() == Ok("1") {
        panic!("ETCDFLEET_REQUIRE_ETCD=1 but {message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

/// How to run one etcd (or any) process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    pub binary: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// stdout and stderr go here (appended, so restarts keep history).
    pub log_file: PathBuf,
    /// If set, the process runs in its own mount namespace with this file
    /// bind-mounted over `/etc/hosts`, so it resolves private names (needs
    /// root and `unshare`).
    pub hosts_file: Option<PathBuf>,
}

/// One running process in its own process group. The whole group is killed
/// on drop, and the process gets SIGKILL if the thread that spawned it exits
/// (`PR_SET_PDEATHSIG`), so a panicking or aborted test leaves no orphan.
#[derive(Debug)]
pub struct EtcdProcess {
    // Behind a lock so liveness can be asked through a shared reference.
    child: Mutex<Child>,
    pid: u32,
    log_file: PathBuf,
}

impl EtcdProcess {
    /// Runs `spec.binary`; with a `hosts_file`, in a private mount namespace
    /// (see [`spawn_with_mounts`](Self::spawn_with_mounts)).
    pub fn spawn(spec: &ProcessSpec) -> Result<EtcdProcess> {
        if spec.hosts_file.is_some() {
            return Self::spawn_with_mounts(spec, &[]);
        }
        let mut cmd = Command::new(&spec.binary);
        cmd.args(&spec.args);
        Self::launch(cmd, spec)
    }

    /// Like [`spawn`](Self::spawn), but always in a private mount namespace
    /// (`unshare -m`) where `spec.hosts_file` (if any) is bind-mounted over
    /// `/etc/hosts` and each `(source, target)` directory of `mounts` is
    /// bind-mounted onto `target`, in order (parents first). Targets must
    /// exist. Used by the workload runtime for pod volumes.
    pub fn spawn_with_mounts(
        spec: &ProcessSpec,
        mounts: &[(PathBuf, PathBuf)],
    ) -> Result<EtcdProcess> {
        // $1 is the hosts file ("" for none), then source/target pairs up to
        // "--", then the program; `exec` keeps the pid, group and death signal.
        // Every source is first bound into a private staging tmpfs, then onto
        // its target: a target that is an ancestor of later sources (a pod's
        // emptyDir at /tmp, while volumes live under /tmp on the host) would
        // otherwise hide them.
        let script = r#"set -e
h="$1"; shift
if [ -n "$h" ]; then mount --bind "$h" /etc/hosts; fi
stage=/run/etcdfleet-stage
mkdir -p "$stage"
mount -t tmpfs etcdfleet-stage "$stage"
targets=(); i=0
while [ "$1" != "--" ]; do
  mkdir "$stage/$i"; mount --bind "$1" "$stage/$i"
  targets+=("$2"); i=$((i + 1)); shift 2
done
shift
for j in "${!targets[@]}"; do
  mkdir -p "${targets[$j]}"; mount --bind "$stage/$j" "${targets[$j]}"
done
exec "$@""#;
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "bash", "-c", script, "bash"])
            .arg(spec.hosts_file.as_deref().unwrap_or(Path::new("")));
        for (source, target) in mounts {
            cmd.arg(source).arg(target);
        }
        cmd.arg("--").arg(&spec.binary).args(&spec.args);
        Self::launch(cmd, spec)
    }

    /// Starts `cmd` with the spec's env and log, in its own process group,
    /// killed when the spawning thread dies.
    fn launch(mut cmd: Command, spec: &ProcessSpec) -> Result<EtcdProcess> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_file)
            .with_context(|| format!("opening {}", spec.log_file.display()))?;
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", spec.binary.display()))?;
        Ok(EtcdProcess {
            pid: child.id(),
            child: Mutex::new(child),
            log_file: spec.log_file.clone(),
        })
    }

    /// The exit status once the process has exited (reaping it), else `None`.
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.try_wait().ok().flatten()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Whether the process is still running.
    pub fn is_running(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    fn signal_group(&self, signal: libc::c_int) {
        // The child leads its own group: pgid == pid.
        let pgid = self.pid as libc::pid_t;
        // SAFETY: plain syscall; an already-gone group just returns ESRCH.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }

    async fn wait_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !self.is_running()
    }

    /// SIGTERM to the group; SIGKILL if it has not exited within `grace`.
    pub async fn terminate(&self, grace: Duration) {
        let started = Instant::now();
        self.signal_group(libc::SIGTERM);
        let exited = self.wait_exit(grace).await;
        tracing::debug!(log = %self.log_file.display(), took = ?started.elapsed(), exited, "SIGTERM");
        if !exited {
            self.kill().await;
        }
    }

    /// SIGKILL to the group, then reap.
    pub async fn kill(&self) {
        self.signal_group(libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10)).await;
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_file, lines)
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.signal_group(libc::SIGKILL);
            let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
            let _ = child.wait();
        }
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Picks `n` distinct free loopback ports (held open together while picking).
///
/// The ports come from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel hands out for
/// `bind(:0)` or as the source port of an outgoing connection can be taken by
/// another test process between this pick and etcd's own bind, which made a
/// member exit with "address already in use" under a loaded suite. Ports are
/// random in `[10000, low)`, so parallel test processes rarely pick the same.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > 12_000)
        .unwrap_or(32_768);
    let span = u64::from(low - 10_000);
    let mut listeners: Vec<TcpListener> = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..(n * 200) {
        if ports.len() == n {
            break;
        }
        let port = 10_000 + (random_u64() % span) as u16;
        if ports.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            ports.push(port);
            listeners.push(l);
        }
    }
    ensure!(ports.len() == n, "no {n} free loopback ports below {low}");
    Ok(ports)
}

/// A random number, different per call and per process.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now().hash(&mut hasher);
    std::process::id().hash(&mut hasher);
    COUNTER
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .hash(&mut hasher);
    hasher.finish()
}

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

/// What an [`AckedWriter`] did.
#[derive(Debug, Default, Clone)]
pub struct WriteReport {
    /// Writes etcd acknowledged: key → value.
    pub acknowledged: BTreeMap<String, String>,
    /// Writes that failed or timed out (their outcome is unknown).
    pub failed: u64,
    /// The longest time between two acknowledged writes (a
    /// [`FollowingWriter`]'s; zero for an [`AckedWriter`]).
    pub longest_pause: Duration,
}

/// Writes keys `<prefix>/<seq>` continuously, like [`AckedWriter`], through
/// whichever member answers: endpoints (each with its own TLS) can be added
/// while it runs, and a failed write moves on to the next one, as a client
/// given every member's URL does. Records the longest pause between two
/// acknowledged writes: how long clients could not write.
pub struct FollowingWriter {
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<(String, EtcdConfig)>>>,
    task: tokio::task::JoinHandle<Result<WriteReport>>,
}

impl FollowingWriter {
    pub fn start(endpoints: Vec<(String, EtcdConfig)>, prefix: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints = Arc::new(Mutex::new(endpoints));
        let task = tokio::spawn(follow_writes(
            stop.clone(),
            endpoints.clone(),
            prefix.to_string(),
        ));
        FollowingWriter {
            stop,
            endpoints,
            task,
        }
    }

    /// Adds an endpoint (once).
    pub fn add(&self, endpoint: String, config: EtcdConfig) {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        if !endpoints.iter().any(|(e, _)| *e == endpoint) {
            endpoints.push((endpoint, config));
        }
    }

    /// Stops writing and returns what was acknowledged.
    pub async fn stop(self) -> Result<WriteReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

async fn follow_writes(
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<(String, EtcdConfig)>>>,
    prefix: String,
) -> Result<WriteReport> {
    let mut clients: BTreeMap<String, etcd_client::Client> = BTreeMap::new();
    let mut report = WriteReport::default();
    let (mut seq, mut at) = (0u64, 0usize);
    let mut last_ack: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let (endpoint, config) = {
            let list = endpoints.lock().unwrap_or_else(|p| p.into_inner());
            list[at % list.len()].clone()
        };
        if !clients.contains_key(&endpoint) {
            let client = ClusterClient::connect(std::slice::from_ref(&endpoint), &config).await?;
            clients.insert(endpoint.clone(), client.kv());
        }
        let kv = clients.get_mut(&endpoint).expect("just inserted");
        seq += 1;
        let (key, value) = (format!("{prefix}/{seq:08}"), format!("value-{seq}"));
        let put = tokio::time::timeout(
            Duration::from_secs(2),
            kv.put(key.as_str(), value.as_str(), None),
        )
        .await;
        if let Ok(Ok(_)) = put {
            report.acknowledged.insert(key, value);
            let now = Instant::now();
            if let Some(last) = last_ack {
                report.longest_pause = report.longest_pause.max(now - last);
            }
            last_ack = Some(now);
        } else {
            report.failed += 1;
            at += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(report)
}

/// Writes keys `<prefix>/<seq>` continuously through a client balanced over
/// all endpoints and records which writes etcd acknowledged; afterwards,
/// [`verify_acknowledged`] proves every one of them is readable.
pub struct AckedWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<WriteReport>>,
}

impl AckedWriter {
    pub async fn start(endpoints: Vec<String>, config: EtcdConfig, prefix: &str) -> Result<Self> {
        let client = ClusterClient::connect(&endpoints, &config).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = prefix.to_string();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut kv = client.kv();
                let mut report = WriteReport::default();
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let key = format!("{prefix}/{seq:08}");
                    let value = format!("value-{seq}");
                    let put = tokio::time::timeout(
                        Duration::from_secs(2),
                        kv.put(key.as_str(), value.as_str(), None),
                    )
                    .await;
                    match put {
                        Ok(Ok(_)) => {
                            report.acknowledged.insert(key, value);
                        }
                        _ => {
                            report.failed += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(report)
            }
        });
        Ok(AckedWriter { stop, task })
    }

    /// Stops writing and returns what was acknowledged.
    pub async fn stop(self) -> Result<WriteReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// The acknowledged writes of `report` that `stored` (what was read back)
/// lacks or holds with another value.
pub fn lost_writes<'a>(
    report: &'a WriteReport,
    stored: &BTreeMap<String, String>,
) -> Vec<&'a String> {
    report
        .acknowledged
        .iter()
        .filter(|(k, v)| stored.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect()
}

/// Reads `prefix` back (linearizably, through `endpoints`) and checks every
/// acknowledged write is there with its value. Returns how many were checked.
pub async fn verify_acknowledged(
    report: &WriteReport,
    endpoints: &[String],
    config: &EtcdConfig,
    prefix: &str,
) -> Result<usize> {
    let mut kv = ClusterClient::connect(endpoints, config).await?.kv();
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        kv.get(
            format!("{prefix}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ),
    )
    .await
    .context("reading back acknowledged writes timed out")??;
    let stored: BTreeMap<String, String> = resp
        .kvs()
        .iter()
        .map(|kv| Ok((kv.key_str()?.to_string(), kv.value_str()?.to_string())))
        .collect::<Result<_, etcd_client::Error>>()?;
    let lost = lost_writes(report, &stored);
    ensure!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost, first: {:?}",
        lost.len(),
        report.acknowledged.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
    Ok(report.acknowledged.len())
}
