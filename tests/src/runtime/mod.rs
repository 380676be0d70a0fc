//! A workload runtime: plays the StatefulSet controller and the kubelet for
//! one fake workload cluster, so end-to-end tests run real etcd processes
//! from the objects the controller writes.
//!
//! [`WorkloadRuntime::sync`] is level-triggered and idempotent; tests call it
//! between reconciles (or run it in the background with
//! [`WorkloadRuntime::spawn_background`]). One call:
//!
//! 1. **StatefulSet controller**: pods `<sts>-<ordinal>` for ordinals
//!    `0..replicas` are created from `spec.template` (owner reference to the
//!    StatefulSet, `hostname`/`subdomain` set, a `persistentVolumeClaim`
//!    volume per claim template), one at a time under `OrderedReady` (waiting
//!    for lower ordinals to be ready), all at once under `Parallel`. PVCs
//!    `<template>-<pod>` are created when missing and never deleted (PVC
//!    retention). Pods with ordinal ≥ replicas are deleted, highest first.
//!    Pods at its names that match its selector and have no controller (a
//!    StatefulSet deleted with `propagationPolicy: Orphan`) are adopted.
//!    `updateStrategy: OnDelete` never replaces a pod because the template
//!    changed; `RollingUpdate` (the Kubernetes default) replaces the highest
//!    out-of-date pod at or above the partition, one at a time, while all
//!    pods are ready. Status (replicas, readyReplicas, currentReplicas,
//!    updatedReplicas, revisions, observedGeneration) is written through the
//!    status subresource.
//! 2. **kubelet**: each Pod's first container runs as a real process. The
//!    image maps onto an etcd binary through an [`ImageTable`] (unknown image:
//!    the pod stays `Pending`, waiting `ErrImagePull`); `command[0]` must be
//!    `etcd` or a path ending in `/etcd` (no command: the image entrypoint,
//!    etcd). Env supports `value`, `fieldRef` (`metadata.name`,
//!    `metadata.namespace`, `metadata.uid`, `metadata.labels['k']`,
//!    `metadata.annotations['k']`, `status.podIP`, `status.hostIP`,
//!    `spec.nodeName`), `configMapKeyRef`, `secretKeyRef` and `envFrom`, read
//!    from the workload API at each container start like kubelet; `$(VAR)` in
//!    env values, command and args is expanded exactly like Kubernetes.
//!    Volumes: `persistentVolumeClaim` (a host directory per PVC, surviving
//!    pod restarts and recreation, removed when the PVC object is gone and no
//!    pod uses it), `configMap` and `secret` (keys as files, `items`
//!    honoured), `emptyDir` (per pod). Each `volumeMount` is bind-mounted at
//!    its `mountPath` inside a private mount namespace (`unshare -m`); the
//!    mount point is created on the host as an empty directory if missing.
//!    A process that exits is restarted with backoff (200 ms doubling to 2 s)
//!    and `restartCount` grows; a deleted Pod's process gets SIGTERM, then
//!    SIGKILL after 5 s. Pod status (phase, podIP, conditions,
//!    containerStatuses with `ready` = process alive and its client port
//!    accepts TCP) is written through the status subresource when it changes.
//! 3. **pod network**: each pod gets a stable IP (per namespace/name, reused
//!    when the pod is recreated) from the runtime's own random
//!    `127.X.Y.0/24` block. A hosts file shared by all pods of this cluster
//!    maps `<pod>.<subdomain>.<namespace>.svc[.cluster.local]` and `<pod>`
//!    to the pod IP and is bind-mounted over `/etc/hosts` of every pod
//!    process (updated in place, keeping its inode).
//!
//! **The one substitution.** Pods on this machine share one network
//! namespace, so a pod cannot own `0.0.0.0`. The runtime therefore rewrites
//! host `0.0.0.0` in the URLs of the `--listen-client-urls`,
//! `--listen-peer-urls` and `--listen-metrics-urls` arguments to the pod's
//! IP. Nothing else of a pod's configuration is changed.
//!
//! **Readiness** is the container's HTTP readiness probe, run on every sync
//! at the pod's IP (ready on 2xx/3xx within 500 ms); a container without one
//! is ready when alive and its client port accepts TCP.
//!
//! **Init containers** run first, in order, one at a time, as real processes
//! with the pod's env and mounts (a failure backs off, `Init:CrashLoopBackOff`).
//! Their command resolves like the kubelet's would: a path inside one of the
//! container's volumes (a binary an earlier init container wrote into an
//! `emptyDir`) runs from there; otherwise its basename must be a command the
//! image table maps for the image. The commands an image provides are first
//! on the container's `PATH` (as the image's own `PATH`), so a program can run
//! another tool of its image by name.
//!
//! Not emulated: liveness and startup probes, resources, security contexts,
//! read-only mounts, sidecar containers (only the first container of
//! `containers` runs), any main command other than etcd.
//!
//! **Node mode** ([`WorkloadRuntime::for_nodes`]) is the kubelet of a real
//! control plane's Nodes (`crate::control_plane`): the real
//! kube-controller-manager plays the StatefulSet controller, so the runtime
//! only runs the pods the scheduler bound to its Nodes. A pod's
//! `persistentVolumeClaim` volume is the host path of the PV its claim is
//! bound to (the host-path provisioner's directory), so data outlives the pod
//! as on a node; a `projected` volume (the ServiceAccount token admission
//! adds) gets its ConfigMap and downward-API files and an empty token; startup,
//! liveness and readiness probes run on their schedule ([`probes`]); a pod
//! being deleted gets SIGTERM, SIGKILL after its grace period, and is then
//! deleted for good (grace 0, UID precondition) as the kubelet does.
//!
//! All processes die when the runtime is dropped, on [`WorkloadRuntime::shutdown`],
//! and when the test process dies (`PR_SET_PDEATHSIG`). Logs are per pod
//! under [`WorkloadRuntime::log_dir`]; if the runtime is dropped while the
//! test panics, the directory is kept and its path printed.
//!
//! **Rooms.** [`WorkloadRuntime`] here is the handle tests hold; what it
//! plays lives one room each: `statefulset` (the StatefulSet controller),
//! `resize` (volume expansion: a claim's capacity follows its request, at
//! once or at the next pod start, [`ResizeMode`]),
//! `kubelet` (the pod lifecycle), `env` (env and the downward API),
//! `volumes`, `network` (pod IPs and the hosts file), `images` (the
//! [`ImageTable`]) and [`probes`]; `state` holds what they share.

