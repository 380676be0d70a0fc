//! Where the etcd releases the suite tests against are on this machine:
//! 3.4.23 (Debian) and 3.5.1 (PyPI), and the 3.5, 3.6 and 3.7 patches built
//! from `hack/upstream` under `.tools/`; which release each role runs, and
//! the loud `SKIPPED:` (or, under `ETCDFLEET_REQUIRE_ETCD=1`, the panic) when
//! one is missing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, anyhow};

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

/// The binaries of two versions, as [`require_etcd`] gives each (a test
/// of a version change needs both).
pub fn require_both(a: EtcdVersion, b: EtcdVersion) -> Option<(EtcdBinary, EtcdBinary)> {
    Some((require_etcd(a)?, require_etcd(b)?))
}
