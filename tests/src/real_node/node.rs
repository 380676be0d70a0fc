//! One real Node: a kubelet and the containerd it alone talks to (a kubelet
//! removes containers it does not know, so two kubelets never share one),
//! each with its own root, state, socket and configuration in the node's
//! directory.
//!
//! Both run in a PID and mount namespace of their own (`unshare --pid --fork
//! --kill-child --mount-proc`), started by a small script that is the
//! namespace's first process. Killing that process (the test ends, panics, or
//! stops the node) makes the kernel kill every process of the namespace:
//! kubelet, containerd, the shims (which leave containerd's process group
//! on purpose) and every container. Every mount they make (image layers,
//! Secret volumes, network namespace pins) is in the node's mount namespace
//! and goes with it. In that namespace the node also gets its own `/run`,
//! `/var/log` and `/var/lib` (containerd's shim sockets, runc's state, the
//! kubelet's log links, the CNI result cache: paths the programs do not let
//! us choose) and sees the kernel settings the kubelet insists on as files
//! (`protectKernelDefaults`), so the machine's are never read or written.
//!
//! What outlives the namespace: the cgroups under the node's
//! `--cgroup-root` and the node's directory, removed when the node is
//! dropped or, after a test process was killed, by the next node started on
//! the machine (both names carry the test's pid).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

use super::network::{PodNetwork, cni_config};
use super::registry::LocalRegistry;
use super::tools::NodeTools;
use crate::etcd_harness::{EtcdProcess, ProcessSpec, random_u64};

/// The sandbox image every node's containerd starts for each pod (built by
/// `hack/upstream/node-images.sh` from the Kubernetes pin's `pause.c`).
pub const SANDBOX_IMAGE_PREFIX: &str = "registry.k8s.io/pause:";
/// Where the machine mounts its cgroup hierarchies (v1, or hybrid with v2
/// at `unified`; `hugetlb` is not mounted here, and both kubelet and
/// containerd are told to do without it).
const CGROUP_V1: &str = "/sys/fs/cgroup";
/// The kernel settings the kubelet requires, as `/proc/sys` paths.
const KERNEL_TUNABLES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// What a node is started with.
pub struct NodeSpec<'a> {
    pub name: String,
    /// A kubeconfig of the node's plane (the kubelet's credentials).
    pub kubeconfig: PathBuf,
    /// The cluster DNS address the kubelet writes into pods.
    pub cluster_dns: Ipv4Addr,
    /// The sandbox image's full name.
    pub sandbox_image: String,
    pub registry: &'a LocalRegistry,
    pub network: &'a PodNetwork,
    pub tools: &'a NodeTools,
    /// The test CSI driver's node half, when the world runs it.
    pub csi: Option<crate::csi::deploy::NodeCsi>,
}

/// A running node (see the module docs).
pub struct RealNode {
    name: String,
    address: Ipv4Addr,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    sandbox: Option<EtcdProcess>,
    cgroup_root: String,
}

impl RealNode {
    /// Writes the node's configuration and starts its sandbox; returns once
    /// containerd answers (the kubelet registers the Node on its own: wait
    /// for it with [`RealNode::wait_ready`]).
    pub async fn start(spec: &NodeSpec<'_>) -> Result<RealNode> {
        remove_stale_node_dirs();
        // The pid names the test process the directory belongs to.
        let dir = tempfile::Builder::new()
            .prefix(&format!(
                "{CGROUP_PREFIX}{}-{}-",
                std::process::id(),
                spec.name
            ))
            .tempdir()?;
        let path = dir.path().to_path_buf();
        let (k, address) = spec.network.add_node()?;
        // Unique per node and run: several test processes share the machine's cgroups.
        let cgroup_root = new_cgroup_root(&spec.name);
        make_cgroup_root(&cgroup_root)?;
        let mut node = RealNode {
            name: spec.name.clone(),
            address,
            dir: Some(dir),
            path: path.clone(),
            sandbox: None,
            cgroup_root,
        };
        node.write_files(spec, k)?;
        let script = path.join("node.sh");
        std::fs::write(&script, NODE_SCRIPT)?;
        let sandbox = EtcdProcess::spawn(&ProcessSpec {
            binary: "unshare".into(),
            args: vec![
                "--pid".into(),
                "--fork".into(),
                "--kill-child".into(),
                "--mount-proc".into(),
                "bash".into(),
                script.display().to_string(),
                path.display().to_string(),
                spec.tools.containerd.display().to_string(),
                spec.tools.kubelet.display().to_string(),
            ],
            env: vec![("PATH".into(), node_path(spec.tools))],
            log_file: path.join("node.log"),
            hosts_file: None,
        })?;
        node.sandbox = Some(sandbox);
        node.wait_containerd(Duration::from_secs(30)).await?;
        Ok(node)
    }

