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

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcdfleet_api::version::image_repository;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, PodStatus, Secret, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::etcd_harness::{EtcdBinary, EtcdProcess, EtcdVersion, ProcessSpec, random_u64};

pub mod probes;
use probes::Probes;

const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A container that ran this long restarts with the initial backoff again.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);
const TERMINATION_GRACE: Duration = Duration::from_secs(5);
const READY_PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// etcd answers its serializable `/health` locally; a member without a
/// leader answers 503 at once.
const HTTP_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
const REVISION_LABEL: &str = "controller-revision-hash";

/// The image the test world's controller names as its seeder image (the
/// controller's own image): [`ImageTable::installed`] maps its `etcdfleet`
/// command onto the built etcdfleet binary.
pub const SEEDER_IMAGE: &str = "etcdfleet/controller:test";

/// The repository of the controller's image, as the shipped manifests name it.
pub const CONTROLLER_IMAGE_REPOSITORY: &str = "etcdfleet/controller";

/// Maps container images onto local binaries.
#[derive(Debug, Clone, Default)]
pub struct ImageTable {
    rules: Vec<(ImageMatch, PathBuf)>,
    /// Non-etcd commands an image provides (init containers): `(image, command
    /// basename) -> binary`.
    commands: Vec<(ImageMatch, String, PathBuf)>,
}

#[derive(Debug, Clone)]
enum ImageMatch {
    Exact(String),
    /// Any tag of this repository (`etcdfleet/controller`).
    Repository(String),
    Tag(String),
}

impl ImageMatch {
    /// How specific a match is: exact rules win over repository rules, which
    /// win over tag rules.
    fn rank(&self, image: &str) -> Option<u8> {
        match self {
            ImageMatch::Exact(i) if i == image => Some(0),
            ImageMatch::Repository(r) if image_repository(image) == r => Some(1),
            ImageMatch::Tag(t) if image_tag(image) == Some(t.as_str()) => Some(2),
            _ => None,
        }
    }
}

impl ImageTable {
    /// A table that maps nothing.
    pub fn empty() -> Self {
        ImageTable::default()
    }

    /// The etcd versions installed for the suite, by tag, for any repository:
    /// `v3.4.23` / `3.4.23` / `3.4.23-0` and `v3.5.1` / `3.5.1` / `3.5.1-0`.
    pub fn installed() -> Self {
        let v34 = EtcdBinary::locate(EtcdVersion::V3_4).etcd;
        let v35 = EtcdBinary::locate(EtcdVersion::V3_5).etcd;
        let mut table = ImageTable::empty();
        let b34 = EtcdBinary::locate(EtcdVersion::V3_4);
        let b35 = EtcdBinary::locate(EtcdVersion::V3_5);
        for tag in ["v3.4.23", "3.4.23", "3.4.23-0"] {
            table = table
                .with_tag(tag, &v34)
                .with_tag_command(tag, "etcdctl", &b34.etcdctl);
        }
        for tag in ["v3.5.1", "3.5.1", "3.5.1-0"] {
            table = table
                .with_tag(tag, &v35)
                .with_tag_command(tag, "etcdctl", &b35.etcdctl);
            if let Some(etcdutl) = &b35.etcdutl {
                table = table.with_tag_command(tag, "etcdutl", etcdutl);
            }
        }
        for built in crate::etcd_harness::built_etcds() {
            let version = built.version_string();
            for tag in [
                format!("v{version}"),
                version.clone(),
                format!("{version}-0"),
            ] {
                table = table
                    .with_tag(&tag, &built.etcd)
                    .with_tag_command(&tag, "etcdctl", &built.etcdctl)
                    .with_tag_command(&tag, "etcdutl", &built.etcdutl);
            }
        }
        table.with_seeder()
    }

    /// Maps exactly `image` (e.g. `gcr.io/etcd-development/etcd:v3.5.1`).
    pub fn with_image(mut self, image: &str, binary: impl Into<PathBuf>) -> Self {
        self.rules
            .push((ImageMatch::Exact(image.to_string()), binary.into()));
        self
    }

    /// Maps any image with this tag.
    pub fn with_tag(mut self, tag: &str, binary: impl Into<PathBuf>) -> Self {
        self.rules
            .push((ImageMatch::Tag(tag.to_string()), binary.into()));
        self
    }

    /// Maps the command `command` (its basename, e.g. `etcdutl`) run from
    /// exactly `image` onto a local binary (init containers).
    pub fn with_command(mut self, image: &str, command: &str, binary: impl Into<PathBuf>) -> Self {
        self.commands.push((
            ImageMatch::Exact(image.to_string()),
            command.to_string(),
            binary.into(),
        ));
        self
    }

    /// Like [`with_command`](Self::with_command), for any image with this tag.
    pub fn with_tag_command(
        mut self,
        tag: &str,
        command: &str,
        binary: impl Into<PathBuf>,
    ) -> Self {
        self.commands.push((
            ImageMatch::Tag(tag.to_string()),
            command.to_string(),
            binary.into(),
        ));
        self
    }

