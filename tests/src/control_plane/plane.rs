//! One control plane as processes of the test: where the Kubernetes
//! binaries are, the storage etcd several planes share, and a
//! [`ControlPlane`] (kube-apiserver with its PKI, token file and audit
//! policy; kube-controller-manager with the controllers it is asked for;
//! kube-scheduler), started, waited for and stopped with the test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use etcdfleet_controllers::pki::{CertUsage, CertificateAuthority, LeafSpec};
use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use super::audit::AuditLog;
use crate::controller_process::kubeconfig;
use crate::etcd_harness::{EtcdProcess, ProcessSpec, free_ports, random_u64, workspace_root};
use crate::real_node::PlaneAddresses;
use crate::real_node::network::GATEWAY;

/// The user of the admin token: `system:masters`.
pub const ADMIN_USER: &str = "test-admin";

/// The built Kubernetes binaries (`.tools/kubernetes`, or
/// `ETCDFLEET_KUBERNETES_DIR`).
#[derive(Debug, Clone)]
pub struct KubeBinaries {
    pub dir: PathBuf,
}

impl KubeBinaries {
    pub fn locate() -> KubeBinaries {
        let dir = std::env::var_os("ETCDFLEET_KUBERNETES_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(".tools/kubernetes"));
        KubeBinaries { dir }
    }

    pub fn apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }
    pub fn controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }
    pub fn scheduler(&self) -> PathBuf {
        self.dir.join("kube-scheduler")
    }
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }

    fn missing(&self) -> Option<PathBuf> {
        [
            self.apiserver(),
            self.controller_manager(),
            self.scheduler(),
            self.kubectl(),
        ]
        .into_iter()
        .find(|p| !p.is_file())
    }

    /// `Kubernetes v1.37.2`, as the API server prints it.
    pub fn version(&self) -> Result<String> {
        let out = std::process::Command::new(self.apiserver())
            .arg("--version")
            .output()
            .context("kube-apiserver --version")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// The Kubernetes binaries, or `None` after a loud `SKIPPED:` line when they
/// are missing. Under `ETCDFLEET_REQUIRE_ETCD=1` (the Makefile's test
/// command) a missing binary panics: CI never skips the real tier silently.
pub fn require_kubernetes() -> Option<KubeBinaries> {
    let binaries = KubeBinaries::locate();
    let Some(missing) = binaries.missing() else {
        return Some(binaries);
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let message = format!(
        "{test}: Kubernetes binary {} not found (run hack/upstream/build.sh)",
        missing.display()
    );
    if std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() == Ok("1") {
        panic!("ETCDFLEET_REQUIRE_ETCD=1 but {message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

/// The etcd the API servers of one test process store their objects in
/// (the newest etcd the test command builds, without fsync).
pub struct StorageEtcd {
    process: EtcdProcess,
    url: String,
    _dir: tempfile::TempDir,
}

impl StorageEtcd {
    pub async fn start(etcd: &Path) -> Result<StorageEtcd> {
        let dir = tempfile::Builder::new()
            .prefix("etcdfleet-kube-etcd-")
            .tempdir()?;
        let ports = free_ports(2)?;
        let url = format!("http://127.0.0.1:{}", ports[0]);
        let peer = format!("http://127.0.0.1:{}", ports[1]);
        let args = vec![
            format!("--data-dir={}", dir.path().join("data").display()),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        let process = EtcdProcess::spawn(&ProcessSpec {
            binary: etcd.to_path_buf(),
            args,
            env: vec![],
            log_file: dir.path().join("etcd.log"),
            hosts_file: None,
        })?;
        let storage = StorageEtcd {
            process,
            url,
            _dir: dir,
        };
        storage.wait_healthy(Duration::from_secs(30)).await?;
        Ok(storage)
    }

    async fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let addr = self.url.trim_start_matches("http://").parse()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((200, body)) = crate::controller_process::http_get(addr, "/health")
                && body.contains("true")
            {
                return Ok(());
            }
            if !self.process.is_running() {
                bail!("storage etcd exited:\n{}", self.process.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("storage etcd not healthy:\n{}", self.process.log_tail(20))
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Which controllers a plane's kube-controller-manager runs, and whether it
/// has a scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controllers {
    /// A management cluster: namespaces and garbage collection (owner
    /// references of the controller's PKI Secrets), service accounts, and
    /// what runs the controller's Deployment (with kube-scheduler).
    Management,
    /// A workload cluster: everything etcd pods need (see the module docs),
    /// and kube-scheduler.
    Workload,
}

impl Controllers {
    fn names(self) -> &'static str {
        match self {
            Controllers::Management => {
                "deployment,replicaset,garbagecollector,namespace,serviceaccount,\
                 root-ca-cert-publisher,disruption"
            }
            Controllers::Workload => {
                "statefulset,garbagecollector,persistentvolume-binder,pvc-protection,\
                 pv-protection,namespace,disruption,serviceaccount,root-ca-cert-publisher"
            }
        }
    }
}

/// One cluster's kube-apiserver, kube-controller-manager and (workload
/// planes) kube-scheduler. See the module docs.
pub struct ControlPlane {
    name: String,
    url: String,
    /// Where pods on real nodes reach the API server (the bridge's gateway).
    pod_url: Option<String>,
    ca_pem: String,
    admin_token: String,
    tokens: Vec<(String, String)>,
    etcd_prefix: String,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    apiserver: EtcdProcess,
    others: Vec<EtcdProcess>,
}

/// Bearer tokens of the plane's token file: `(user, groups)`.
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl ControlPlane {
    /// Starts a plane named `name` on `storage`, with a token for each user
    /// of `users` besides the admin. Returns once the API server is ready
    /// and (workload planes) the default StorageClass exists.
    pub async fn start(
        binaries: &KubeBinaries,
        storage: &StorageEtcd,
        name: &str,
        controllers: Controllers,
        users: &[User],
    ) -> Result<ControlPlane> {
        Self::start_with(binaries, storage, name, controllers, users, None).await
    }

    /// As [`ControlPlane::start`]; with `pods`, the plane serves real nodes
    /// ([`crate::real_node`]): the API server listens on every address of
    /// the test's own network namespace (pods reach it through the bridge),
    /// its certificate names the pods' gateway and its `kubernetes` Service
    /// IP, its Services come from the plane's own range, and workload planes
    /// run the EndpointSlice controller that cluster DNS answers from.
    pub async fn start_with(
        binaries: &KubeBinaries,
        storage: &StorageEtcd,
        name: &str,
        controllers: Controllers,
        users: &[User],
        pods: Option<&PlaneAddresses>,
    ) -> Result<ControlPlane> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("etcdfleet-kube-{name}-"))
            .tempdir()?;
        let path = dir.path().to_path_buf();
        let pki = PlanePki::write(&path, pods)?;
        let mut tokens = vec![(ADMIN_USER.to_string(), token())];
        tokens.extend(users.iter().map(|u| (u.name.clone(), token())));
        write_token_file(&path, &tokens, users)?;
        std::fs::write(path.join("audit-policy.yaml"), AUDIT_POLICY)?;
        let port = free_ports(1)?[0];
        let url = format!("https://127.0.0.1:{port}");
        // Unique per plane and per run: planes of one process share the etcd.
        let etcd_prefix = format!("/{name}-{:08x}", random_u64() as u32);
        let args = apiserver_args(&path, storage, &etcd_prefix, port, pods);
        let apiserver = spawn(binaries.apiserver(), args, &path.join("kube-apiserver.log"))?;
        let mut plane = ControlPlane {
            name: name.to_string(),
            url,
            pod_url: pods.map(|_| format!("https://{GATEWAY}:{port}")),
            ca_pem: pki.ca_pem,
            admin_token: tokens[0].1.clone(),
            tokens,
            etcd_prefix,
            dir: Some(dir),
            path,
            apiserver,
            others: Vec::new(),
        };
        plane.wait_ready(Duration::from_secs(90)).await?;
        plane.start_controllers(binaries, controllers, pods.is_some())?;
        if controllers == Controllers::Workload {
            plane.create_default_storage_class().await?;
        }
        Ok(plane)
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let client = self.admin_client().await?;
        let deadline = Instant::now() + timeout;
        loop {
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(req).await {
                Ok(text) if text.trim() == "ok" => return Ok(()),
                _ if !self.apiserver.is_running() => {
                    bail!(
                        "kube-apiserver {} exited:\n{}",
                        self.name,
                        self.apiserver.log_tail(30)
                    )
                }
                _ if Instant::now() >= deadline => bail!(
                    "kube-apiserver {} not ready within {timeout:?}:\n{}",
                    self.name,
                    self.apiserver.log_tail(30)
                ),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn start_controllers(
        &mut self,
        binaries: &KubeBinaries,
        controllers: Controllers,
        real_nodes: bool,
    ) -> Result<()> {
        let kubeconfig = self.path.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, self.admin_kubeconfig())?;
        let kc = format!("--kubeconfig={}", kubeconfig.display());
        let mut names = controllers.names().to_string();
        // Real nodes: cluster DNS answers from EndpointSlices, and a stopped
        // node turns NotReady (its pods not ready, new pods kept off it) as
        // in any cluster, 20 s after its kubelet's last word (50 s by
        // default).
        let real_workload = real_nodes && controllers == Controllers::Workload;
        if real_workload {
            names.push_str(",endpointslice,nodelifecycle");
        }
        let mut kcm = vec![
            kc.clone(),
            format!("--controllers={names}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=false".into(),
            format!("--root-ca-file={}", self.path.join("ca.crt").display()),
            "--concurrent-statefulset-syncs=5".into(),
            "--v=1".into(),
        ];
        if controllers == Controllers::Workload {
            kcm.push("--enable-hostpath-provisioner".into());
        }
        if real_workload {
            kcm.push("--node-monitor-grace-period=20s".into());
        }
        let log = self.path.join("kube-controller-manager.log");
        self.others
            .push(spawn(binaries.controller_manager(), kcm, &log)?);
        {
            let scheduler = vec![
                kc,
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ];
            let log = self.path.join("kube-scheduler.log");
            self.others
                .push(spawn(binaries.scheduler(), scheduler, &log)?);
        }
        Ok(())
    }

    async fn create_default_storage_class(&self) -> Result<()> {
        use k8s_openapi::api::storage::v1::StorageClass;
        let class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "standard",
                "annotations": { "storageclass.kubernetes.io/is-default-class": "true" }
            },
            "provisioner": "kubernetes.io/host-path",
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate"
        }))?;
        kube::Api::<StorageClass>::all(self.admin_client().await?)
            .create(&Default::default(), &class)
            .await?;
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API server's port (on loopback, and on every address of a
    /// real-node world's network namespace).
    pub fn port(&self) -> u16 {
        self.url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("the plane's URL ends with its port")
    }

    /// The CA that signed the API server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The key prefix this plane's API server stores objects under in the
    /// storage etcd (`--etcd-prefix`).
    pub fn etcd_prefix(&self) -> &str {
        &self.etcd_prefix
    }

    /// Where this plane's files and logs are.
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// A kubeconfig authenticating with `user`'s token (the admin, or a
    /// user given at start).
    pub fn kubeconfig_for(&self, user: &str) -> String {
        kubeconfig(&self.url, &self.token_of(user), Some(&self.ca_pem))
    }

    /// As [`ControlPlane::kubeconfig_for`], with the address pods reach the
    /// API server at: what a kubeconfig Secret read by a controller pod must
    /// name (the same as [`ControlPlane::url`] without real nodes).
    pub fn kubeconfig_for_pods(&self, user: &str) -> String {
        let url = self.pod_url.as_deref().unwrap_or(&self.url);
        kubeconfig(url, &self.token_of(user), Some(&self.ca_pem))
    }

    /// A kubeconfig authenticating with a bearer token.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        kubeconfig(&self.url, token, Some(&self.ca_pem))
    }

    pub fn admin_kubeconfig(&self) -> String {
        self.kubeconfig_with_token(&self.admin_token)
    }

    fn token_of(&self, user: &str) -> String {
        self.tokens
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("plane {} has no token for user {user:?}", self.name))
    }

    pub async fn admin_client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.admin_kubeconfig()).await
    }

    /// An admin client that returns the API server's first answer: kube's
    /// default client retries 429, 503 and 504 (after `Retry-After`), which
    /// would hide, say, an eviction the PodDisruptionBudget refused.
    pub async fn admin_client_without_retries(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::from_yaml(&self.admin_kubeconfig())?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }

    /// A client as `user` (a user given at start).
    pub async fn client_as(&self, user: &str) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig_for(user)).await
    }

    /// The admin kubeconfig as a file, for kubectl.
    pub fn admin_kubeconfig_file(&self) -> PathBuf {
        self.path.join("admin.kubeconfig")
    }

    /// `kubectl` as the admin of this plane.
    pub fn kubectl(&self, binaries: &KubeBinaries) -> std::process::Command {
        let mut cmd = std::process::Command::new(binaries.kubectl());
        cmd.env("KUBECONFIG", self.admin_kubeconfig_file());
        cmd
    }

    /// The kube-apiserver process (for its CPU time and peak RSS).
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.pid()
    }

    /// Every request the API server audited so far.
    pub fn audit(&self) -> Result<AuditLog> {
        AuditLog::read(&self.path.join("audit.log"))
    }

    /// The last lines of each process's log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for p in std::iter::once(&self.apiserver).chain(&self.others) {
            let _ = write!(
                out,
                "\n--- {} ---\n{}",
                p.log_file().display(),
                p.log_tail(lines)
            );
        }
        out
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if (std::thread::panicking() || std::env::var_os("ETCDFLEET_KEEP_PODS").is_some())
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "control plane {}: logs kept in {}",
                self.name,
                dir.keep().display()
            );
        }
    }
}

