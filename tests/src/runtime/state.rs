//! What one runtime holds, shared by its rooms: [`Inner`] (the workload
//! API client, the image table, what the runtime plays, its directories and
//! its hosts file) and [`State`] (the pods it runs and what the kubelet
//! knows about each, their IPs and hosts lines, the PVC directories it
//! made). Each room adds its methods to `Inner` in its own file;
//! [`Inner::sync`] is the one pass that runs them in order.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde_json::Value;

use super::images::ImageTable;
use super::probes::Probes;
use crate::etcd_harness::EtcdProcess;

pub(super) type PodKey = (String, String);

/// Why a container is not running (container state `waiting`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Waiting {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Waiting {
    pub(super) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Waiting {
            reason,
            message: message.into(),
        }
    }
}

/// What the kubelet knows about one pod (one UID).
pub(super) struct PodRun {
    pub(super) uid: String,
    pub(super) pod_dir: PathBuf,
    pub(super) log_file: PathBuf,
    pub(super) process: Option<EtcdProcess>,
    pub(super) pod_started: String,
    pub(super) container_started: Option<(Instant, String)>,
    pub(super) ever_started: bool,
    pub(super) restart_count: i32,
    pub(super) backoff: Duration,
    pub(super) next_start: Instant,
    pub(super) last_terminated: Option<Value>,
    pub(super) waiting: Option<Waiting>,
    pub(super) client_addr: Option<SocketAddr>,
    /// The container's HTTP readiness probe at the pod's IP (address, path),
    /// evaluated as the kubelet does; without one, ready means the client
    /// port accepts connections.
    pub(super) readiness_http: Option<(SocketAddr, String)>,
    pub(super) claims: Vec<PodKey>,
    /// Init containers that exited 0, in order (the kubelet never reruns
    /// them for this pod UID).
    pub(super) init_done: usize,
    pub(super) init_process: Option<EtcdProcess>,
    /// Node mode: the running container's probes.
    pub(super) probes: Option<Probes>,
    /// The status last written for this pod UID (written again only on change).
    pub(super) written: Option<PodStatus>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) pods: BTreeMap<PodKey, PodRun>,
    pub(super) ips: BTreeMap<PodKey, Ipv4Addr>,
    /// hosts-file line per pod, kept for pods that no longer exist so the
    /// file only grows (appends keep concurrent readers consistent).
    pub(super) host_lines: BTreeMap<Ipv4Addr, String>,
    pub(super) hosts_content: String,
    pub(super) pvc_dirs: BTreeSet<PodKey>,
    pub(super) shut_down: bool,
    /// The last sync found every pod running and ready: with no API change
    /// since, another sync would do nothing but probe.
    pub(super) settled: bool,
}

/// How a grown claim's file system grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResizeMode {
    /// At once, while the pod runs (drivers with online expansion).
    #[default]
    Online,
    /// Only when a pod using the claim starts again: until then the claim
    /// says `FileSystemResizePending` (drivers without online expansion).
    AtPodStart,
}

/// What a runtime plays (see the module docs).
#[derive(Debug, Clone)]
pub(super) enum Mode {
    /// StatefulSet controller and kubelet of every pod, for the in-memory API.
    Emulated,
    /// The kubelet of the pods bound to these Nodes of a real control plane.
    Nodes(BTreeSet<String>),
}

pub(super) struct Inner {
    pub(super) server_url: String,
    pub(super) client: Client,
    pub(super) images: ImageTable,
    pub(super) mode: Mode,
    pub(super) block: (u8, u8),
    /// Held for the runtime's life: marks the block taken for other test processes.
    pub(super) _block_lock: TcpListener,
    pub(super) dir: Option<tempfile::TempDir>,
    pub(super) root: PathBuf,
    pub(super) hosts_file: PathBuf,
    pub(super) names: Mutex<BTreeMap<String, Ipv4Addr>>,
    pub(super) state: tokio::sync::Mutex<State>,
    /// Node mode: the PV host paths (the host-path provisioner's
    /// directories) its pods mounted, removed with the runtime: the control
    /// plane that would delete them stops with the test.
    pub(super) host_volumes: Mutex<BTreeSet<PathBuf>>,
    /// How long the processes of deleted pods took to exit after SIGTERM,
    /// summed (etcd's own shutdown: from 20 ms to several seconds).
    pub(super) exiting: Mutex<Duration>,
    /// How a grown claim's file system grows (emulated mode).
    pub(super) resize: Mutex<ResizeMode>,
    /// StorageClasses whose claims stay unbound (emulated mode).
    pub(super) unprovisioned: Mutex<BTreeSet<String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Processes die with their EtcdProcess (State drops after this).
        // A failing test keeps the pod logs (kilobytes); its volumes (etcd
        // data, 60+ MiB per member for the preallocated WAL) go, or a run with
        // many failures fills the disk. `ETCDFLEET_KEEP_PODS=1` keeps both,
        // after a passing run too.
        let keep_all = std::env::var_os("ETCDFLEET_KEEP_PODS").is_some();
        if (std::thread::panicking() || keep_all)
            && let Some(dir) = self.dir.take()
        {
            let path = dir.keep();
            let kept = if keep_all {
                "pod logs and volumes"
            } else {
                let _ = fs::remove_dir_all(path.join("pvc"));
                "pod logs"
            };
            eprintln!(
                "workload runtime {}: {kept} kept in {}",
                self.server_url,
                path.display()
            );
            if keep_all {
                return;
            }
        }
        for volume in self.host_volumes.lock().expect("lock").iter() {
            let _ = fs::remove_dir_all(volume);
        }
    }
}

impl Inner {
    pub(super) async fn sync(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        if state.shut_down {
            bail!("workload runtime {} was shut down", self.server_url);
        }
        if let Mode::Nodes(_) = self.mode {
            return self.run_kubelet(&mut state).await;
        }
        self.run_statefulsets().await?;
        self.run_provisioner().await?;
        self.run_resizer().await?;
        self.run_kubelet(&mut state).await?;
        self.update_statefulset_status().await?;
        self.collect_pvc_dirs(&mut state).await?;
        Ok(())
    }
}

pub(super) fn now_rfc3339() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(super) fn is_status_code(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}