    /// containerd's config, the CNI network, the registry mirrors, the
    /// kubelet's config and the kernel-setting files.
    fn write_files(&self, spec: &NodeSpec<'_>, k: u8) -> Result<()> {
        let p = &self.path;
        for sub in ["net.d", "certs.d", "sysctl", "kubelet", "pod-logs", "ipam"] {
            std::fs::create_dir_all(p.join(sub))?;
        }
        std::fs::write(p.join("containerd.toml"), containerd_config(p, spec))?;
        std::fs::write(
            p.join("net.d/10-etcdfleet.conflist"),
            cni_config(k, &p.join("ipam")),
        )?;
        spec.registry.write_hosts_dir(&p.join("certs.d"))?;
        std::fs::write(
            p.join("kubelet.yaml"),
            kubelet_config(p, self.address, spec.cluster_dns, &self.cgroup_root),
        )?;
        std::fs::copy(&spec.kubeconfig, p.join("kubelet.kubeconfig"))?;
        let args = [
            format!("--config={}", p.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", p.join("kubelet.kubeconfig").display()),
            format!("--root-dir={}", p.join("kubelet").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.address),
            "--v=2".into(),
        ];
        // One argument per line, read back by the node script (mapfile).
        std::fs::write(p.join("kubelet.args"), args.join("\n") + "\n")?;
        if let Some(csi) = &spec.csi {
            std::fs::write(
                p.join("csi.args"),
                csi.command(&self.name, &p.join("kubelet")),
            )?;
        }
        for (name, value) in KERNEL_TUNABLES {
            std::fs::write(p.join("sysctl").join(name.replace('/', ".")), value)?;
        }
        Ok(())
    }

    async fn wait_containerd(&self, timeout: Duration) -> Result<()> {
        let socket = self.path.join("containerd.sock");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if socket.exists() && self.log_has("containerd.log", "containerd successfully booted") {
                return Ok(());
            }
            if !self.is_running() {
                bail!("node {} stopped:\n{}", self.name, self.log_tails(30));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "containerd of node {} not up:\n{}",
            self.name,
            self.log_tails(30)
        )
    }

    /// Waits until the kubelet registered the Node and reports it Ready.
    pub async fn wait_ready(&self, client: &Client, timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            let ready = api.get_opt(&self.name).await?.is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                return Ok(());
            }
            if !self.is_running() {
                bail!("node {} stopped:\n{}", self.name, self.log_tails(40));
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {} not Ready within {timeout:?}:\n{}",
                    self.name,
                    self.log_tails(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log_has(&self, file: &str, text: &str) -> bool {
        std::fs::read_to_string(self.path.join(file)).is_ok_and(|t| t.contains(text))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Node's InternalIP (on the world's bridge).
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The node's directory: configs, logs, containerd's and kubelet's roots.
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// The node's cgroup in the memory hierarchy (removed with the node).
    pub fn cgroup_dir(&self) -> PathBuf {
        Path::new(CGROUP_V1)
            .join("memory")
            .join(self.cgroup_root.trim_start_matches('/'))
    }

    pub fn is_running(&self) -> bool {
        self.sandbox.as_ref().is_some_and(|s| s.is_running())
    }

    /// The peak memory (bytes, page cache included, as the kernel charges
    /// it against a limit) of the container with the CRI id `container_id`
    /// (a pod status' `containerID` less `containerd://`), if it runs here:
    /// its cgroup is `<cgroup root>/kubepods/<qos>/pod<uid>/<id>`.
    pub fn container_memory_peak(&self, container_id: &str) -> Option<u64> {
        let dir = self.container_cgroup(container_id)?;
        let text = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes")).ok()?;
        text.trim().parse().ok()
    }

    /// What the kernel counts now for the container with the CRI id
    /// `container_id`, if it runs here: its anonymous memory (`rss` of
    /// `memory.stat`, page cache not included: what a limit cannot reclaim)
    /// and the processes the OOM killer killed in it (`oom_kill` of
    /// `memory.oom_control`).
    pub fn container_memory(&self, container_id: &str) -> Option<ContainerMemory> {
        let dir = self.container_cgroup(container_id)?;
        let field = |file: &str, key: &str| -> Option<u64> {
            let text = std::fs::read_to_string(dir.join(file)).ok()?;
            let line = text.lines().find(|l| l.split(' ').next() == Some(key))?;
            line.split(' ').nth(1)?.parse().ok()
        };
        Some(ContainerMemory {
            anonymous: field("memory.stat", "rss")?,
            oom_kills: field("memory.oom_control", "oom_kill")?,
        })
    }

    /// The container's cgroup in the memory hierarchy:
    /// `<cgroup root>/kubepods/<qos>/pod<uid>/<id>`.
    fn container_cgroup(&self, container_id: &str) -> Option<PathBuf> {
        let mut dirs = Vec::new();
        collect_dirs(&self.cgroup_dir(), &mut dirs);
        dirs.into_iter().find(|d| d.ends_with(container_id))
    }

    /// Stops the node as a machine stops: every process of it is killed at
    /// once (its pods stay bound to it in the API, as on a real outage; the
    /// Node turns NotReady only if the plane runs the node lifecycle
    /// controller, which the real tier does not yet).
    pub async fn stop(&self) {
        if let Some(sandbox) = &self.sandbox {
            sandbox.kill().await;
        }
        remove_cgroup_root(&self.cgroup_root);
    }

    /// The last lines of the node's own, containerd's and kubelet's logs,
    /// then of every container log the kubelet kept
    /// (`<pod-logs>/<namespace>_<pod>_<uid>/<container>/<restart>.log`).
    /// The CSI driver's log and the kubelet's lines about plugins and CSI.
    pub fn csi_log_tails(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.path.join(f)).unwrap_or_default();
        let kubelet = read("kubelet.log");
        let about: Vec<&str> = (kubelet.lines())
            .filter(|l| l.contains("plugin") || l.contains("csi") || l.contains("CSI"))
            .collect();
        format!(
            "\n--- {} csi.log ---\n{}\n--- {} kubelet.log (plugins) ---\n{}",
            self.name,
            read("csi.log"),
            self.name,
            about[about.len().saturating_sub(30)..].join("\n")
        )
    }

    pub fn log_tails(&self, lines: usize) -> String {
        let mut files: Vec<PathBuf> = ["node.log", "containerd.log", "kubelet.log", "csi.log"]
            .iter()
            .map(|f| self.path.join(f))
            .collect();
        let mut container_logs = Vec::new();
        collect_files(&self.path.join("pod-logs"), &mut container_logs);
        container_logs.sort();
        files.extend(container_logs);
        files
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n");
                let short = f.strip_prefix(&self.path).unwrap_or(f);
                format!("\n--- {} {} ---\n{tail}", self.name, short.display())
            })
            .collect()
    }
}

