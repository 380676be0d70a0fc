//! One process that always dies with the test: its own process group,
//! SIGKILL when the spawning thread exits (`PR_SET_PDEATHSIG`), optionally
//! in a private mount namespace with its own `/etc/hosts` and bind-mounted
//! volumes (the workload runtime's pods); and the free loopback ports and
//! random numbers its callers pick addresses with.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

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
prog="$1"; shift
hidden=
# A machine's program under a target (a checkout in /tmp, a pod's emptyDir
# at /tmp) is opened before the mounts hide it, and run from that
# descriptor; a program only a volume holds (the seeder a pod copied into
# its emptyDir) is run from the volume.
if [ -f "$prog" ]; then
  for t in "${targets[@]}"; do case "$prog" in "$t"/*) hidden=1 ;; esac; done
fi
if [ -n "$hidden" ]; then exec 3<"$prog"; fi
for j in "${!targets[@]}"; do
  mkdir -p "${targets[$j]}"; mount --bind "$stage/$j" "${targets[$j]}"
done
if [ -n "$hidden" ]; then exec -a "$prog" /proc/self/fd/3 "$@"; fi
exec "$prog" "$@""#;
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

/// The last `lines` lines of a log file, for failure messages.
pub(super) fn log_tail(path: &Path, lines: usize) -> String {
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
