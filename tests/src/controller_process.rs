//! The real `etcdfleet run` binary as a child process: started with a
//! kubeconfig, its logs captured to files, its HTTP endpoints queried, its
//! signals and exit observed. Killed (SIGKILL) when dropped, so a failing test
//! leaves no controller behind.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The newest modification time of any file under `dir`.
pub fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return newest;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        newest = newest.max(t);
    }
    newest
}

/// The `etcdfleet` binary of this build (next to the test executable's
/// `deps/` directory). Panics, saying how to build it, when it is missing or
/// older than the controller sources: a process test of stale code proves
/// nothing. `ETCDFLEET_BINARY` names another build (the fleet bench runs the
/// release binary under a debug harness); it is checked the same way.
pub fn etcdfleet_binary() -> PathBuf {
    let bin = match std::env::var_os("ETCDFLEET_BINARY") {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe().expect("test executable path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("test executable lives in target/<profile>/deps");
            profile_dir.join(format!("etcdfleet{}", std::env::consts::EXE_SUFFIX))
        }
    };
    let how = "build it with `cargo build -p etcdfleet-controllers --bin etcdfleet` \
               (or run the workspace: `cargo nextest run --workspace --all-targets`)";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing; {how}", bin.display()));
    let sources =
        newest_mtime(&repo().join("controllers/src")).max(newest_mtime(&repo().join("api/src")));
    assert!(
        built >= sources,
        "{} is older than the controller sources; {how}",
        bin.display()
    );
    bin
}

/// A loopback port nothing listens on (bound, then released; picked below the
/// ephemeral range, see `free_ports`).
pub fn free_port() -> u16 {
    crate::etcd_harness::free_ports(1).expect("a free loopback port")[0]
}

/// A kubeconfig for `server` authenticating with a bearer `token` (the test
/// API tells replicas apart by it). TLS verification is skipped only when no
/// CA is given.
pub fn kubeconfig(server: &str, token: &str, ca_pem: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut cluster = format!("    server: {server}\n");
    match ca_pem {
        Some(ca) => {
            let b64 = base64_encode(ca.as_bytes());
            let _ = writeln!(cluster, "    certificate-authority-data: {b64}");
        }
        None => cluster.push_str("    insecure-skip-tls-verify: true\n"),
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: management\n  cluster:\n{cluster}\
         users:\n- name: controller\n  user:\n    token: {token}\n\
         contexts:\n- name: management\n  context:\n    cluster: management\n    user: controller\n\
         current-context: management\n"
    )
}

/// Standard base64 with padding (kubeconfig and Secret data).
pub fn base64_encode(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One `etcdfleet run` process.
pub struct ControllerProcess {
    child: Child,
    dir: tempfile::TempDir,
    /// Where `/metrics`, `/healthz`, `/readyz` and `/leader` answer.
    pub http: SocketAddr,
    pub name: String,
}

impl ControllerProcess {
    /// Starts `etcdfleet run --kubeconfig <kubeconfig> --metrics-address
    /// <free port> <args>`; `RUST_LOG` defaults to info.
    pub fn start(name: &str, kubeconfig_yaml: &str, args: &[&str]) -> Self {
        Self::start_with(name, kubeconfig_yaml, args, |_| {})
    }

    /// As [`ControllerProcess::start`], with a hook to adjust the command
    /// (environment, a wrapper such as `unshare`).
    pub fn start_with(
        name: &str,
        kubeconfig_yaml: &str,
        args: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Self {
        Self::start_binary(&etcdfleet_binary(), name, kubeconfig_yaml, args, adjust)
    }

    /// As [`ControllerProcess::start_with`], running `binary` (another
    /// release's build) instead of this build's.
    pub fn start_binary(
        binary: &Path,
        name: &str,
        kubeconfig_yaml: &str,
        args: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml).expect("write kubeconfig");
        let http: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("loopback address");
        let stdout = std::fs::File::create(dir.path().join("stdout.log")).expect("log file");
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("log file");
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--metrics-address")
            .arg(http.to_string())
            .args(args)
            .current_dir(repo())
            .env(
                "RUST_LOG",
                std::env::var("ETCDFLEET_PROCESS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("POD_NAME", name)
            .env_remove("KUBECONFIG")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        adjust(&mut cmd);
        // A test process killed from outside (a benchmark interrupted)
        // leaves no controller behind reconciling against nothing.
        // SAFETY: only an async-signal-safe call between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start etcdfleet run");
        ControllerProcess {
            child,
            dir,
            http,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Everything the process wrote so far (stdout, then stderr).
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("stdout.log"), read("stderr.log"))
    }

    /// Only what the process wrote to stdout (the log stream).
    pub fn stdout_bytes(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("stdout.log")).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log after `timeout`.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before logging {needle:?}:\n{}",
                    self.name,
                    self.log()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} did not log {needle:?} within {timeout:?}:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of a child this struct owns and has not reaped.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// The exit status, if the process ends within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` on the HTTP endpoint: (status code, body); `None` when
    /// nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path)
    }

    /// Waits until `GET path` answers `status`; returns the body.
    pub fn wait_for_status(&self, path: &str, status: u16, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            let got = self.get(path);
            if let Some((code, body)) = &got
                && *code == status
            {
                return body.clone();
            }
            last = got.or(last);
            if Instant::now() >= deadline {
                panic!(
                    "{} {path}: wanted {status} within {timeout:?}, last {last:?}:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET with a short timeout.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// A TCP server on loopback that accepts connections and never answers: an
/// API server that hangs.
pub struct SilentServer {
    pub addr: SocketAddr,
    _thread: std::thread::JoinHandle<()>,
}

impl SilentServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let thread = std::thread::spawn(move || {
            // Connections are kept open, unread, until the test process ends.
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                held.push(stream);
            }
        });
        SilentServer {
            addr,
            _thread: thread,
        }
    }
}