/// A container's memory as its cgroup counts it ([`RealNode::container_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerMemory {
    /// Anonymous memory (bytes), page cache not included.
    pub anonymous: u64,
    /// Processes killed by the OOM killer in the container's cgroup.
    pub oom_kills: u64,
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // Killing the namespace's first process kills the whole namespace.
        drop(self.sandbox.take());
        remove_cgroup_root(&self.cgroup_root);
        if (std::thread::panicking() || std::env::var_os("ETCDFLEET_KEEP_PODS").is_some())
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "real node {}: files kept in {}",
                self.name,
                dir.keep().display()
            );
        }
    }
}

/// The node script's PATH: runc and the shim next to containerd first.
fn node_path(tools: &NodeTools) -> String {
    let dir = |p: &Path| {
        p.parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default()
    };
    format!(
        "{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        dir(&tools.containerd),
        dir(&tools.runc)
    )
}

/// The first process of a node's namespaces. Arguments: the node's
/// directory, containerd, kubelet. Exits (and so ends the node) when
/// containerd or the kubelet exits.
const NODE_SCRIPT: &str = r#"set -euo pipefail
d="$1" containerd="$2" kubelet="$3"
# Paths containerd, runc, the CNI plugins and the kubelet write to without
# a setting to move them: the node's own, gone with its mount namespace.
mount -t tmpfs etcdfleet-node-run /run
mount -t tmpfs etcdfleet-node-log /var/log
mount -t tmpfs etcdfleet-node-lib /var/lib
mkdir -p /var/lib/cni
# The kernel settings the kubelet checks (protectKernelDefaults): files here.
for f in "$d"/sysctl/*; do
  mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
"$containerd" --config "$d/containerd.toml" >>"$d/containerd.log" 2>&1 &
for _ in $(seq 1 400); do [ -S "$d/containerd.sock" ] && break; sleep 0.05; done
# The test CSI driver's node half, when the world runs it: in the node's
# mount namespace, so its bind mounts are the ones kubelet and containerd see.
if [ -f "$d/csi.args" ]; then
  mapfile -t csi <"$d/csi.args"
  "${csi[@]}" >>"$d/csi.log" 2>&1 &
fi
mapfile -t args <"$d/kubelet.args"
"$kubelet" "${args[@]}" >>"$d/kubelet.log" 2>&1 &
set +e
wait -n
echo "node: containerd, kubelet or the CSI driver exited ($?); the node stops"
"#;

/// containerd 1.6's configuration: its own root, state and socket in the
/// node's directory, CRI with runc (cgroupfs, as the kubelet), the sandbox
/// image from the test's registry, the CNI network of this node, registry
/// mirrors from `certs.d`, network namespace pins under its state, OOM
/// scores never below its own.
fn containerd_config(dir: &Path, spec: &NodeSpec<'_>) -> String {
    let d = dir.display();
    let cni = spec.tools.cni_dir.display();
    let sandbox = &spec.sandbox_image;
    format!(
        r#"version = 2
root = "{d}/containerd"
state = "{d}/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  tolerate_missing_hugepages_controller = true
  # The machine grants no CAP_SYS_RESOURCE: no process may lower its OOM
  # score (the sandbox's -998 fails runc's init), so scores are clamped to
  # containerd's own, as for rootless nodes.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{d}/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd-opt"
"#
    )
}

/// The kubelet's configuration (see `docs/development.md`, "Real nodes"
/// for why each setting): serving on the node's own address, cgroupfs under
/// the node's own cgroup root on cgroup v1, the node's containerd, cluster
/// DNS of its plane, no host resolv.conf, pod logs in the node's directory,
/// anonymous access to its API (only the test's namespace reaches it).
fn kubelet_config(dir: &Path, address: Ipv4Addr, dns: Ipv4Addr, cgroup_root: &str) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{address}"
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: "unix://{d}/containerd.sock"
cgroupDriver: cgroupfs
cgroupRoot: "{cgroup_root}"
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
makeIPTablesUtilChains: false
clusterDNS: ["{dns}"]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: "{d}/pod-logs"
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 0s
shutdownGracePeriod: 0s
"#
    )
}

/// Every cgroup hierarchy the machine mounts (v1 controllers, the named
/// `systemd` one, and the hybrid layout's `unified` v2 tree: runc makes the
/// node's cgroups in each).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let is_cgroup = matches!(fields.get(2), Some(&"cgroup") | Some(&"cgroup2"));
            (is_cgroup && fields[1].starts_with(CGROUP_V1)).then(|| PathBuf::from(fields[1]))
        })
        .collect()
}

/// The prefix of every node's `--cgroup-root`, then the test process's pid:
/// a root whose process is gone was left by a killed test.
const CGROUP_PREFIX: &str = "etcdfleet-node-";

/// Whether `name` (`etcdfleet-node-<pid>-...`) belongs to a test process
/// that is gone: a killed test's node left it behind.
fn left_by_a_dead_test(name: &str) -> bool {
    name.strip_prefix(CGROUP_PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Node directories of killed tests (containerd's image layers are most of
/// their size; their mounts died with the node's mount namespace).
fn remove_stale_node_dirs() {
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if left_by_a_dead_test(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A new `--cgroup-root` for `node`, unique per run; the roots that killed
/// test processes left are removed first (their processes died with them).
fn new_cgroup_root(node: &str) -> String {
    for h in cgroup_hierarchies() {
        for e in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            if left_by_a_dead_test(&e.file_name().to_string_lossy()) {
                remove_tree(&e.path(), Instant::now() + Duration::from_secs(1));
            }
        }
    }
    format!(
        "/{CGROUP_PREFIX}{}-{:08x}-{node}",
        std::process::id(),
        random_u64() as u32
    )
}

/// `--cgroup-root` must exist in every hierarchy before the kubelet starts;
/// a new cpuset cgroup takes its parent's CPUs and memory nodes.
fn make_cgroup_root(root: &str) -> Result<()> {
    for h in cgroup_hierarchies() {
        let dir = h.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if h.ends_with("cpuset") {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(h.join(f))?;
                std::fs::write(dir.join(f), parent.trim())?;
            }
        }
    }
    Ok(())
}

/// Removes the node's cgroups, deepest first, once their processes are gone
/// (the namespace's processes die asynchronously after its first one).
fn remove_cgroup_root(root: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for h in cgroup_hierarchies() {
        remove_tree(&h.join(root.trim_start_matches('/')), deadline);
    }
}

fn remove_tree(top: &Path, deadline: Instant) {
    while top.exists() && Instant::now() < deadline {
        let mut dirs = Vec::new();
        collect_dirs(top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        if !dirs.iter().all(|d| std::fs::remove_dir(d).is_ok()) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => collect_files(&e.path(), out),
            Ok(_) => out.push(e.path()),
            Err(_) => {}
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}
