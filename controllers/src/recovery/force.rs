//! `etcdfleet force-new-cluster`: what the init container of a recovering
//! cluster's members runs before etcd starts. On the member a recovery
//! chose (and on no other), it starts etcd on its data with
//! `--force-new-cluster`, waits until that one-member cluster serves
//! (`/health` on the metrics listener), stops it, and writes a marker next
//! to the data directory naming the recovery. A restarted container that
//! finds the marker does nothing: `--force-new-cluster` runs once per
//! recovery, whatever restarts the pod or the controller go through. The
//! main container then starts etcd as always, on data whose membership is
//! that one member.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// What the init container is asked to do.
#[derive(Debug, Clone)]
pub struct ForceRequest {
    /// The pod this runs in (`$(POD_NAME)`).
    pub pod: String,
    /// The member the recovery chose (its pod name).
    pub member: String,
    /// The recovery (`status.lastRecovery.id`): the marker names it.
    pub recovery_id: String,
    /// etcd's `--data-dir`.
    pub data_dir: PathBuf,
    /// The etcd binary (a bare name is looked up in `PATH`, the etcd image's).
    pub etcd: PathBuf,
    /// etcd's command line as the member's etcd container runs it.
    pub etcd_args: Vec<String>,
    /// How long the forced etcd may take to serve.
    pub timeout: Duration,
}

/// What the init container did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForceOutcome {
    /// Another member's pod: nothing to do.
    NotChosen,
    /// The marker says this recovery's force already ran on this data.
    AlreadyForced,
    /// etcd ran with `--force-new-cluster`, served, and stopped.
    Forced { took: Duration },
}

#[derive(Debug, thiserror::Error)]
pub enum ForceError {
    #[error(
        "data directory {0} holds no etcd data: there is nothing to recover from on this volume"
    )]
    NoData(PathBuf),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("etcd with --force-new-cluster exited before it served ({0})")]
    Exited(std::process::ExitStatus),
    #[error("etcd with --force-new-cluster did not serve within {0:?}")]
    Timeout(Duration),
    #[error("no --listen-metrics-urls in etcd's arguments: cannot tell when it serves")]
    NoMetricsUrl,
}

/// The marker next to `data_dir` (outside it: etcd owns the directory).
pub fn marker_path(data_dir: &Path) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".etcdfleet-forced");
    data_dir.with_file_name(name)
}

/// Runs the force once on the chosen member (see the module doc).
pub async fn force(req: &ForceRequest) -> Result<ForceOutcome, ForceError> {
    if req.pod != req.member {
        return Ok(ForceOutcome::NotChosen);
    }
    let marker = marker_path(&req.data_dir);
    match tokio::fs::read_to_string(&marker).await {
        Ok(id) if id.trim() == req.recovery_id => return Ok(ForceOutcome::AlreadyForced),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ForceError::Io("reading the marker".into(), e)),
    }
    if !req.data_dir.join("member").is_dir() {
        return Err(ForceError::NoData(req.data_dir.clone()));
    }
    let health = health_address(&req.etcd_args).ok_or(ForceError::NoMetricsUrl)?;
    let started = Instant::now();
    let mut etcd = Command::new(&req.etcd)
        .args(&req.etcd_args)
        .arg("--force-new-cluster")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ForceError::Io(format!("starting {}", req.etcd.display()), e))?;
    let served = wait_until_serving(&mut etcd, &health, req.timeout).await;
    stop(&mut etcd).await;
    served?;
    write_marker(&marker, &req.recovery_id).await?;
    Ok(ForceOutcome::Forced {
        took: started.elapsed(),
    })
}

/// Polls `/health` until etcd says it is healthy (it has a leader, itself,
/// and serves a read), or it exits, or `timeout` passes.
async fn wait_until_serving(
    etcd: &mut tokio::process::Child,
    health: &str,
    timeout: Duration,
) -> Result<(), ForceError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = etcd.try_wait() {
            return Err(ForceError::Exited(status));
        }
        if healthy(health).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ForceError::Timeout(timeout));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops etcd gracefully (SIGTERM), killing it only if it does not end.
async fn stop(etcd: &mut tokio::process::Child) {
    if let Some(pid) = etcd.id() {
        // SAFETY: kill(2) on the pid of a child this process owns and has
        // not reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    if tokio::time::timeout(Duration::from_secs(30), etcd.wait())
        .await
        .is_err()
    {
        let _ = etcd.kill().await;
    }
}

/// Writes the marker under a temporary name, syncs and renames it.
async fn write_marker(marker: &Path, id: &str) -> Result<(), ForceError> {
    let io = |what: &'static str| move |e| ForceError::Io(what.to_string(), e);
    let tmp = marker.with_extension("partial");
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(io("creating the marker"))?;
    file.write_all(id.as_bytes())
        .await
        .map_err(io("writing the marker"))?;
    file.sync_all().await.map_err(io("syncing the marker"))?;
    tokio::fs::rename(&tmp, marker)
        .await
        .map_err(io("renaming the marker"))?;
    Ok(())
}

/// `host:port` of the first metrics listener, `0.0.0.0` read as loopback.
pub fn health_address(args: &[String]) -> Option<String> {
    let urls = args.iter().find_map(|a| {
        a.strip_prefix("--listen-metrics-urls=")
            .or_else(|| a.strip_prefix("-listen-metrics-urls="))
    })?;
    let first = urls.split(',').next()?.trim();
    let authority = first.strip_prefix("http://")?.split('/').next()?;
    Some(authority.replace("0.0.0.0", "127.0.0.1"))
}

/// Whether `GET /health` answers `"health":"true"`.
async fn healthy(address: &str) -> bool {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request = format!("GET /health HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(body.contains("\"health\":\"true\""))
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_address_is_the_metrics_listener_on_loopback() {
        let args = vec![
            "--name=m".to_string(),
            "--listen-metrics-urls=http://0.0.0.0:2381".to_string(),
        ];
        assert_eq!(health_address(&args).as_deref(), Some("127.0.0.1:2381"));
        let args = vec!["--listen-metrics-urls=http://127.8.9.1:2381,http://x:1".to_string()];
        assert_eq!(health_address(&args).as_deref(), Some("127.8.9.1:2381"));
        assert_eq!(health_address(&["--name=m".to_string()]), None);
    }

    #[tokio::test]
    async fn another_members_pod_and_a_marked_volume_do_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let req = ForceRequest {
            pod: "etcd-a-etcd-1".into(),
            member: "etcd-a-etcd-0".into(),
            recovery_id: "r1".into(),
            data_dir: data_dir.clone(),
            etcd: PathBuf::from("/nonexistent/etcd"),
            etcd_args: vec![],
            timeout: Duration::from_secs(1),
        };
        assert_eq!(force(&req).await.unwrap(), ForceOutcome::NotChosen);
        let chosen = ForceRequest {
            pod: "etcd-a-etcd-0".into(),
            ..req
        };
        assert!(matches!(force(&chosen).await, Err(ForceError::NoData(_))));
        std::fs::write(marker_path(&data_dir), "r1").unwrap();
        assert_eq!(force(&chosen).await.unwrap(), ForceOutcome::AlreadyForced);
        // Another recovery's marker does not stand for this one.
        std::fs::write(marker_path(&data_dir), "r0").unwrap();
        assert!(matches!(force(&chosen).await, Err(ForceError::NoData(_))));
    }
}
