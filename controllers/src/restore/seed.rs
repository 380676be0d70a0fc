//! `etcdfleet restore-seed`: what the init container of member 0 of a
//! restoring cluster runs before etcd starts. It fetches the snapshot object
//! (credentials from the environment, filled from the destination's Secret),
//! streams it to a file next to the data directory while hashing it, checks
//! size and SHA-256, and runs `etcdutl snapshot restore` (3.5+) or
//! `etcdctl snapshot restore` (3.4) into the data directory with the
//! member's name, initial cluster and peer URL. A marker next to the data
//! directory records which snapshot it came from, so a restarted init
//! container leaves its own work alone; a data directory with any other
//! content (a PVC kept from a deleted cluster) is refused, never mixed or
//! wiped (see `etcdfleet_api::restore::seed_action`).

use std::path::{Path, PathBuf};

use etcdfleet_api::ObjectStoreDestination;
use etcdfleet_api::restore::{
    DataDirState, ObjectCheck, RESTORE_MARKER, ResolvedRestore, SeedAction, judge_object,
    seed_action,
};
use tokio::process::Command;

use crate::store::{Credentials, Store, StoreError};

/// Environment variables the rendered init container sets from the
/// destination's Secret (`secretKeyRef`).
pub const ENV_ACCESS_KEY_ID: &str = "ETCDFLEET_RESTORE_ACCESS_KEY_ID";
pub const ENV_SECRET_ACCESS_KEY: &str = "ETCDFLEET_RESTORE_SECRET_ACCESS_KEY";
pub const ENV_SESSION_TOKEN: &str = "ETCDFLEET_RESTORE_SESSION_TOKEN";

/// Everything the seeder needs.
#[derive(Debug, Clone)]
pub struct SeedRequest {
    pub destination: ObjectStoreDestination,
    pub credentials: Option<Credentials>,
    pub object_key: String,
    pub sha256: String,
    pub size_bytes: Option<u64>,
    /// etcd's `--data-dir`.
    pub data_dir: PathBuf,
    /// `--name`, `--initial-cluster`, `--initial-advertise-peer-urls`,
    /// `--initial-cluster-token` of the member being seeded.
    pub name: String,
    pub initial_cluster: String,
    pub initial_advertise_peer_urls: String,
    pub initial_cluster_token: String,
    /// The member's `--initial-cluster-state`: only a member bootstrapping a
    /// `new` cluster is seeded; one that joins an `existing` cluster (every
    /// member added later, or member 0 replaced after bootstrap) starts as
    /// etcd decides, with nothing fetched.
    pub initial_cluster_state: Option<String>,
    /// `etcdutl` (3.5+) or `etcdctl` (3.4; run with `ETCDCTL_API=3`); a bare
    /// name is looked up in `PATH` (the etcd image's).
    pub restore_tool: PathBuf,
}

/// What the seeder did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedOutcome {
    Restored {
        size: u64,
    },
    /// The data directory already holds this snapshot's restore.
    AlreadyRestored,
    /// The member joins an existing cluster: nothing to seed.
    JoiningExisting,
}

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(
        "data directory {0} holds data that was not restored from this snapshot (a volume kept \
         from another cluster?); refusing to mix or overwrite it: delete the PVC to restore"
    )]
    ForeignData(PathBuf),
    #[error("{reason}: {message}")]
    Snapshot {
        reason: &'static str,
        message: String,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

impl SeedError {
    /// The seeder's exit code: 2 when the object is not the snapshot the
    /// backup recorded (gone, another size, another SHA-256), 3 when the
    /// restore tool refused it, 1 for everything that says nothing of the
    /// snapshot (the store unreachable, credentials, the volume). A restore
    /// drill tells a backup that does not restore from a drill that could
    /// not run by it.
    pub fn exit_code(&self) -> u8 {
        use etcdfleet_api::restore::reason;
        match self {
            SeedError::Snapshot { reason: r, .. }
                if [
                    reason::OBJECT_NOT_FOUND,
                    reason::SIZE_MISMATCH,
                    reason::CHECKSUM_MISMATCH,
                ]
                .contains(r) =>
            {
                OBJECT_CHANGED_EXIT
            }
            SeedError::Tool { .. } => RESTORE_REFUSED_EXIT,
            _ => 1,
        }
    }
}

/// [`SeedError::exit_code`] of an object that is not the recorded snapshot.
pub const OBJECT_CHANGED_EXIT: u8 = 2;
/// [`SeedError::exit_code`] of a snapshot the restore tool refused.
pub const RESTORE_REFUSED_EXIT: u8 = 3;

/// Copies the running executable to `dest` (mode 0755): the first init
/// container of a restoring member runs this from the controller's image, so
/// the seeder can run in the etcd image next to its restore tool (etcd images
/// carry no shell and no `cp`; the etcdfleet binary is self-contained).
pub fn install_self(dest: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe()?;
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Written under a temporary name and renamed, so a container restarted
    // mid-copy never finds a truncated binary under the final name.
    let tmp = dest.with_extension("partial");
    let bytes = std::fs::copy(&me, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, dest)?;
    Ok(bytes)
}

/// The marker next to `data_dir` (outside it: etcd owns the directory).
pub fn marker_path(data_dir: &Path) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(RESTORE_MARKER);
    data_dir.with_file_name(name)
}