    /// The binary behind `command` (any path; its basename is matched) in
    /// `image`, if mapped and present on disk. Exact rules win over tag rules.
    pub fn resolve_command(&self, image: &str, command: &str) -> Option<PathBuf> {
        let name = Path::new(command).file_name()?.to_str()?;
        self.commands
            .iter()
            .filter(|(_, c, _)| c == name)
            .filter_map(|(m, _, p)| Some((m.rank(image)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p.clone())
            .filter(|p| p.is_file())
    }

    /// Every command `image` provides (`etcd` and the mapped tools such as
    /// `etcdctl`/`etcdutl`), as `(name, binary)`: what the image's `PATH`
    /// holds. Exact rules win over tag rules.
    pub fn commands_of(&self, image: &str) -> Vec<(String, PathBuf)> {
        let mut names: BTreeSet<String> = self.commands.iter().map(|(_, c, _)| c.clone()).collect();
        names.insert("etcd".into());
        names
            .into_iter()
            .filter_map(|name| {
                let binary = if name == "etcd" {
                    self.resolve(image)
                } else {
                    self.resolve_command(image, &name)
                };
                binary.map(|b| (name, b))
            })
            .collect()
    }

    /// Maps every tag of the controller's image ([`CONTROLLER_IMAGE_REPOSITORY`],
    /// which [`SEEDER_IMAGE`] is one of) onto the binary inside the image
    /// `make image` built ([`crate::image::BuiltImage`]), unpacked from its
    /// OCI layout, when it is current, else onto the etcdfleet binary of this
    /// build: its entrypoint (a Deployment's pod runs `etcdfleet run`) and
    /// its `etcdfleet` command (the seeder init container, which so runs the
    /// image's own static binary). Nothing when neither was built.
    pub fn with_seeder(self) -> Self {
        let image = crate::image::BuiltImage::locate();
        let exe = std::env::current_exe().ok();
        let build = exe
            .as_deref()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .map(|dir| dir.join("etcdfleet"))
            .filter(|bin| bin.is_file());
        match image.current_binary().or(build) {
            Some(bin) => self.with_controller_image(bin),
            None => self,
        }
    }

    /// Maps every tag of [`CONTROLLER_IMAGE_REPOSITORY`] onto `binary`.
    pub fn with_controller_image(mut self, binary: impl Into<PathBuf>) -> Self {
        let binary = binary.into();
        let repository = ImageMatch::Repository(CONTROLLER_IMAGE_REPOSITORY.to_string());
        self.commands
            .push((repository.clone(), "etcdfleet".into(), binary.clone()));
        self.rules.push((repository, binary));
        self
    }

    /// Maps the etcd images of 3.4.23, 3.5.1 and 3.5.21 onto the etcd stand-in
    /// `binary` (see [`crate::etcd_standin`]) instead of etcd: links
    /// `dir/v<version>/etcd` → `binary`, the stand-in's version being the
    /// name of its directory. For measuring the controller's cost only.
    pub fn standin(binary: &Path, dir: &Path) -> Result<Self> {
        let mut table = ImageTable::empty();
        for version in ["3.4.23", "3.5.1", "3.5.21"] {
            let versioned = dir.join(format!("v{version}"));
            fs::create_dir_all(&versioned)?;
            let link = versioned.join("etcd");
            if !link.exists() {
                std::os::unix::fs::symlink(binary, &link)
                    .with_context(|| format!("linking {}", link.display()))?;
            }
            for tag in [
                format!("v{version}"),
                version.to_string(),
                format!("{version}-0"),
            ] {
                table = table.with_tag(&tag, &link);
            }
        }
        Ok(table)
    }

    /// The binary for `image`, if mapped and present on disk. Exact rules win
    /// over tag rules.
    pub fn resolve(&self, image: &str) -> Option<PathBuf> {
        self.rules
            .iter()
            .filter_map(|(m, p)| Some((m.rank(image)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p.clone())
            .filter(|p| p.is_file())
    }
}

/// The tag of an image reference (`repo/name:tag[@digest]`).
fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split_once(':').map(|(_, tag)| tag)
}

/// Expands `$(VAR)` references like Kubernetes does for env values, command
/// and args: `$$` is an escaped `$`, an unknown variable or an unterminated
/// reference stays literal.
pub fn expand_k8s_vars(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.chars().next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(end) => {
                    let name = &after[1..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Rewrites host `0.0.0.0` to `ip` in the listen-URL arguments (the one
/// substitution this runtime makes, see the module docs). Handles
/// `--flag=value`, `-flag=value` and `--flag value`.
fn substitute_listen_urls(args: &[String], ip: Ipv4Addr) -> Vec<String> {
    const FLAGS: [&str; 3] = [
        "listen-client-urls",
        "listen-peer-urls",
        "listen-metrics-urls",
    ];
    let rewrite = |urls: &str| urls.replace("://0.0.0.0:", &format!("://{ip}:"));
    let mut out = Vec::with_capacity(args.len());
    let mut value_of_flag = false;
    for arg in args {
        if value_of_flag {
            out.push(rewrite(arg));
            value_of_flag = false;
            continue;
        }
        let bare = arg.trim_start_matches('-');
        match bare.split_once('=') {
            Some((flag, value)) if arg.starts_with('-') && FLAGS.contains(&flag) => {
                out.push(format!(
                    "{}={}",
                    &arg[..arg.len() - bare.len() + flag.len()],
                    rewrite(value)
                ));
            }
            None if arg.starts_with('-') && FLAGS.contains(&bare) => {
                out.push(arg.clone());
                value_of_flag = true;
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// An HTTP readiness probe as the kubelet runs it: a GET within the probe
/// timeout, ready on a 2xx or 3xx answer.
async fn http_probe(addr: SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(HTTP_PROBE_TIMEOUT, probe).await {
        // "HTTP/1.x NNN"
        Ok(Ok(head)) => matches!(head.get(9), Some(b'2' | b'3')),
        _ => false,
    }
}

/// The first `--listen-client-urls` address, for the readiness check.
fn client_listen_addr(args: &[String]) -> Option<SocketAddr> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let bare = arg.trim_start_matches('-');
        let value = match bare.split_once('=') {
            Some(("listen-client-urls", v)) => v.to_string(),
            None if bare == "listen-client-urls" => iter.next()?.clone(),
            _ => continue,
        };
        let first = value.split(',').next()?;
        let authority = first.split_once("://")?.1.split('/').next()?;
        return authority.parse().ok();
    }
    None
}

type PodKey = (String, String);

/// Why a container is not running (container state `waiting`).
#[derive(Debug, Clone, PartialEq)]
struct Waiting {
    reason: &'static str,
    message: String,
}

impl Waiting {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Waiting {
            reason,
            message: message.into(),
        }
    }
}

/// What the kubelet knows about one pod (one UID).
struct PodRun {
    uid: String,
    pod_dir: PathBuf,
    log_file: PathBuf,
    process: Option<EtcdProcess>,
    pod_started: String,
    container_started: Option<(Instant, String)>,
    ever_started: bool,
    restart_count: i32,
    backoff: Duration,
    next_start: Instant,
    last_terminated: Option<Value>,
    waiting: Option<Waiting>,
    client_addr: Option<SocketAddr>,
    /// The container's HTTP readiness probe at the pod's IP (address, path),
    /// evaluated as the kubelet does; without one, ready means the client
    /// port accepts connections.
    readiness_http: Option<(SocketAddr, String)>,
    claims: Vec<PodKey>,
    /// Init containers that exited 0, in order (the kubelet never reruns
    /// them for this pod UID).
    init_done: usize,
    init_process: Option<EtcdProcess>,
    /// Node mode: the running container's probes.
    probes: Option<Probes>,
    /// The status last written for this pod UID (written again only on change).
    written: Option<PodStatus>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<PodKey, PodRun>,
    ips: BTreeMap<PodKey, Ipv4Addr>,
    /// hosts-file line per pod, kept for pods that no longer exist so the
    /// file only grows (appends keep concurrent readers consistent).
    host_lines: BTreeMap<Ipv4Addr, String>,
    hosts_content: String,
    pvc_dirs: BTreeSet<PodKey>,
    shut_down: bool,
    /// The last sync found every pod running and ready: with no API change
    /// since, another sync would do nothing but probe.
    settled: bool,
}

/// Loopback /24 blocks taken by runtimes of this process.
static TAKEN_BLOCKS: Mutex<BTreeSet<(u8, u8)>> = Mutex::new(BTreeSet::new());

/// What a runtime plays (see the module docs).
#[derive(Debug, Clone)]
enum Mode {
    /// StatefulSet controller and kubelet of every pod, for the in-memory API.
    Emulated,
    /// The kubelet of the pods bound to these Nodes of a real control plane.
    Nodes(BTreeSet<String>),
}

struct Inner {
    server_url: String,
    client: Client,
    images: ImageTable,
    mode: Mode,
    block: (u8, u8),
    /// Held for the runtime's life: marks the block taken for other test processes.
    _block_lock: TcpListener,
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    hosts_file: PathBuf,
    names: Mutex<BTreeMap<String, Ipv4Addr>>,
    state: tokio::sync::Mutex<State>,
    /// Node mode: the PV host paths (the host-path provisioner's
    /// directories) its pods mounted, removed with the runtime: the control
    /// plane that would delete them stops with the test.
    host_volumes: Mutex<BTreeSet<PathBuf>>,
    /// How long the processes of deleted pods took to exit after SIGTERM,
    /// summed (etcd's own shutdown: from 20 ms to several seconds).
    exiting: Mutex<Duration>,
}

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

/// A random free `127.X.Y.0/24` (X in 16..=250), locked by a listener on
/// `127.X.Y.254:2379` and checked free by binding `127.X.Y.1:{2379,2380}`.
fn allocate_block() -> Result<((u8, u8), TcpListener)> {
    for _ in 0..500 {
        let r = random_u64();
        let x = 16 + (r % 235) as u8;
        let y = (r >> 16) as u8;
        if !TAKEN_BLOCKS.lock().expect("lock").insert((x, y)) {
            continue;
        }
        let lock = TcpListener::bind((Ipv4Addr::new(127, x, y, 254), 2379));
        let free = [2379u16, 2380]
            .iter()
            .all(|&port| TcpListener::bind((Ipv4Addr::new(127, x, y, 1), port)).is_ok());
        match lock {
            Ok(lock) if free => return Ok(((x, y), lock)),
            _ => continue,
        }
    }
    bail!("no free 127.X.Y.0/24 loopback block found")
}

fn now_rfc3339() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn is_status_code(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

/// `<sts>-<ordinal>` → ordinal.
fn ordinal_of(sts: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(sts)?.strip_prefix('-')?.parse().ok()
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A short stable hash of the pod template (the revision of a StatefulSet).
fn template_revision(sts: &StatefulSet) -> String {
    let template = sts
        .spec
        .as_ref()
        .map(|s| serde_json::to_string(&s.template).unwrap_or_default())
        .unwrap_or_default();
    // FNV-1a: stable across processes, unlike the std hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in template.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{}-{:010x}", sts.name_any(), h & 0xff_ffff_ffff)
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

fn hosts_base() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string()
}

async fn stop_all(runs: Vec<PodRun>) {
    futures::future::join_all(
        runs.into_iter()
            .filter_map(|r| r.process)
            .map(|p| async move {
                p.terminate(TERMINATION_GRACE).await;
            }),
    )
    .await;
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Processes die with their EtcdProcess (State drops after this).
        // `ETCDFLEET_KEEP_PODS=1` keeps them after a passing run too.
        if (std::thread::panicking() || std::env::var_os("ETCDFLEET_KEEP_PODS").is_some())
            && let Some(dir) = self.dir.take()
        {
            let path = dir.keep();
            eprintln!(
                "workload runtime {}: pod logs and volumes kept in {}",
                self.server_url,
                path.display()
            );
            return;
        }
        for volume in self.host_volumes.lock().expect("lock").iter() {
            let _ = fs::remove_dir_all(volume);
        }
    }
}

impl Inner {
    fn pvc_dir(&self, namespace: &str, pvc: &str) -> PathBuf {
        self.root.join("pvc").join(namespace).join(pvc)
    }

    fn log_file(&self, namespace: &str, pod: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{pod}.log"))
    }

    async fn sync(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        if state.shut_down {
            bail!("workload runtime {} was shut down", self.server_url);
        }
        if let Mode::Nodes(_) = self.mode {
            return self.run_kubelet(&mut state).await;
        }
        self.run_statefulsets().await?;
        self.run_kubelet(&mut state).await?;
        self.update_statefulset_status().await?;
        self.collect_pvc_dirs(&mut state).await?;
        Ok(())
    }

    // ---- StatefulSet controller ----

    async fn run_statefulsets(&self) -> Result<()> {
        let lp = ListParams::default();
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::all(self.client.clone()).list(&lp).await?.items;
        let pvcs: BTreeSet<PodKey> = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&lp)
            .await?
            .items
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        for sts in &stss {
            self.run_statefulset(sts, &pods, &pvcs)
                .await
                .with_context(|| format!("statefulset {}", sts.name_any()))?;
        }
        Ok(())
    }

    async fn run_statefulset(
        &self,
        sts: &StatefulSet,
        pods: &[Pod],
        pvcs: &BTreeSet<PodKey>,
    ) -> Result<()> {
        let Some(spec) = &sts.spec else { return Ok(()) };
        let ns = sts.namespace().unwrap_or_default();
        let name = sts.name_any();
        let uid = sts.uid().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
        let revision = template_revision(sts);
        let pod_api = Api::<Pod>::namespaced(self.client.clone(), &ns);
        let owned: BTreeMap<i32, &Pod> = pods
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && controlled_by(p, &uid))
            .filter_map(|p| Some((ordinal_of(&name, &p.name_any())?, p)))
            .collect();

        // Scale down first, highest ordinal first.
        let excess: Vec<(&i32, &&Pod)> = owned.range(replicas..).rev().collect();
        for (_, pod) in excess {
            delete_tolerant(&pod_api, &pod.name_any()).await?;
            if !parallel {
                return Ok(());
            }
        }

        for ordinal in 0..replicas {
            let pod_name = format!("{name}-{ordinal}");
            for template in spec.volume_claim_templates.iter().flatten() {
                let claim = format!("{}-{pod_name}", template.name_any());
                if !pvcs.contains(&(ns.clone(), claim.clone())) {
                    self.create_pvc(sts, template, &claim).await?;
                }
            }
            if owned.contains_key(&ordinal) {
                continue;
            }
            let lower_ready = (0..ordinal).all(|j| owned.get(&j).is_some_and(|p| pod_ready(p)));
            if !parallel && !lower_ready {
                break;
            }
            let taken = pods
                .iter()
                .any(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() == pod_name);
            if !taken {
                self.create_pod(sts, ordinal, &revision).await?;
            }
            if !parallel {
                break;
            }
        }

        // RollingUpdate (the default): replace the highest out-of-date pod,
        // one at a time, while every pod is present and ready.
        let strategy = spec.update_strategy.as_ref();
        let on_delete = strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete");
        let all_ready = (0..replicas).all(|j| owned.get(&j).is_some_and(|p| pod_ready(p)));
        if !on_delete && all_ready {
            let partition = strategy
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.partition)
                .unwrap_or(0);
            let stale = (partition..replicas).rev().find(|j| {
                owned
                    .get(j)
                    .is_some_and(|p| p.labels().get(REVISION_LABEL) != Some(&revision))
            });
            if let Some(j) = stale {
                delete_tolerant(&pod_api, &format!("{name}-{j}")).await?;
            }
        }
        Ok(())
    }

    async fn create_pvc(
        &self,
        sts: &StatefulSet,
        template: &PersistentVolumeClaim,
        claim: &str,
    ) -> Result<()> {
        let ns = sts.namespace().unwrap_or_default();
        let mut labels = template.labels().clone();
        if let Some(selector) = sts
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
        {
            labels.extend(selector.clone());
        }
        let spec = template.spec.clone().unwrap_or_default();
        let pvc = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim,
                "namespace": ns,
                "labels": labels,
                "annotations": template.annotations(),
            },
            "spec": spec,
            "status": {
                "phase": "Bound",
                "accessModes": spec.access_modes,
                "capacity": spec.resources.as_ref().and_then(|r| r.requests.clone()),
            },
        });
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc)?;
        match Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &pvc)
            .await
        {
            Err(e) if !is_status_code(&e, 409) => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn create_pod(&self, sts: &StatefulSet, ordinal: i32, revision: &str) -> Result<()> {
        let spec = sts.spec.as_ref().expect("checked by caller");
        let ns = sts.namespace().unwrap_or_default();
        let name = sts.name_any();
        let pod_name = format!("{name}-{ordinal}");
        let template_meta = spec.template.metadata.clone().unwrap_or_default();
        let mut labels = template_meta.labels.unwrap_or_default();
        labels.insert(POD_NAME_LABEL.into(), pod_name.clone());
        labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
        labels.insert(REVISION_LABEL.into(), revision.to_string());
        let mut pod_spec = spec.template.spec.clone().unwrap_or_default();
        pod_spec.hostname = Some(pod_name.clone());
        pod_spec.subdomain = spec.service_name.clone().filter(|s| !s.is_empty());
        let mut volumes = pod_spec.volumes.take().unwrap_or_default();
        for template in spec.volume_claim_templates.iter().flatten() {
            let volume_name = template.name_any();
            volumes.retain(|v| v.name != volume_name);
            volumes.push(Volume {
                name: volume_name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: format!("{volume_name}-{pod_name}"),
                    read_only: None,
                }),
                ..Volume::default()
            });
        }
        pod_spec.volumes = Some(volumes);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(pod_name),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: template_meta.annotations,
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "StatefulSet".into(),
                    name,
                    uid: sts.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec),
            status: None,
        };
        match Api::<Pod>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &pod)
            .await
        {
            Err(e) if !is_status_code(&e, 409) => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn update_statefulset_status(&self) -> Result<()> {
        let lp = ListParams::default();
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::all(self.client.clone()).list(&lp).await?.items;
        for sts in &stss {
            let ns = sts.namespace().unwrap_or_default();
            let name = sts.name_any();
            let uid = sts.uid().unwrap_or_default();
            let revision = template_revision(sts);
            let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let owned: Vec<&Pod> = pods
                .iter()
                .filter(|p| {
                    p.namespace().as_deref() == Some(ns.as_str())
                        && controlled_by(p, &uid)
                        && ordinal_of(&name, &p.name_any()).is_some()
                })
                .collect();
            let ready = owned.iter().filter(|p| pod_ready(p)).count() as i32;
            let at = |rev: &str| {
                owned
                    .iter()
                    .filter(|p| p.labels().get(REVISION_LABEL).map(String::as_str) == Some(rev))
                    .count() as i32
            };
            let updated = at(&revision);
            let current_revision =
                match sts.status.as_ref().and_then(|s| s.current_revision.clone()) {
                    Some(current) if !(updated == want && owned.len() as i32 == want) => current,
                    _ => revision.clone(),
                };
            let desired = StatefulSetStatus {
                replicas: owned.len() as i32,
                ready_replicas: Some(ready),
                available_replicas: Some(ready),
                current_replicas: Some(at(&current_revision)),
                updated_replicas: Some(updated),
                current_revision: Some(current_revision),
                update_revision: Some(revision),
                observed_generation: sts.metadata.generation,
                ..StatefulSetStatus::default()
            };
            if sts.status.as_ref() != Some(&desired) {
                Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": desired })),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// StatefulSets whose replicas are not all present, ready and reported.
    async fn statefulsets_not_ready(&self) -> Result<Vec<String>> {
        let stss = Api::<StatefulSet>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(stss
            .iter()
            .filter(|sts| {
                let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let status = sts.status.clone().unwrap_or_default();
                status.replicas != want
                    || status.ready_replicas.unwrap_or(0) != want
                    || status.observed_generation != sts.metadata.generation
            })
            .map(|sts| format!("{}/{}", sts.namespace().unwrap_or_default(), sts.name_any()))
            .collect())
    }

    async fn collect_pvc_dirs(&self, state: &mut State) -> Result<()> {
        let existing: BTreeSet<PodKey> = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        let in_use: BTreeSet<&PodKey> = state.pods.values().flat_map(|r| r.claims.iter()).collect();
        let gone: Vec<PodKey> = state
            .pvc_dirs
            .iter()
            .filter(|k| !existing.contains(*k) && !in_use.contains(k))
            .cloned()
            .collect();
        for key in gone {
            let dir = self.pvc_dir(&key.0, &key.1);
            if dir.exists() {
                fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            }
            let _ = fs::remove_file(dir.with_extension("uid"));
            state.pvc_dirs.remove(&key);
        }
        Ok(())
    }

    // ---- kubelet ----

    async fn run_kubelet(&self, state: &mut State) -> Result<()> {
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let live: BTreeMap<PodKey, &Pod> = pods
            .iter()
            .filter(|p| self.runs_here(p))
            .map(|p| ((p.namespace().unwrap_or_default(), p.name_any()), p))
            .collect();

        // Pods that are gone (or were replaced by a new UID): stop them.
        let gone: Vec<PodKey> = state
            .pods
            .iter()
            .filter(|(k, r)| {
                live.get(*k).and_then(|p| p.metadata.uid.as_deref()) != Some(r.uid.as_str())
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut stopped = Vec::new();
        for key in gone {
            if let Some(run) = state.pods.remove(&key) {
                stopped.push(run);
            }
        }
        let dirs: Vec<PathBuf> = stopped.iter().map(|r| r.pod_dir.clone()).collect();
        let started = Instant::now();
        let stopping = stopped.iter().any(|r| r.process.is_some());
        stop_all(stopped).await;
        if stopping {
            *self.exiting.lock().unwrap_or_else(|e| e.into_inner()) += started.elapsed();
        }
        for dir in dirs {
            let _ = fs::remove_dir_all(dir);
        }

        // Network: IPs and the hosts file, before any process starts.
        for (key, pod) in &live {
            let ip = self.ip_for(state, key)?;
            let spec = pod.spec.clone().unwrap_or_default();
            let hostname = spec.hostname.unwrap_or_else(|| key.1.clone());
            let line = match spec.subdomain.filter(|s| !s.is_empty()) {
                Some(sub) => format!(
                    "{ip}\t{hostname}.{sub}.{ns}.svc.cluster.local {hostname}.{sub}.{ns}.svc {hostname}",
                    ns = key.0
                ),
                None => format!("{ip}\t{hostname}"),
            };
            state.host_lines.insert(ip, line);
        }
        self.write_hosts(state)?;

        let mut settled = true;
        for (key, pod) in &live {
            settled &= self.run_pod(state, key, pod).await?;
        }
        state.settled = settled;
        Ok(())
    }

    /// Whether this kubelet runs `pod`: every pod (emulated), or pods bound
    /// to one of its Nodes.
    fn runs_here(&self, pod: &Pod) -> bool {
        match &self.mode {
            Mode::Emulated => true,
            Mode::Nodes(nodes) => pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| nodes.contains(n)),
        }
    }

    /// Node mode, once a deleted pod's containers stopped: removes the pod
    /// object (grace 0, only this UID), as the kubelet does.
    async fn finish_deletion(&self, pod: &Pod) -> Result<()> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            // Gone already, or a new pod of that name (409): nothing to do.
            Err(e) if is_status_code(&e, 404) || is_status_code(&e, 409) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(()),
        }
    }

    /// The host directory behind PVC `ns/name`: the runtime's own directory
    /// (emulated), or the host path of the PV the claim is bound to (node
    /// mode; `None` while it is unbound).
    async fn claim_dir(&self, ns: &str, claim: &PersistentVolumeClaim) -> Result<Option<PathBuf>> {
        match self.mode {
            Mode::Emulated => Ok(Some(self.pvc_dir(ns, &claim.name_any()))),
            Mode::Nodes(_) => {
                let Some(volume) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
                    return Ok(None);
                };
                let pv = Api::<PersistentVolume>::all(self.client.clone())
                    .get_opt(&volume)
                    .await?;
                let path = pv
                    .and_then(|pv| pv.spec?.host_path)
                    .map(|h| PathBuf::from(h.path));
                if let Some(p) = &path {
                    self.host_volumes.lock().expect("lock").insert(p.clone());
                }
                Ok(path)
            }
        }
    }

    fn ip_for(&self, state: &mut State, key: &PodKey) -> Result<Ipv4Addr> {
        if let Some(ip) = state.ips.get(key) {
            return Ok(*ip);
        }
        let n = state.ips.len() + 1;
        if n > 250 {
            bail!("the runtime's /24 block is exhausted");
        }
        let (x, y) = self.block;
        let ip = Ipv4Addr::new(127, x, y, n as u8);
        state.ips.insert(key.clone(), ip);
        Ok(ip)
    }

    /// Rewrites the hosts file in place (same inode): appends when only lines
    /// were added, else overwrites and truncates.
    fn write_hosts(&self, state: &mut State) -> Result<()> {
        let mut content = hosts_base();
        for line in state.host_lines.values() {
            content.push_str(line);
            content.push('\n');
        }
        {
            let mut names = self.names.lock().expect("lock");
            names.clear();
            for (key, ip) in &state.ips {
                names.insert(format!("{}.{}.pod", key.1, key.0), *ip);
            }
            for line in state.host_lines.values() {
                let mut fields = line.split_whitespace();
                let Some(ip) = fields.next().and_then(|i| i.parse().ok()) else {
                    continue;
                };
                for name in fields {
                    names.insert(name.to_ascii_lowercase(), ip);
                }
            }
        }
        if content == state.hosts_content {
            return Ok(());
        }
        let file = fs::OpenOptions::new().write(true).open(&self.hosts_file)?;
        if let Some(suffix) = content.strip_prefix(state.hosts_content.as_str()) {
            file.write_all_at(suffix.as_bytes(), state.hosts_content.len() as u64)?;
        } else {
            file.write_all_at(content.as_bytes(), 0)?;
            file.set_len(content.len() as u64)?;
        }
        state.hosts_content = content;
        Ok(())
    }

    /// One pod's kubelet pass; true when it is running and ready.
    async fn run_pod(&self, state: &mut State, key: &PodKey, pod: &Pod) -> Result<bool> {
        let ip = state.ips[key];
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let pod_dir = self
            .root
            .join("pods")
            .join(format!("{}_{}_{}", key.0, key.1, uid));
        let log_file = self.log_file(&key.0, &key.1);
        let run = state.pods.entry(key.clone()).or_insert_with(|| PodRun {
            uid,
            pod_dir,
            log_file,
            process: None,
            pod_started: now_rfc3339(),
            container_started: None,
            ever_started: false,
            restart_count: 0,
            backoff: BACKOFF_START,
            next_start: Instant::now(),
            last_terminated: None,
            waiting: None,
            client_addr: None,
            readiness_http: None,
            claims: Vec::new(),
            init_done: 0,
            init_process: None,
            probes: None,
            written: None,
        });

        // A pod being deleted (seeded with deletionTimestamp): stop it.
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = match self.mode {
                Mode::Emulated => TERMINATION_GRACE,
                Mode::Nodes(_) => deletion_grace(pod),
            };
            if let Some(p) = run.process.take() {
                let started = Instant::now();
                p.terminate(grace).await;
                *self.exiting.lock().unwrap_or_else(|e| e.into_inner()) += started.elapsed();
            }
            if let Some(p) = run.init_process.take() {
                p.kill().await;
            }
            if let Mode::Nodes(_) = self.mode {
                self.finish_deletion(pod).await?;
            }
            return Ok(false);
        }

        // Exited? Schedule a restart with backoff.
        if let Some(p) = run.process.as_mut()
            && let Some(status) = p.exit_status()
        {
            use std::os::unix::process::ExitStatusExt;
            let code = status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            let ran = run
                .container_started
                .as_ref()
                .map(|(at, _)| at.elapsed())
                .unwrap_or_default();
            if ran >= BACKOFF_RESET_AFTER {
                run.backoff = BACKOFF_START;
            }
            run.last_terminated = Some(json!({
                "exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": run.container_started.as_ref().map(|(_, s)| s.clone()),
                "finishedAt": now_rfc3339(),
            }));
            run.process = None;
            run.next_start = Instant::now() + run.backoff;
            run.backoff = (run.backoff * 2).min(BACKOFF_MAX);
            run.waiting = Some(Waiting::new(
                "CrashLoopBackOff",
                format!("back-off restarting the container (exit code {code})"),
            ));
        }

        // Main containers start only after every init container exited 0.
        let initialized = self.advance_init_containers(pod, ip, run).await;
        if initialized && run.process.is_none() && Instant::now() >= run.next_start {
            match self.start_container(pod, ip, run).await {
                Ok(process) => {
                    if run.ever_started {
                        run.restart_count += 1;
                    }
                    if let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) {
                        run.probes = Some(Probes::new(container, ip));
                    }
                    run.ever_started = true;
                    run.process = Some(process);
                    run.container_started = Some((Instant::now(), now_rfc3339()));
                    run.waiting = None;
                }
                Err(waiting) => run.waiting = Some(waiting),
            }
        }
        for claim in &run.claims {
            state.pvc_dirs.insert(claim.clone());
        }
        let run = state.pods.get_mut(key).expect("inserted above");

        let alive = run.process.as_ref().is_some_and(EtcdProcess::is_running);
        if let (Mode::Nodes(_), true) = (&self.mode, alive) {
            let ready = probe(run).await;
            return self
                .report_status(key, pod, run, ip, alive, ready)
                .await
                .map(|()| ready);
        }
        let ready = alive
            && match (&run.readiness_http, run.client_addr) {
                (Some((addr, path)), _) => http_probe(*addr, path).await,
                (None, Some(addr)) => matches!(
                    tokio::time::timeout(READY_PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr))
                        .await,
                    Ok(Ok(_))
                ),
                (None, None) => true,
            };
        self.report_status(key, pod, run, ip, alive, ready).await?;
        Ok(ready)
    }

    /// Writes the pod's status when it differs from what the API holds
    /// (emulated) or from what this kubelet wrote last (node mode: a real
    /// API server adds fields of its own, such as `qosClass`).
    async fn report_status(
        &self,
        key: &PodKey,
        pod: &Pod,
        run: &mut PodRun,
        ip: Ipv4Addr,
        alive: bool,
        ready: bool,
    ) -> Result<()> {
        let status = pod_status(pod, run, ip, alive, ready)?;
        let unchanged = match self.mode {
            Mode::Emulated => pod.status.as_ref() == Some(&status),
            Mode::Nodes(_) => run.written.as_ref() == Some(&status),
        };
        if unchanged {
            return Ok(());
        }
        let patched = Api::<Pod>::namespaced(self.client.clone(), &key.0)
            .patch_status(
                &key.1,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await;
        match patched {
            // Deleted meanwhile: the next sync stops it.
            Err(e) if is_status_code(&e, 404) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(_) => {
                run.written = Some(status);
                Ok(())
            }
        }
    }

    /// Resolves everything a container start needs, then spawns it.
    async fn start_container(
        &self,
        pod: &Pod,
        ip: Ipv4Addr,
        run: &mut PodRun,
    ) -> std::result::Result<EtcdProcess, Waiting> {
        let ns = pod.namespace().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let container = spec
            .containers
            .first()
            .ok_or_else(|| Waiting::new("CreateContainerConfigError", "pod has no containers"))?;
        let image = container.image.clone().unwrap_or_default();
        let binary = self.images.resolve(&image).ok_or_else(|| {
            Waiting::new(
                "ErrImagePull",
                format!(
                    "image {image:?} is not in the runtime's image table (or its binary is missing)"
                ),
            )
        })?;
        let env = self.container_env(pod, container, ip).await?;
        let lookup = |name: &str| {
            env.iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let command: Vec<String> = container
            .command
            .iter()
            .flatten()
            .map(|c| expand_k8s_vars(c, lookup))
            .collect();
        let mut args: Vec<String> = Vec::new();
        let mut binary = binary;
        if let Some(first) = command.first() {
            binary = self.command_binary(&image, &binary, first)?;
            args.extend(command[1..].iter().cloned());
        }
        args.extend(
            container
                .args
                .iter()
                .flatten()
                .map(|a| expand_k8s_vars(a, lookup)),
        );
        let args = substitute_listen_urls(&args, ip);
        run.client_addr = client_listen_addr(&args);
        run.readiness_http = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|g| match &g.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port) => Some((
                    SocketAddr::from((ip, u16::try_from(*port).ok()?)),
                    g.path.clone().unwrap_or_else(|| "/".into()),
                )),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(_) => None,
            });

        let (mounts, claims) = self.prepare_volumes(pod, container, &run.pod_dir).await?;
        run.claims = claims;
        self.spawn_logged(run, "starting", binary, args, env, &mounts)
            .inspect(
                |_| tracing::debug!(pod = %pod.name_any(), namespace = %ns, "container started"),
            )
    }

    /// The binary a container's `command[0]` runs: the image's entrypoint
    /// when it names it (`etcd` in an etcd image), else another command the
    /// image provides.
    fn command_binary(
        &self,
        image: &str,
        entrypoint: &Path,
        program: &str,
    ) -> std::result::Result<PathBuf, Waiting> {
        let name = Path::new(program).file_name().and_then(|n| n.to_str());
        if name.is_some() && name == entrypoint.file_name().and_then(|n| n.to_str()) {
            return Ok(entrypoint.to_path_buf());
        }
        self.images.resolve_command(image, program).ok_or_else(|| {
            Waiting::new(
                "RunContainerError",
                format!("command {program:?} is not provided by image {image:?} in the runtime's image table"),
            )
        })
    }

    /// Runs the pod's init containers in order, one at a time, as real
    /// processes with the pod's env and mounts; a failure is retried with the
    /// pod's backoff (`Init:CrashLoopBackOff`). True once all exited 0.
    async fn advance_init_containers(&self, pod: &Pod, ip: Ipv4Addr, run: &mut PodRun) -> bool {
        let inits = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default();
        loop {
            if run.init_done >= inits.len() {
                return true;
            }
            if let Some(p) = run.init_process.as_ref() {
                let Some(status) = p.exit_status() else {
                    run.waiting = Some(Waiting::new(
                        "PodInitializing",
                        format!("init container {} running", inits[run.init_done].name),
                    ));
                    return false;
                };
                run.init_process = None;
                if status.success() {
                    run.init_done += 1;
                    run.backoff = BACKOFF_START;
                    continue;
                }
                run.next_start = Instant::now() + run.backoff;
                run.backoff = (run.backoff * 2).min(BACKOFF_MAX);
                run.waiting = Some(Waiting::new(
                    "Init:CrashLoopBackOff",
                    format!(
                        "init container {} exited with {status}",
                        inits[run.init_done].name
                    ),
                ));
                return false;
            }
            if Instant::now() < run.next_start {
                return false;
            }
            match self
                .start_init_container(pod, ip, run, &inits[run.init_done])
                .await
            {
                Ok(p) => run.init_process = Some(p),
                Err(w) => {
                    run.waiting = Some(w);
                    return false;
                }
            }
        }
    }

    /// Starts one init container: its command's basename resolves through
    /// the image table's command rules.
    async fn start_init_container(
        &self,
        pod: &Pod,
        ip: Ipv4Addr,
        run: &mut PodRun,
        container: &Container,
    ) -> std::result::Result<EtcdProcess, Waiting> {
        let image = container.image.clone().unwrap_or_default();
        let env = self.container_env(pod, container, ip).await?;
        let lookup = |name: &str| {
            env.iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut argv: Vec<String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .map(|a| expand_k8s_vars(a, lookup))
            .collect();
        if argv.is_empty() {
            return Err(Waiting::new(
                "RunContainerError",
                format!("init container {} has no command", container.name),
            ));
        }
        let program = argv.remove(0);
        let (mounts, claims) = self.prepare_volumes(pod, container, &run.pod_dir).await?;
        for c in claims {
            if !run.claims.contains(&c) {
                run.claims.push(c);
            }
        }
        // A program inside one of the container's volumes (a binary an
        // earlier init container put into an emptyDir) runs from there, as
        // the kubelet would: the path is exec'd inside the pod's mount
        // namespace, after the volume is bind-mounted.
        let in_volume = mounts.iter().find_map(|(host, target)| {
            let rest = Path::new(&program).strip_prefix(target).ok()?;
            Some(host.join(rest))
        });
        let binary = match in_volume {
            Some(host) if host.is_file() => PathBuf::from(&program),
            Some(host) => {
                return Err(Waiting::new(
                    "RunContainerError",
                    format!(
                        "init container {}: {program:?} does not exist in its volume ({})",
                        container.name,
                        host.display()
                    ),
                ));
            }
            None => self
                .images
                .resolve_command(&image, &program)
                .ok_or_else(|| {
                    Waiting::new(
                        "ErrImagePull",
                        format!(
                            "command {program:?} of image {image:?} is not in the runtime's image table"
                        ),
                    )
                })?,
        };
        let env = self.with_image_path(env, &image, &run.pod_dir, &container.name)?;
        let what = format!("init container {}:", container.name);
        self.spawn_logged(run, &what, binary, argv, env, &mounts)
    }

    /// Puts the commands `image` provides first on `PATH` (unless the
    /// container sets `PATH` itself), as the image's own `PATH` would: a
    /// program that runs another tool of its image by name (the seeder
    /// running `etcdutl`) finds it. The directory holds symlinks to the
    /// mapped binaries.
    fn with_image_path(
        &self,
        mut env: Vec<(String, String)>,
        image: &str,
        pod_dir: &Path,
        container: &str,
    ) -> std::result::Result<Vec<(String, String)>, Waiting> {
        if env.iter().any(|(k, _)| k == "PATH") {
            return Ok(env);
        }
        let io = |e: std::io::Error| Waiting::new("ContainerCreating", e.to_string());
        let dir = pod_dir.join("image-path").join(container);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io)?;
        }
        fs::create_dir_all(&dir).map_err(io)?;
        for (name, binary) in self.images.commands_of(image) {
            std::os::unix::fs::symlink(&binary, dir.join(name)).map_err(io)?;
        }
        let host_path = std::env::var("PATH").unwrap_or_default();
        env.push(("PATH".into(), format!("{}:{host_path}", dir.display())));
        Ok(env)
    }

    /// Spawns one container process with the pod's hosts file, its log in
    /// the pod's log file, after a `--- <time> <what> <binary> <args>` line.
    fn spawn_logged(
        &self,
        run: &PodRun,
        what: &str,
        binary: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
        mounts: &[(PathBuf, PathBuf)],
    ) -> std::result::Result<EtcdProcess, Waiting> {
        let spec = ProcessSpec {
            binary,
            args,
            env,
            log_file: run.log_file.clone(),
            hosts_file: Some(self.hosts_file.clone()),
        };
        if let Ok(mut log) = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&run.log_file)
        {
            let _ = writeln!(
                log,
                "--- {} {what} {} {}",
                now_rfc3339(),
                spec.binary.display(),
                spec.args.join(" ")
            );
        }
        EtcdProcess::spawn_with_mounts(&spec, mounts)
            .map_err(|e| Waiting::new("RunContainerError", format!("{e:#}")))
    }

    async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        ip: Ipv4Addr,
    ) -> std::result::Result<Vec<(String, String)>, Waiting> {
        let ns = pod.namespace().unwrap_or_default();
        let config_error = |m: String| Waiting::new("CreateContainerConfigError", m);
        let mut env: Vec<(String, String)> = self.service_env();
        for from in container.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = &from.config_map_ref {
                match self.config_map(&ns, &r.name).await {
                    Ok(Some(cm)) => env.extend(
                        cm.data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (format!("{prefix}{k}"), v)),
                    ),
                    Ok(None) if r.optional == Some(true) => {}
                    Ok(None) => {
                        return Err(config_error(format!("configmap {:?} not found", r.name)));
                    }
                    Err(e) => return Err(config_error(e.to_string())),
                }
            }
            if let Some(r) = &from.secret_ref {
                match self.secret_data(&ns, &r.name).await {
                    Ok(Some(data)) => env.extend(data.into_iter().map(|(k, v)| {
                        (
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })),
                    Ok(None) if r.optional == Some(true) => {}
                    Ok(None) => return Err(config_error(format!("secret {:?} not found", r.name))),
                    Err(e) => return Err(config_error(e.to_string())),
                }
            }
        }
        for var in container.env.iter().flatten() {
            let value = if let Some(value) = &var.value {
                let defined = env.clone();
                Some(expand_k8s_vars(value, |n| {
                    defined
                        .iter()
                        .rev()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                }))
            } else if let Some(from) = &var.value_from {
                if let Some(field) = &from.field_ref {
                    Some(field_value(pod, &field.field_path, ip).ok_or_else(|| {
                        config_error(format!("unsupported fieldRef {:?}", field.field_path))
                    })?)
                } else if let Some(r) = &from.config_map_key_ref {
                    let cm = self
                        .config_map(&ns, &r.name)
                        .await
                        .map_err(|e| config_error(e.to_string()))?;
                    match cm.and_then(|cm| cm.data.unwrap_or_default().get(&r.key).cloned()) {
                        Some(v) => Some(v),
                        None if r.optional == Some(true) => None,
                        None => {
                            return Err(config_error(format!(
                                "configmap {:?} key {:?} not found",
                                r.name, r.key
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let data = self
                        .secret_data(&ns, &r.name)
                        .await
                        .map_err(|e| config_error(e.to_string()))?;
                    match data.and_then(|d| d.get(&r.key).cloned()) {
                        Some(v) => Some(String::from_utf8_lossy(&v).into_owned()),
                        None if r.optional == Some(true) => None,
                        None => {
                            return Err(config_error(format!(
                                "secret {:?} key {:?} not found",
                                r.name, r.key
                            )));
                        }
                    }
                } else {
                    return Err(config_error(format!(
                        "unsupported valueFrom for {:?}",
                        var.name
                    )));
                }
            } else {
                Some(String::new())
            };
            if let Some(value) = value {
                env.push((var.name.clone(), value));
            }
        }
        Ok(env)
    }

    /// Node mode: a token of the pod's ServiceAccount bound to the pod
    /// (`TokenRequest`), as the kubelet mounts it.
    async fn pod_token(
        &self,
        pod: &Pod,
        source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ) -> Result<String> {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::ServiceAccount;
        let ns = pod.namespace().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request: TokenRequest = serde_json::from_value(json!({ "spec": {
            "audiences": source.audience.iter().collect::<Vec<_>>(),
            "expirationSeconds": source.expiration_seconds.unwrap_or(3607),
            "boundObjectRef": { "kind": "Pod", "apiVersion": "v1", "name": pod.name_any(), "uid": pod.uid() },
        }}))?;
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &ns)
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token for ServiceAccount {ns}/{account}"))?;
        Ok(answer.status.map(|s| s.token).unwrap_or_default())
    }

    /// The files of a `projected` volume: ConfigMap keys and downward-API
    /// fields as the kubelet writes them, and a ServiceAccount token (node
    /// mode: a real one; emulated: empty, the in-memory API issues none).
    async fn projected_files(
        &self,
        pod: &Pod,
        projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let ns = pod.namespace().unwrap_or_default();
        let mut files = BTreeMap::new();
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let value = match self.mode {
                    Mode::Nodes(_) => self.pod_token(pod, token).await?,
                    Mode::Emulated => String::new(),
                };
                files.insert(token.path.clone(), value.into_bytes());
            }
            if let Some(cm) = &source.config_map {
                let data = self.config_map(&ns, &cm.name).await?.and_then(|c| c.data);
                if data.is_none() && cm.optional != Some(true) {
                    bail!("configmap {:?} not found", cm.name);
                }
                for item in cm.items.iter().flatten() {
                    if let Some(v) = data.as_ref().and_then(|d| d.get(&item.key)) {
                        files.insert(item.path.clone(), v.clone().into_bytes());
                    }
                }
            }
            for item in source
                .downward_api
                .iter()
                .flat_map(|d| d.items.iter().flatten())
            {
                if let Some(field) = &item.field_ref {
                    let value = field_value(pod, &field.field_path, Ipv4Addr::UNSPECIFIED);
                    files.insert(item.path.clone(), value.unwrap_or_default().into_bytes());
                }
            }
        }
        Ok(files)
    }

    /// Node mode: the `kubernetes` Service's variables every container gets,
    /// so in-cluster clients find the API server. Its ClusterIP is not
    /// routable on this machine: they name the API server's own address, the
    /// endpoint the Service would route to.
    fn service_env(&self) -> Vec<(String, String)> {
        let Mode::Nodes(_) = self.mode else {
            return Vec::new();
        };
        let Some((host, port)) = self
            .server_url
            .strip_prefix("https://")
            .and_then(|a| a.rsplit_once(':'))
        else {
            return Vec::new();
        };
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.to_string()),
            ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ]
    }

    async fn config_map(&self, ns: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
        Api::<ConfigMap>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
    }

    /// A Secret's data, with `stringData` folded in (the fake API does not
    /// merge it like a real API server does).
    async fn secret_data(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
        let secret: Option<Secret> = Api::<Secret>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?;
        Ok(secret.map(|s| {
            let mut data: BTreeMap<String, Vec<u8>> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                data.insert(k, v.into_bytes());
            }
            data
        }))
    }

    /// Host directories for each volume mount, as (source, mountPath) pairs
    /// ordered parents first, plus the PVCs used.
    async fn prepare_volumes(
        &self,
        pod: &Pod,
        container: &Container,
        pod_dir: &Path,
    ) -> std::result::Result<(Vec<(PathBuf, PathBuf)>, Vec<PodKey>), Waiting> {
        let ns = pod.namespace().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let mount_error = |m: String| Waiting::new("ContainerCreating", m);
        let io = |e: std::io::Error| Waiting::new("ContainerCreating", e.to_string());
        let mut mounts = Vec::new();
        let mut claims = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .ok_or_else(|| mount_error(format!("volume {:?} is not defined", mount.name)))?;
            let local = pod_dir.join("volumes").join(&volume.name);
            let source = if let Some(pvc) = &volume.persistent_volume_claim {
                let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
                    .get_opt(&pvc.claim_name)
                    .await
                    .map_err(|e| mount_error(e.to_string()))?
                    .ok_or_else(|| {
                        mount_error(format!(
                            "persistentvolumeclaim {:?} not found",
                            pvc.claim_name
                        ))
                    })?;
                claims.push((ns.clone(), pvc.claim_name.clone()));
                let dir = self
                    .claim_dir(&ns, &claim)
                    .await
                    .map_err(|e| mount_error(format!("{e:#}")))?
                    .ok_or_else(|| {
                        mount_error(format!(
                            "persistentvolumeclaim {:?} is not bound to a host-path volume",
                            pvc.claim_name
                        ))
                    })?;
                // A PVC recreated under the same name is a new volume (a new PV
                // in a real cluster): the old one's data must not show through.
                let uid = claim.metadata.uid.clone().unwrap_or_default();
                let marker = dir.with_extension("uid");
                if matches!(self.mode, Mode::Emulated)
                    && fs::read_to_string(&marker).ok().as_deref() != Some(uid.as_str())
                {
                    if dir.exists() {
                        fs::remove_dir_all(&dir).map_err(io)?;
                    }
                    fs::create_dir_all(dir.parent().unwrap_or(&dir)).map_err(io)?;
                    fs::write(&marker, &uid).map_err(io)?;
                }
                dir
            } else if let Some(cm) = &volume.config_map {
                let data = match self.config_map(&ns, &cm.name).await {
                    Ok(Some(cm)) => {
                        let mut d: BTreeMap<String, Vec<u8>> = cm
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect();
                        d.extend(
                            cm.binary_data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, v.0)),
                        );
                        d
                    }
                    Ok(None) if cm.optional == Some(true) => BTreeMap::new(),
                    Ok(None) => {
                        return Err(mount_error(format!("configmap {:?} not found", cm.name)));
                    }
                    Err(e) => return Err(mount_error(e.to_string())),
                };
                write_key_files(&local, &data, cm.items.as_deref(), cm.default_mode).map_err(io)?;
                local
            } else if let Some(secret) = &volume.secret {
                let name = secret.secret_name.clone().unwrap_or_default();
                let data = match self.secret_data(&ns, &name).await {
                    Ok(Some(d)) => d,
                    Ok(None) if secret.optional == Some(true) => BTreeMap::new(),
                    Ok(None) => return Err(mount_error(format!("secret {name:?} not found"))),
                    Err(e) => return Err(mount_error(e.to_string())),
                };
                write_key_files(&local, &data, secret.items.as_deref(), secret.default_mode)
                    .map_err(io)?;
                local
            } else if volume.empty_dir.is_some() {
                local
            } else if let Some(projected) = &volume.projected {
                let data = self
                    .projected_files(pod, projected)
                    .await
                    .map_err(|e| mount_error(format!("{e:#}")))?;
                write_key_files(&local, &data, None, projected.default_mode).map_err(io)?;
                local
            } else {
                return Err(mount_error(format!(
                    "volume {:?}: only persistentVolumeClaim, configMap, secret, emptyDir and projected are supported",
                    volume.name
                )));
            };
            let source = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => source.join(sub),
                None => source,
            };
            fs::create_dir_all(&source).map_err(io)?;
            let target = PathBuf::from(&mount.mount_path);
            if !target.exists() {
                fs::create_dir_all(&target).map_err(io)?;
            }
            mounts.push((source, target));
        }
        mounts.sort_by_key(|(_, target)| target.components().count());
        Ok((mounts, claims))
    }
}