pub mod probes;

mod env;
mod images;
mod kubelet;
mod network;
mod resize;
mod state;
mod statefulset;
mod volumes;

pub use env::expand_k8s_vars;
pub use images::{CONTROLLER_IMAGE_REPOSITORY, ImageTable, SEEDER_IMAGE};
pub use state::ResizeMode;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::Api;

use crate::etcd_harness::EtcdProcess;
use kubelet::stop_all;
use network::{allocate_block, hosts_base};
use state::{Inner, Mode, PodRun, State};

/// One fake workload cluster's StatefulSet controller + kubelet. See the module docs.
pub struct WorkloadRuntime {
    inner: Arc<Inner>,
}

/// A background sync loop; stopped when dropped.
pub struct BackgroundSync {
    task: tokio::task::JoinHandle<()>,
}

impl BackgroundSync {
    pub fn stop(self) {}
}

impl Drop for BackgroundSync {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WorkloadRuntime {
    /// A runtime for the workload cluster at `server_url`, whose API is `client`.
    pub fn new(server_url: &str, client: Client, images: ImageTable) -> Self {
        Self::try_new(server_url, client, images).expect("creating a workload runtime")
    }

    /// Like [`new`](Self::new), returning setup errors.
    pub fn try_new(server_url: &str, client: Client, images: ImageTable) -> Result<Self> {
        Self::with_mode(server_url, client, images, Mode::Emulated)
    }

    /// The kubelet of `nodes` of a real control plane (node mode, see the
    /// module docs). The Nodes are registered by the caller.
    pub fn for_nodes(
        server_url: &str,
        client: Client,
        images: ImageTable,
        nodes: &[String],
    ) -> Result<Self> {
        let nodes = nodes.iter().cloned().collect();
        Self::with_mode(server_url, client, images, Mode::Nodes(nodes))
    }