/// Reads what `data_dir` holds.
pub fn inspect(data_dir: &Path) -> std::io::Result<DataDirState> {
    let empty = match std::fs::read_dir(data_dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e),
    };
    if empty {
        return Ok(DataDirState::Empty);
    }
    match std::fs::read_to_string(marker_path(data_dir)) {
        Ok(sha) => Ok(DataDirState::RestoredFrom(sha.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DataDirState::Foreign),
        Err(e) => Err(e),
    }
}

/// Seeds `req.data_dir` from the snapshot, or leaves it if already done.
pub async fn seed(req: &SeedRequest) -> Result<SeedOutcome, SeedError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |e| SeedError::Io(what.clone(), e)
    };
    if req.initial_cluster_state.as_deref() == Some("existing") {
        return Ok(SeedOutcome::JoiningExisting);
    }
    let state = inspect(&req.data_dir).map_err(io("reading the data directory"))?;
    match seed_action(&state, &req.sha256) {
        SeedAction::AlreadyDone => return Ok(SeedOutcome::AlreadyRestored),
        SeedAction::RefuseForeign => return Err(SeedError::ForeignData(req.data_dir.clone())),
        SeedAction::Restore => {}
    }
    let parent = req
        .data_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    tokio::fs::create_dir_all(&parent)
        .await
        .map_err(io("creating the data directory's parent"))?;
    let download = parent.join(".etcdfleet-restore.db");
    let store = Store::open(&req.destination, req.credentials.as_ref())?;
    let mut file = tokio::fs::File::create(&download)
        .await
        .map_err(io("creating the download file"))?;
    let check = match store.read_through(&req.object_key, Some(&mut file)).await {
        Ok((size, sha256)) => ObjectCheck::Read { size, sha256 },
        Err(StoreError::NotFound(_)) => ObjectCheck::NotFound,
        Err(e) => ObjectCheck::Unreadable(e.to_string()),
    };
    drop(file);
    let expected = ResolvedRestore {
        destination: req.destination.clone(),
        object_key: req.object_key.clone(),
        sha256: req.sha256.clone(),
        size_bytes: req.size_bytes,
        etcd_version: None,
    };
    if let Err(r) = judge_object(&expected, &check) {
        let _ = tokio::fs::remove_file(&download).await;
        return Err(SeedError::Snapshot {
            reason: r.reason,
            message: r.message,
        });
    }
    let size = match check {
        ObjectCheck::Read { size, .. } => size,
        _ => 0,
    };
    // The restore tool creates the data directory and refuses an existing one.
    match tokio::fs::remove_dir(&req.data_dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(SeedError::Io("removing the empty data directory".into(), e)),
    }
    let mut cmd = Command::new(&req.restore_tool);
    let tool_name = req
        .restore_tool
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if tool_name.starts_with("etcdctl") {
        cmd.env("ETCDCTL_API", "3");
    }
    let output = cmd
        .args(["snapshot", "restore"])
        .arg(&download)
        .arg(format!("--data-dir={}", req.data_dir.display()))
        .arg(format!("--name={}", req.name))
        .arg(format!("--initial-cluster={}", req.initial_cluster))
        .arg(format!(
            "--initial-advertise-peer-urls={}",
            req.initial_advertise_peer_urls
        ))
        .arg(format!(
            "--initial-cluster-token={}",
            req.initial_cluster_token
        ))
        .output()
        .await
        .map_err(io("running the restore tool"))?;
    let _ = tokio::fs::remove_file(&download).await;
    if !output.status.success() {
        // A failed restore leaves nothing half-made for the next attempt.
        let _ = tokio::fs::remove_dir_all(&req.data_dir).await;
        return Err(SeedError::Tool {
            tool: req.restore_tool.display().to_string(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    tokio::fs::write(marker_path(&req.data_dir), &req.sha256)
        .await
        .map_err(io("writing the restore marker"))?;
    Ok(SeedOutcome::Restored { size })
}