/// Writes a configMap/secret volume: all keys, or only `items` (key → path).
fn write_key_files(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) -> std::io::Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    let files: Vec<(String, &Vec<u8>, Option<i32>)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|i| data.get(&i.key).map(|v| (i.path.clone(), v, i.mode)))
            .collect(),
        None => data.iter().map(|(k, v)| (k.clone(), v, None)).collect(),
    };
    for (path, value, mode) in files {
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, value)?;
        let mode = mode.or(default_mode).unwrap_or(0o644) as u32;
        fs::set_permissions(&file, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// A `fieldRef` value, as kubelet resolves it.
fn field_value(pod: &Pod, path: &str, ip: Ipv4Addr) -> Option<String> {
    let label_or_annotation = |prefix: &str, map: &BTreeMap<String, String>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.get(key).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(pod.name_any()),
        "metadata.namespace" => pod.namespace(),
        "metadata.uid" => pod.uid(),
        "status.podIP" => Some(ip.to_string()),
        "status.hostIP" => Some("127.0.0.1".into()),
        "spec.nodeName" => Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "localhost".into()),
        ),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        _ => label_or_annotation("metadata.labels['", pod.labels())
            .or_else(|| label_or_annotation("metadata.annotations['", pod.annotations())),
    }
}

/// The status the kubelet reports for a pod.
fn pod_status(
    pod: &Pod,
    run: &PodRun,
    ip: Ipv4Addr,
    alive: bool,
    ready: bool,
) -> Result<PodStatus> {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let state = match (&run.process, &run.waiting, &run.container_started) {
        (Some(_), _, Some((_, started))) if alive => json!({ "running": { "startedAt": started } }),
        (_, Some(w), _) => json!({ "waiting": { "reason": w.reason, "message": w.message } }),
        _ => json!({ "waiting": { "reason": "ContainerCreating" } }),
    };
    let phase = if run.ever_started {
        "Running"
    } else {
        "Pending"
    };
    let flag = |b: bool| if b { "True" } else { "False" };
    let mut container_status = json!({
        "name": container.map(|c| c.name.clone()).unwrap_or_default(),
        "image": container.and_then(|c| c.image.clone()).unwrap_or_default(),
        "imageID": "",
        "ready": ready,
        "started": alive,
        "restartCount": run.restart_count,
        "state": state,
    });
    if let Some(t) = &run.last_terminated {
        container_status["lastState"] = json!({ "terminated": t });
    }
    let status = json!({
        "phase": phase,
        "hostIP": "127.0.0.1",
        "hostIPs": [{ "ip": "127.0.0.1" }],
        "podIP": ip.to_string(),
        "podIPs": [{ "ip": ip.to_string() }],
        "startTime": run.pod_started,
        "conditions": [
            { "type": "PodScheduled", "status": "True" },
            { "type": "Initialized", "status": flag(initialized(pod, run)) },
            { "type": "ContainersReady", "status": flag(ready) },
            { "type": "Ready", "status": flag(ready) },
        ],
        "containerStatuses": [container_status],
    });
    Ok(serde_json::from_value(status)?)
}

