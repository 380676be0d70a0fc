//! Recorded releases (`CHANGELOG.md`) as the upgrade tests use them: the
//! previous release's `etcdfleet` binary built from the commit it was cut
//! from, and that commit's manifests (`config/`), by
//! `hack/build-release.sh` (a git worktree under `target/releases/`, the
//! binary cached outside the clone keyed by the commit).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::etcd_harness::workspace_root;

/// One built release.
#[derive(Debug, Clone)]
pub struct BuiltRelease {
    /// `v0.1.0`.
    pub version: String,
    pub commit: String,
    /// Its `etcdfleet` binary.
    pub binary: PathBuf,
    /// A worktree of its commit (its `config/` is what it installed).
    pub worktree: PathBuf,
}

impl BuiltRelease {
    /// `<worktree>/<relative>`, e.g. `config/stages/dev`, for `kubectl -k`.
    pub fn path(&self, relative: &str) -> String {
        self.worktree.join(relative).display().to_string()
    }

    /// The image the release's controller names as its default seeder.
    pub fn image(&self) -> String {
        format!("etcdfleet/controller:{}", self.version)
    }
}

/// Builds (or finds cached) the release `which` (`previous`, or a version).
pub fn build_release(which: &str) -> Result<BuiltRelease> {
    let script = workspace_root().join("hack/build-release.sh");
    let out = Command::new(&script)
        .arg(which)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} {which} failed ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = stdout.lines().last().unwrap_or_default();
    let fields: Vec<&str> = last.split_whitespace().collect();
    let [version, commit, binary, worktree] = fields[..] else {
        bail!("unexpected output of {}: {stdout}", script.display());
    };
    Ok(BuiltRelease {
        version: version.to_string(),
        commit: commit.to_string(),
        binary: binary.into(),
        worktree: worktree.into(),
    })
}