    fn with_mode(server_url: &str, client: Client, images: ImageTable, mode: Mode) -> Result<Self> {
        let (block, lock) = allocate_block()?;
        let dir = tempfile::Builder::new()
            .prefix("etcdfleet-runtime-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        fs::create_dir_all(root.join("logs"))?;
        fs::create_dir_all(root.join("pvc"))?;
        fs::create_dir_all(root.join("pods"))?;
        let hosts_file = root.join("hosts");
        let base = hosts_base();
        fs::write(&hosts_file, &base)?;
        Ok(WorkloadRuntime {
            inner: Arc::new(Inner {
                server_url: server_url.to_string(),
                client,
                images,
                mode,
                block,
                _block_lock: lock,
                dir: Some(dir),
                root,
                hosts_file,
                names: Mutex::new(BTreeMap::new()),
                host_volumes: Mutex::new(BTreeSet::new()),
                exiting: Mutex::new(Duration::ZERO),
                resize: Mutex::new(ResizeMode::default()),
                unprovisioned: Mutex::new(BTreeSet::new()),
                state: tokio::sync::Mutex::new(State {
                    hosts_content: base,
                    ..State::default()
                }),
            }),
        })
    }

    pub fn server_url(&self) -> &str {
        &self.inner.server_url
    }

    /// The runtime's loopback block, e.g. `127.23.7.0/24`.
    pub fn ip_block(&self) -> String {
        let (x, y) = self.inner.block;
        format!("127.{x}.{y}.0/24")
    }

    /// How long the processes of deleted pods took to exit after SIGTERM,
    /// summed over the runtime's life: time no controller can shorten, which
    /// the operations bench sets apart.
    pub fn time_spent_exiting(&self) -> Duration {
        *self.inner.exiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where pod logs, PVC directories and the hosts file live.
    pub fn log_dir(&self) -> PathBuf {
        self.inner.root.join("logs")
    }

    /// The host directory behind PVC `namespace/name`.
    /// The hosts file every pod process sees as `/etc/hosts` (a process
    /// started beside the pods resolves their names with it).
    pub fn hosts_file(&self) -> PathBuf {
        self.inner.hosts_file.clone()
    }

    pub fn pvc_dir(&self, namespace: &str, pvc: &str) -> PathBuf {
        self.inner.pvc_dir(namespace, pvc)
    }

    /// The last `lines` lines of every pod's log, each under its name (for
    /// failure messages).
    pub fn all_pod_logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for entry in fs::read_dir(self.log_dir()).into_iter().flatten().flatten() {
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            out.push_str(&format!(
                "\n--- {} ---\n{tail}",
                entry.file_name().to_string_lossy()
            ));
        }
        out
    }

    /// The last `lines` lines of a pod's log (all its containers' runs).
    pub fn pod_log_tail(&self, namespace: &str, pod: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.inner.log_file(namespace, pod)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// One pass of StatefulSet controller + kubelet (see the module docs).
    pub async fn sync(&self) -> Result<()> {
        self.inner.sync().await
    }

    /// Like [`spawn_background`](Self::spawn_background), but a tick is
    /// skipped while `version` (the workload API's resourceVersion) has not
    /// moved since a sync that found every pod running and ready; a sync
    /// still runs at least every `idle`. For fleets of hundreds of runtimes,
    /// where a sync of each every tick would load the machine more than the
    /// controller under test does. A process that dies is noticed within `idle`.
    pub fn spawn_background_on_change(
        &self,
        interval: Duration,
        idle: Duration,
        version: impl Fn() -> u64 + Send + 'static,
    ) -> BackgroundSync {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            let mut synced: Option<(u64, bool)> = None;
            let mut last_sync = Instant::now();
            loop {
                let Some(inner) = weak.upgrade() else { break };
                let now = version();
                let quiet = synced == Some((now, true)) && last_sync.elapsed() < idle;
                if !quiet {
                    last_sync = Instant::now();
                    let result = inner.sync().await;
                    tracing::trace!(server = %inner.server_url, took = ?last_sync.elapsed(), "workload runtime sync");
                    match result {
                        Ok(()) => synced = Some((now, inner.state.lock().await.settled)),
                        Err(e) => {
                            synced = None;
                            tracing::warn!(server = %inner.server_url, error = %e, "workload runtime sync failed");
                        }
                    }
                }
                drop(inner);
                tokio::time::sleep(interval).await;
            }
        });
        BackgroundSync { task }
    }

    /// Runs [`sync`](Self::sync) every `interval` until the handle is dropped
    /// or the runtime is dropped. Errors are logged and retried.
    pub fn spawn_background(&self, interval: Duration) -> BackgroundSync {
        // With no idle allowance every tick syncs.
        self.spawn_background_on_change(interval, Duration::ZERO, || 0)
    }