/// Whether every init container of `pod` exited 0.
fn initialized(pod: &Pod, run: &PodRun) -> bool {
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len);
    run.init_done >= inits
}

/// Node mode: runs the container's due probes; a startup or liveness probe
/// failed past its threshold kills the container (the next sync restarts it
/// with backoff, as the kubelet does). True when ready.
async fn probe(run: &mut PodRun) -> bool {
    let Some(probes) = run.probes.as_mut() else {
        return true;
    };
    let verdict = probes.tick().await;
    if verdict.restart
        && let Some(p) = run.process.as_ref()
    {
        p.terminate(TERMINATION_GRACE).await;
    }
    verdict.ready
}

/// How long a pod being deleted gets between SIGTERM and SIGKILL: what the
/// delete asked for, else the pod's own grace period.
fn deletion_grace(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

/// Deletes a pod, tolerating that it is already gone.
async fn delete_tolerant(api: &Api<Pod>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Err(e) if !is_status_code(&e, 404) => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "POD_NAME" => Some("c-etcd-0".into()),
            "NS" => Some("team-a".into()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes() {
        assert_eq!(
            expand_k8s_vars("--name=$(POD_NAME)", vars),
            "--name=c-etcd-0"
        );
        assert_eq!(
            expand_k8s_vars("http://$(POD_NAME).peer.$(NS).svc:2380", vars),
            "http://c-etcd-0.peer.team-a.svc:2380"
        );
        assert_eq!(expand_k8s_vars("$$(POD_NAME)", vars), "$(POD_NAME)");
        assert_eq!(expand_k8s_vars("$(UNKNOWN)", vars), "$(UNKNOWN)");
        assert_eq!(expand_k8s_vars("$(POD_NAME", vars), "$(POD_NAME");
        assert_eq!(expand_k8s_vars("a$b $", vars), "a$b $");
        assert_eq!(expand_k8s_vars("$$$$", vars), "$$");
        assert_eq!(expand_k8s_vars("é$(NS)ü", vars), "éteam-aü");
    }

    #[test]
    fn only_listen_urls_on_any_address_are_rewritten() {
        let ip = Ipv4Addr::new(127, 20, 1, 3);
        let args: Vec<String> = [
            "--listen-client-urls=http://0.0.0.0:2379,http://127.0.0.1:2379",
            "--listen-peer-urls",
            "https://0.0.0.0:2380",
            "--advertise-client-urls=http://0.0.0.0:2379",
            "-listen-metrics-urls=http://0.0.0.0:2381",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = substitute_listen_urls(&args, ip);
        assert_eq!(
            out,
            vec![
                "--listen-client-urls=http://127.20.1.3:2379,http://127.0.0.1:2379",
                "--listen-peer-urls",
                "https://127.20.1.3:2380",
                "--advertise-client-urls=http://0.0.0.0:2379",
                "-listen-metrics-urls=http://127.20.1.3:2381",
            ]
        );
        assert_eq!(
            client_listen_addr(&out),
            Some("127.20.1.3:2379".parse().unwrap())
        );
    }

    #[test]
    fn images_map_by_exact_name_then_tag() {
        let bin = std::env::current_exe().unwrap();
        let table = ImageTable::empty()
            .with_tag("v3.5.1", &bin)
            .with_image("example/etcd:custom", &bin);
        assert_eq!(
            table.resolve("gcr.io/etcd-development/etcd:v3.5.1"),
            Some(bin.clone())
        );
        assert_eq!(
            table.resolve("localhost:5000/etcd:v3.5.1@sha256:abc"),
            Some(bin.clone())
        );
        assert_eq!(table.resolve("example/etcd:custom"), Some(bin));
        assert_eq!(table.resolve("gcr.io/etcd-development/etcd:v3.6.0"), None);
        assert_eq!(table.resolve("localhost:5000/etcd"), None);
    }
}