/// A client for a kubeconfig's current context.
pub async fn client_from_kubeconfig(text: &str) -> Result<Client> {
    // Several crates of the workspace enable rustls providers: pick ring, as kube's feature says.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = Kubeconfig::from_yaml(text)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn token() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}

fn spawn(binary: PathBuf, args: Vec<String>, log: &Path) -> Result<EtcdProcess> {
    EtcdProcess::spawn(&ProcessSpec {
        binary,
        args,
        env: vec![],
        log_file: log.to_path_buf(),
        hosts_file: None,
    })
}

/// The plane's CA, the API server's serving certificate and the
/// ServiceAccount signing key, written into its directory.
struct PlanePki {
    ca_pem: String,
}

impl PlanePki {
    fn write(dir: &Path, pods: Option<&PlaneAddresses>) -> Result<PlanePki> {
        let ca = CertificateAuthority::generate("etcdfleet test Kubernetes CA")?;
        let mut ip_addresses = vec!["127.0.0.1".parse()?];
        if let Some(pods) = pods {
            ip_addresses.extend([std::net::IpAddr::V4(GATEWAY), pods.api_service_ip.into()]);
        }
        let serving = ca.issue(&LeafSpec {
            common_name: "kube-apiserver".into(),
            dns_names: vec![
                "localhost".into(),
                "kubernetes.default.svc".into(),
                "kubernetes.default.svc.cluster.local".into(),
            ],
            ip_addresses,
            usage: CertUsage::Server,
            validity_days: 30,
        })?;
        let signing = rcgen::KeyPair::generate()?;
        std::fs::write(dir.join("ca.crt"), ca.cert_pem())?;
        std::fs::write(dir.join("apiserver.crt"), &serving.cert_pem)?;
        std::fs::write(dir.join("apiserver.key"), &serving.key_pem)?;
        std::fs::write(dir.join("sa.key"), signing.serialize_pem())?;
        // The verifying side takes public keys only.
        std::fs::write(dir.join("sa.pub"), signing.public_key_pem())?;
        Ok(PlanePki {
            ca_pem: ca.cert_pem().to_string(),
        })
    }
}

/// `token,user,uid,"groups"` per line; the admin (first) is in `system:masters`.
fn write_token_file(dir: &Path, tokens: &[(String, String)], users: &[User]) -> Result<()> {
    let mut text = String::new();
    for (i, (user, token)) in tokens.iter().enumerate() {
        let groups = if i == 0 {
            "system:masters".to_string()
        } else {
            users[i - 1].groups.join(",")
        };
        if groups.is_empty() {
            writeln!(text, "{token},{user},{user}")?;
        } else {
            writeln!(text, "{token},{user},{user},\"{groups}\"")?;
        }
    }
    std::fs::write(dir.join("tokens.csv"), text)?;
    Ok(())
}

fn apiserver_args(
    dir: &Path,
    storage: &StorageEtcd,
    etcd_prefix: &str,
    port: u16,
    pods: Option<&PlaneAddresses>,
) -> Vec<String> {
    let file = |f: &str| dir.join(f).display().to_string();
    // Real nodes' pods reach the plane through the bridge of the test's own
    // network namespace: every address there is the test's.
    let (bind, advertise, services) = match pods {
        Some(p) => (
            "0.0.0.0".to_string(),
            GATEWAY.to_string(),
            p.service_cidr.clone(),
        ),
        None => (
            "127.0.0.1".into(),
            "127.0.0.1".into(),
            "10.96.0.0/24".into(),
        ),
    };
    vec![
        format!("--etcd-servers={}", storage.url()),
        format!("--etcd-prefix={etcd_prefix}"),
        format!("--bind-address={bind}"),
        format!("--advertise-address={advertise}"),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        format!("--client-ca-file={}", file("ca.crt")),
        format!("--token-auth-file={}", file("tokens.csv")),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-key-file={}", file("sa.pub")),
        format!("--service-account-signing-key-file={}", file("sa.key")),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        format!("--service-cluster-ip-range={services}"),
        "--disable-admission-plugins=TaintNodesByCondition".into(),
        "--allow-privileged=true".into(),
        "--kubelet-preferred-address-types=InternalIP".into(),
        format!("--audit-policy-file={}", file("audit-policy.yaml")),
        format!("--audit-log-path={}", file("audit.log")),
        "--audit-log-format=json".into(),
        "--audit-log-mode=blocking".into(),
        "--endpoint-reconciler-type=none".into(),
        "--v=1".into(),
    ]
}

/// Metadata of every request when its response starts (long-running ones:
/// watches, port-forward tunnels, which complete only when they close) and
/// completes ([`AuditLog`] keeps the first of the two per request).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, Panic]
rules:
- level: Metadata
";