    /// Syncs until every StatefulSet has all its replicas ready (and its
    /// status says so), or fails after `timeout` with the pods' log tails.
    pub async fn wait_statefulsets_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.sync().await?;
            let not_ready = self.inner.statefulsets_not_ready().await?;
            if not_ready.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut logs = String::new();
                for (ns, pod) in self.inner.state.lock().await.pods.keys() {
                    logs.push_str(&format!(
                        "\n--- {ns}/{pod} ---\n{}",
                        self.pod_log_tail(ns, pod, 15)
                    ));
                }
                bail!("statefulsets not ready after {timeout:?}: {not_ready:?}{logs}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The IP a pod's hostnames resolve to in this cluster.
    /// How claims that grow get their room from now on (emulated mode).
    pub fn set_resize(&self, mode: ResizeMode) {
        *self.inner.resize.lock().expect("lock") = mode;
    }

    /// Whether claims of StorageClass `class` get a volume from now on
    /// (emulated mode): an unprovisioned claim stays `Pending`, with a
    /// `ProvisioningFailed` event, and its pod waits.
    pub fn set_provisioning(&self, class: &str, provisions: bool) {
        let mut classes = self.inner.unprovisioned.lock().expect("lock");
        match provisions {
            true => classes.remove(class),
            false => classes.insert(class.to_string()),
        };
    }

    pub fn resolve(&self, host: &str) -> Option<Ipv4Addr> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.inner.names.lock().expect("lock").get(&host).copied()
    }

    /// The IP of pod `namespace/pod` (assigned once the runtime saw the pod).
    pub fn pod_ip(&self, namespace: &str, pod: &str) -> Option<Ipv4Addr> {
        self.resolve(&format!("{pod}.{namespace}.pod"))
    }

    /// The executable a pod's running process is (its `/proc/<pid>/exe`: the
    /// runtime execs the binary its image maps to), if it runs.
    pub async fn pod_executable(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        let state = self.inner.state.lock().await;
        let run = state.pods.get(&(namespace.to_string(), pod.to_string()))?;
        let process = run.process.as_ref().filter(|p| p.is_running())?;
        fs::read_link(format!("/proc/{}/exe", process.pid())).ok()
    }

    /// SIGKILLs a pod's process; the next syncs restart it (restartCount + 1).
    pub async fn kill_pod_process(&self, namespace: &str, pod: &str) -> Result<()> {
        let mut state = self.inner.state.lock().await;
        let run = state
            .pods
            .get_mut(&(namespace.to_string(), pod.to_string()))
            .ok_or_else(|| anyhow!("pod {namespace}/{pod} is not known to the runtime"))?;
        let process = run
            .process
            .as_mut()
            .ok_or_else(|| anyhow!("pod {namespace}/{pod} has no process"))?;
        process.kill().await;
        Ok(())
    }

    /// A lost disk: kills every process using PVC `namespace/pvc`, deletes the
    /// contents of its directory while they are down, and lets the kubelet
    /// restart them on the empty volume.
    pub async fn wipe_pvc(&self, namespace: &str, pvc: &str) -> Result<()> {
        let key = (namespace.to_string(), pvc.to_string());
        let mut state = self.inner.state.lock().await;
        for run in state.pods.values_mut() {
            if run.claims.contains(&key)
                && let Some(p) = run.process.as_mut()
            {
                p.kill().await;
            }
        }
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.inner.client.clone(), namespace)
            .get(pvc)
            .await?;
        let dir = self
            .inner
            .claim_dir(namespace, &claim)
            .await?
            .ok_or_else(|| anyhow!("PVC {namespace}/{pvc} is not bound"))?;
        if dir.is_dir() {
            for entry in fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    fs::remove_dir_all(&path)?;
                } else {
                    fs::remove_file(&path)?;
                }
            }
        }
        Ok(())
    }

    /// How many pod processes are alive.
    pub async fn process_count(&self) -> usize {
        let mut state = self.inner.state.lock().await;
        let mut count = 0;
        for run in state.pods.values_mut() {
            if run.process.as_ref().is_some_and(EtcdProcess::is_running) {
                count += 1;
            }
        }
        count
    }

    /// Stops every process (SIGTERM, SIGKILL after the grace period); later
    /// syncs fail.
    pub async fn shutdown(&self) {
        let mut state = self.inner.state.lock().await;
        state.shut_down = true;
        let runs: Vec<PodRun> = std::mem::take(&mut state.pods).into_values().collect();
        stop_all(runs).await;
    }
}
