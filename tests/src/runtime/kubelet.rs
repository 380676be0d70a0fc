//! The kubelet: the lifecycle of every pod this runtime runs. Init
//! containers in order, then the main container as a process, restarted
//! with backoff when it exits; readiness (in node mode the startup, liveness
//! and readiness probes of [`super::probes`]); graceful deletion; and the
//! pod status, written through the status subresource when it changes. What
//! a container starts with comes from the other rooms: its binary from the
//! image table, its env, its volumes, its IP and hosts file.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::env::expand_k8s_vars;
use super::network::{client_listen_addr, substitute_listen_urls};
use super::probes::{Probes, http_probe};
use super::state::{Inner, Mode, PodKey, PodRun, State, Waiting, is_status_code, now_rfc3339};
use crate::etcd_harness::{EtcdProcess, ProcessSpec};

const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A container that ran this long restarts with the initial backoff again.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

const TERMINATION_GRACE: Duration = Duration::from_secs(5);

const READY_PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Stops the processes of `runs` together: SIGTERM, SIGKILL after the grace
/// period.
pub(super) async fn stop_all(runs: Vec<PodRun>) {
    futures::future::join_all(
        runs.into_iter()
            .filter_map(|r| r.process)
            .map(|p| async move {
                p.terminate(TERMINATION_GRACE).await;
            }),
    )
    .await;
}

impl Inner {
    pub(super) fn log_file(&self, namespace: &str, pod: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{pod}.log"))
    }

    pub(super) async fn run_kubelet(&self, state: &mut State) -> Result<()> {
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

    /// One pod's kubelet pass; true when it is running and ready.
    async fn run_pod(&self, state: &mut State, key: &PodKey, pod: &Pod) -> Result<bool> {
        let ip = state.ips[key];
        let run = state
            .pods
            .entry(key.clone())
            .or_insert_with(|| self.new_pod_run(key, pod));

        // A pod being deleted (seeded with deletionTimestamp): stop it.
        if pod.metadata.deletion_timestamp.is_some() {
            self.stop_deleted(pod, run).await?;
            return Ok(false);
        }

        // Exited? Schedule a restart with backoff.
        run.note_exit();

        // Main containers start only after every init container exited 0.
        let initialized = self.advance_init_containers(pod, ip, run).await;
        if initialized && run.process.is_none() && Instant::now() >= run.next_start {
            self.start_main_container(pod, ip, run).await;
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
        let ready = alive && emulated_readiness(run).await;
        self.report_status(key, pod, run, ip, alive, ready).await?;
        Ok(ready)
    }

    /// What the kubelet knows of a pod it has not seen before: nothing ran
    /// yet, its first container may start at once.
    fn new_pod_run(&self, key: &PodKey, pod: &Pod) -> PodRun {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let pod_dir = self
            .root
            .join("pods")
            .join(format!("{}_{}_{}", key.0, key.1, uid));
        PodRun {
            uid,
            pod_dir,
            log_file: self.log_file(&key.0, &key.1),
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
        }
    }

    /// Stops a pod being deleted: its container gets SIGTERM and the grace
    /// period, an init container is killed; in node mode the pod object is
    /// then removed, as the kubelet does.
    async fn stop_deleted(&self, pod: &Pod, run: &mut PodRun) -> Result<()> {
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
        Ok(())
    }

    /// Starts the pod's main container (a restart counts as one); a start
    /// that fails leaves why as the container's waiting state.
    async fn start_main_container(&self, pod: &Pod, ip: Ipv4Addr, run: &mut PodRun) {
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
        // An init container that runs etcd (the recovery's force) listens
        // where the pod's etcd would.
        let argv = substitute_listen_urls(&argv, ip);
        self.spawn_logged(run, &what, binary, argv, env, &mounts)
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
}

impl PodRun {
    /// When the main container has exited: records how (`lastState`), and
    /// schedules its restart after the backoff, which doubles up to its
    /// maximum and starts over after a container that ran long enough.
    fn note_exit(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let Some(status) = self.process.as_ref().and_then(EtcdProcess::exit_status) else {
            return;
        };
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        let ran = self
            .container_started
            .as_ref()
            .map(|(at, _)| at.elapsed())
            .unwrap_or_default();
        if ran >= BACKOFF_RESET_AFTER {
            self.backoff = BACKOFF_START;
        }
        self.last_terminated = Some(json!({
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": self.container_started.as_ref().map(|(_, s)| s.clone()),
            "finishedAt": now_rfc3339(),
        }));
        self.process = None;
        self.next_start = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.waiting = Some(Waiting::new(
            "CrashLoopBackOff",
            format!("back-off restarting the container (exit code {code})"),
        ));
    }
}

/// Emulated mode: a running container is ready when its HTTP readiness
/// probe passes, or without one when its client port accepts TCP.
async fn emulated_readiness(run: &PodRun) -> bool {
    match (&run.readiness_http, run.client_addr) {
        (Some((addr, path)), _) => http_probe(*addr, path).await,
        (None, Some(addr)) => matches!(
            tokio::time::timeout(READY_PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
            Ok(Ok(_))
        ),
        (None, None) => true,
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
