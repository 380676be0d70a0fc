//! The etcdfleet controller binary.
//!
//! - `run`: the controller (management client, connector, metrics and health
//!   endpoints, optional Lease leader election, one watch per namespace);
//! - `render`: offline, what the controller would write for a cluster;
//! - `plan`: offline, what the controller would do next for clusters as
//!   `kubectl get -o yaml` shows them;
//! - `migrate-storage`: rewrites every stored etcdfleet object at the CRDs'
//!   storage version and trims `status.storedVersions`;
//! - `restore-seed` / `install-seeder`: the init containers of a restoring
//!   member (run from this binary inside the etcd image);
//! - `force-new-cluster`: the init container of a cluster recovering from a
//!   lost quorum (once, on the member the recovery chose).
//!
//! The wiring is thin on purpose: decisions live in the library (`run` is
//! `etcdfleet_controllers::runner`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use etcdfleet_controllers::cli::{
    EXIT_BLOCKED, EXIT_CHANGES, EXIT_INPUT_ERROR, Manifests, plan_all, plan_exit_code,
    render_cluster,
};
use etcdfleet_controllers::config::{ControllerConfig, LogFormat, Overrides};
use etcdfleet_controllers::dialer::DialerKind;
use etcdfleet_controllers::rollout::preview::preview;
use etcdfleet_controllers::runner::{self, ClientSource};
use etcdfleet_controllers::telemetry;

#[derive(Parser)]
#[command(
    name = "etcdfleet",
    version,
    about = "Keeps the etcd clusters of many workload clusters alive, correct and up to date"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
    /// Resolve an EtcdCluster against templates and print what would be written.
    ///
    /// Every object is first validated as the API server would (CRD schema
    /// and CEL rules; unknown fields are errors offline). Exit code 2 when any
    /// input is invalid or a cluster does not resolve; the valid clusters are
    /// still rendered.
    #[command(verbatim_doc_comment)]
    Render {
        /// File with the EtcdCluster(s).
        #[arg(long)]
        cluster: PathBuf,
        /// EtcdTemplate file(s).
        #[arg(long = "template")]
        templates: Vec<PathBuf>,
        /// ClusterEtcdTemplate file(s).
        #[arg(long = "cluster-template")]
        cluster_templates: Vec<PathBuf>,
    },
    /// Print what the controller would do next for each EtcdCluster, and why;
    /// and for each EtcdFleetRollout given, its waves, what it would do to
    /// each cluster it selects, and which the version policy or the gates
    /// would refuse (where it would halt).
    ///
    /// Every object is first validated as the API server would (CRD schema
    /// and CEL rules; unknown fields are errors offline). Exit codes, for CI:
    /// 0 every cluster converged (or paused); 3 some cluster has changes to
    /// make; 4 some cluster is rejected or blocked (template does not resolve,
    /// version rejected, step blocked); 2 input errors (unreadable file, bad
    /// YAML, an object the API server would refuse). Valid clusters are
    /// planned and printed even when others are invalid. A rollout counts
    /// as changes while it would write a cluster, as blocked when it would
    /// refuse one.
    #[command(verbatim_doc_comment)]
    Plan {
        /// Multi-document YAML of EtcdClusters (with status), templates and
        /// EtcdFleetRollouts.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// How long a member may be unhealthy before it is replaced.
        #[arg(long, default_value_t = 120)]
        member_failure_grace_seconds: u64,
    },
    /// Seed a member's data directory from a snapshot (the init container of
    /// a restoring cluster's first member).
    ///
    /// Fetches the object, checks its size and SHA-256, runs `etcdutl
    /// snapshot restore` (or `etcdctl` for 3.4) into --data-dir and records
    /// a marker next to it. A data directory already restored from this
    /// snapshot is left alone (exit 0); one with other data is refused
    /// (exit 1). S3 credentials come from the environment:
    /// ETCDFLEET_RESTORE_ACCESS_KEY_ID, ETCDFLEET_RESTORE_SECRET_ACCESS_KEY,
    /// ETCDFLEET_RESTORE_SESSION_TOKEN.
    #[command(verbatim_doc_comment)]
    RestoreSeed(Box<SeedArgs>),
    /// Rewrite every stored etcdfleet object at its CRD's storage version,
    /// then trim the CRDs' status.storedVersions to it.
    ///
    /// Run once after installing a release whose CRDs changed the storage
    /// version (v1alpha1 -> v1beta1), before installing one that no longer
    /// serves the old version. Changes no object's meaning; idempotent.
    /// Needs the RBAC of config/storage-migration.
    #[command(verbatim_doc_comment)]
    MigrateStorage {
        /// Kubeconfig of the management cluster [default: in-cluster, $KUBECONFIG or ~/.kube/config].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Resolve a host name as the controller's clients do and print its
    /// addresses (a support check: does this image resolve names here?).
    #[command(hide = true)]
    Resolve {
        /// Host name.
        host: String,
    },
    /// Count the system CA certificates the object-store client verifies
    /// HTTPS endpoints with here, loaded as it loads them (a support check:
    /// does this image or host trust any CA? Exit 1 when it trusts none).
    #[command(hide = true)]
    CaCertificates,
    /// Restart a member's etcd once with --force-new-cluster (the init
    /// container of a cluster recovering from a lost quorum).
    ///
    /// On the pod --member names (and no other), unless the marker next to
    /// --data-dir names this --recovery-id: runs the etcd command line after
    /// `--` with --force-new-cluster, waits until /health on its metrics
    /// listener says healthy, stops it, and writes the marker. Exit 0 when
    /// done or nothing to do; 1 when etcd failed or the volume holds no data.
    #[command(verbatim_doc_comment)]
    ForceNewCluster(Box<ForceArgs>),
    /// Copy this etcdfleet binary to a path (mode 0755).
    ///
    /// The first init container of a restoring member runs it from the
    /// controller's image into a shared emptyDir, so `restore-seed` can run
    /// in the etcd image, next to etcdutl/etcdctl.
    #[command(verbatim_doc_comment)]
    InstallSeeder {
        /// Where to write the binary, e.g. /opt/etcdfleet/etcdfleet.
        dest: PathBuf,
    },
}

#[derive(clap::Args)]
struct ForceArgs {
    /// The pod this runs in ($(POD_NAME)).
    #[arg(long)]
    pod: String,
    /// The member the recovery chose (its pod name).
    #[arg(long)]
    member: String,
    /// The recovery (status.lastRecovery.id).
    #[arg(long)]
    recovery_id: String,
    /// etcd's --data-dir.
    #[arg(long)]
    data_dir: PathBuf,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// How long the forced etcd may take to serve.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
    /// etcd's command line, after `--`.
    #[arg(last = true)]
    etcd_args: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Configuration file (YAML, e.g. config/manager/controller.yaml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Kubeconfig of the management cluster [default: in-cluster, $KUBECONFIG or ~/.kube/config].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Namespace whose EtcdClusters this controller owns (repeatable) [file: namespaces; none: all].
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Label selector the EtcdClusters must match [file: labelSelector].
    #[arg(long)]
    label_selector: Option<String>,
    /// How long a member may be unhealthy before it is replaced [file: memberFailureGraceSeconds; default 120].
    #[arg(long)]
    member_failure_grace_seconds: Option<u64>,
    /// How long deletion retries an unreachable workload cluster before releasing the EtcdCluster [file: deletionTimeoutSeconds; default 600].
    #[arg(long)]
    deletion_timeout_seconds: Option<u64>,
    /// How often a converged cluster is polled again [file: requeueConvergedSeconds; default 60].
    #[arg(long)]
    requeue_converged_seconds: Option<u64>,
    /// Reconcile at most this many EtcdClusters at once per watched namespace [file: maxConcurrentReconciles; default 16].
    #[arg(long)]
    max_concurrent_reconciles: Option<u16>,
    /// Watching every namespace: at most this many reconciles of one namespace's clusters at once [file: maxReconcilesPerNamespace; default 4].
    #[arg(long)]
    max_reconciles_per_namespace: Option<u16>,
    /// Triggers for one cluster within this window cause one reconcile [file: debounceMilliseconds; default 200].
    #[arg(long)]
    debounce_milliseconds: Option<u64>,
    /// After SIGTERM, how long in-flight reconciles may finish before the process exits [file: shutdownGraceSeconds; default 10].
    #[arg(long)]
    shutdown_grace_seconds: Option<u64>,
    /// How etcd members are reached: portForward (through the workload API server) or direct [file: dialer; default portForward].
    #[arg(long, value_parser = ["portForward", "direct"])]
    dialer: Option<String>,
    /// OTLP/gRPC endpoint traces are exported to, e.g. http://otel-collector:4317 [file: tracing.otlpEndpoint; default unset: the OTEL_* environment decides].
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Enable or disable Lease leader election [file: leaderElection.enabled; default false].
    #[arg(long)]
    leader_elect: Option<bool>,
    /// Name of the leader Lease [file: leaderElection.leaseName; default etcdfleet-controller].
    #[arg(long)]
    lease_name: Option<String>,
    /// Namespace of the leader Lease, the controller's own [file: leaderElection.leaseNamespace].
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// How long the Lease is valid without renewal [file: leaderElection.leaseDurationSeconds; default 15].
    #[arg(long)]
    lease_duration_seconds: Option<u64>,
    /// How often the holder renews the Lease and a standby retries [file: leaderElection.renewIntervalSeconds; default a third of the lease duration].
    #[arg(long)]
    lease_renew_interval_seconds: Option<u64>,
    /// How long the holder leads on without a successful renewal [file: leaderElection.renewDeadlineSeconds; default two thirds of the lease duration].
    #[arg(long)]
    lease_renew_deadline_seconds: Option<u64>,
    /// Share the fleet between the replicas, each reconciling its shard; needs leader election [file: sharding.enabled; default false].
    #[arg(long)]
    sharding: Option<bool>,
    /// This replica's shard name [file: sharding.shardName; default the pod's name].
    #[arg(long)]
    shard_name: Option<String>,
    /// Prefix of the shard Leases, in the leader Lease's namespace [file: sharding.leasePrefix; default etcdfleet-shard-].
    #[arg(long)]
    shard_lease_prefix: Option<String>,
    /// Address of the /metrics, /healthz, /readyz and /leader endpoints [file: metricsAddress; default 0.0.0.0:8080].
    #[arg(long)]
    metrics_address: Option<String>,
    /// Log format, text or json [file: logFormat; default text].
    #[arg(long)]
    log_format: Option<LogFormat>,
    /// Image with the etcdfleet binary that restoring clusters copy their seeder from [file: seederImage; default this release's controller image].
    #[arg(long)]
    seeder_image: Option<String>,
    /// Rotate a cluster's CA when it expires within this many days; 0: never on its own [file: caRotateBeforeDays; default 90].
    #[arg(long)]
    ca_rotate_before_days: Option<u64>,
    /// Restore drills running at once in this controller, across the fleet [file: maxConcurrentDrills; default 2].
    #[arg(long)]
    max_concurrent_drills: Option<u16>,
    /// A restore drill whose etcd serves no read within this many seconds ends as an error [file: drillTimeoutSeconds; default 900].
    #[arg(long)]
    drill_timeout_seconds: Option<u64>,
    /// Namespace whose bucket destinations without credentialsSecretName use this controller's workload identity (repeatable; `*`: all) [file: tenancy.workloadIdentityNamespaces; default none].
    #[arg(long = "workload-identity-namespace")]
    workload_identity_namespaces: Vec<String>,
    /// Namespace whose destinations may be a directory of this controller's filesystem (repeatable; `*`: all) [file: tenancy.localDestinationNamespaces; default none].
    #[arg(long = "local-destination-namespace")]
    local_destination_namespaces: Vec<String>,
    /// No backup schedule runs more often than this many seconds [file: tenancy.minScheduleIntervalSeconds; default 900].
    #[arg(long)]
    min_schedule_interval_seconds: Option<u64>,
    /// Successful backups a schedule without retention keeps [file: tenancy.defaultRetentionCount; default 30].
    #[arg(long)]
    default_retention_count: Option<u32>,
}

#[derive(clap::Args)]
struct SeedArgs {
    /// The destination as JSON (an ObjectStoreDestination: bucket or path, endpoint, ...).
    #[arg(long)]
    destination: String,
    /// Key of the snapshot object.
    #[arg(long)]
    object_key: String,
    /// Hex SHA-256 the object must have.
    #[arg(long)]
    sha256: String,
    /// Bytes the object must hold.
    #[arg(long)]
    size_bytes: Option<u64>,
    /// etcd's --data-dir.
    #[arg(long)]
    data_dir: PathBuf,
    /// The member's --name.
    #[arg(long)]
    name: String,
    /// --initial-cluster of the restored member.
    #[arg(long)]
    initial_cluster: String,
    /// --initial-advertise-peer-urls of the restored member.
    #[arg(long)]
    initial_advertise_peer_urls: String,
    /// --initial-cluster-token.
    #[arg(long)]
    initial_cluster_token: String,
    /// The member's --initial-cluster-state; `existing` (a member joining a running cluster) seeds nothing.
    #[arg(long)]
    initial_cluster_state: Option<String>,
    /// Path of etcdutl (3.5+) or etcdctl (3.4).
    #[arg(long)]
    restore_tool: PathBuf,
}

fn restore_seed(args: &SeedArgs) -> ExitCode {
    use etcdfleet_controllers::restore::seed::{self, SeedRequest};
    use etcdfleet_controllers::store::Credentials;
    let destination = match serde_json::from_str(&args.destination) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: --destination is not an ObjectStoreDestination: {e}");
            return ExitCode::from(EXIT_INPUT_ERROR);
        }
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let credentials = match (
        env(seed::ENV_ACCESS_KEY_ID),
        env(seed::ENV_SECRET_ACCESS_KEY),
    ) {
        (Some(access_key_id), Some(secret_access_key)) => Some(Credentials {
            access_key_id,
            secret_access_key,
            session_token: env(seed::ENV_SESSION_TOKEN),
        }),
        _ => None,
    };
    let req = SeedRequest {
        destination,
        credentials,
        object_key: args.object_key.clone(),
        sha256: args.sha256.clone(),
        size_bytes: args.size_bytes,
        data_dir: args.data_dir.clone(),
        name: args.name.clone(),
        initial_cluster: args.initial_cluster.clone(),
        initial_advertise_peer_urls: args.initial_advertise_peer_urls.clone(),
        initial_cluster_token: args.initial_cluster_token.clone(),
        initial_cluster_state: args.initial_cluster_state.clone(),
        restore_tool: args.restore_tool.clone(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(seed::seed(&req)) {
        Ok(outcome) => {
            println!("restore-seed: {outcome:?} ({})", req.object_key);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("restore-seed: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let code = runtime.block_on(run(*args));
            // Tasks still parked on the network must not hold the exit.
            runtime.shutdown_timeout(Duration::from_millis(500));
            code
        }
        Command::Render {
            cluster,
            templates,
            cluster_templates,
        } => render(&cluster, &templates, &cluster_templates),
        Command::Plan {
            files,
            member_failure_grace_seconds,
        } => plan(&files, member_failure_grace_seconds),
        Command::RestoreSeed(args) => restore_seed(&args),
        Command::ForceNewCluster(args) => current_thread(force_new_cluster(*args)),
        Command::MigrateStorage { kubeconfig } => current_thread(migrate_storage(kubeconfig)),
        Command::Resolve { host } => current_thread(resolve(host)),
        Command::CaCertificates => {
            let count = etcdfleet_controllers::store::system_ca_certificates();
            println!("{count} CA certificates");
            if count == 0 {
                eprintln!("ca-certificates: none: an HTTPS object store cannot be verified here");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Command::InstallSeeder { dest } => {
            match etcdfleet_controllers::restore::seed::install_self(&dest) {
                Ok(bytes) => {
                    println!("install-seeder: {bytes} bytes to {}", dest.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("install-seeder: {}: {e}", dest.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn force_new_cluster(args: ForceArgs) -> ExitCode {
    use etcdfleet_controllers::recovery::force::{ForceRequest, force};
    let req = ForceRequest {
        pod: args.pod,
        member: args.member,
        recovery_id: args.recovery_id,
        data_dir: args.data_dir,
        etcd: args.etcd,
        etcd_args: args.etcd_args,
        timeout: Duration::from_secs(args.timeout_seconds),
    };
    match force(&req).await {
        Ok(outcome) => {
            println!("force-new-cluster: {outcome:?} ({})", req.recovery_id);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("force-new-cluster: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `f` on a single-threaded runtime (the short-lived subcommands).
fn current_thread(f: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(f),
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate_storage(kubeconfig: Option<PathBuf>) -> ExitCode {
    use etcdfleet_controllers::migrate;
    let client = match migrate::client(kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_INPUT_ERROR);
        }
    };
    match migrate::migrate_storage(&client).await {
        Ok(report) => {
            for crd in report {
                println!("migrate-storage: {crd}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("migrate-storage: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves `host` with tokio's resolver (getaddrinfo, as hyper's connector
/// and reqwest use): in the static image, glibc's built-in files and dns.
async fn resolve(host: String) -> ExitCode {
    match tokio::net::lookup_host((host.as_str(), 0)).await {
        Ok(addrs) => {
            let addrs: Vec<String> = addrs.map(|a| a.ip().to_string()).collect();
            println!("{host}: {}", addrs.join(" "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("resolve {host}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read_manifests(paths: &[PathBuf]) -> Result<Manifests, String> {
    let mut all = Manifests::default();
    for p in paths {
        let text =
            std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
        all.add(&text, &p.display().to_string())
            .map_err(|e| e.to_string())?;
    }
    Ok(all)
}

fn render(cluster: &PathBuf, templates: &[PathBuf], cluster_templates: &[PathBuf]) -> ExitCode {
    let read = || -> Result<(Manifests, Manifests), String> {
        let clusters = read_manifests(std::slice::from_ref(cluster))?;
        let mut templates = read_manifests(templates)?;
        templates.extend(read_manifests(cluster_templates)?);
        Ok((clusters, templates))
    };
    let (clusters, templates) = match read() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_INPUT_ERROR);
        }
    };
    let mut failed = report_invalid(&clusters) + report_invalid(&templates);
    if clusters.clusters.is_empty() && failed == 0 {
        eprintln!("error: {}: no EtcdCluster found", cluster.display());
        return ExitCode::from(EXIT_INPUT_ERROR);
    }
    // One cluster that does not resolve does not hide the others.
    for c in &clusters.clusters {
        match render_cluster(c, &templates) {
            Ok(report) => print!("{report}"),
            Err(e) => {
                eprintln!("error: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        ExitCode::from(EXIT_INPUT_ERROR)
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints each invalid object on stderr; returns how many there were.
fn report_invalid(manifests: &Manifests) -> usize {
    for invalid in &manifests.invalid {
        eprintln!("error: {invalid}");
    }
    manifests.invalid.len()
}

fn plan(files: &[PathBuf], grace_seconds: u64) -> ExitCode {
    let manifests = match read_manifests(files) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_INPUT_ERROR);
        }
    };
    let invalid = report_invalid(&manifests);
    if manifests.clusters.is_empty() && invalid == 0 {
        eprintln!("error: no EtcdCluster in the given files");
        return ExitCode::from(EXIT_INPUT_ERROR);
    }
    let plans = plan_all(
        &manifests,
        k8s_openapi::jiff::Timestamp::now(),
        Duration::from_secs(grace_seconds),
    );
    for (i, p) in plans.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{p}");
    }
    let mut code = plan_exit_code(&plans, invalid);
    for rollout in &manifests.rollouts {
        let previewed = preview(
            rollout,
            &manifests.clusters,
            &manifests.cluster_templates,
            &manifests.templates,
            k8s_openapi::jiff::Timestamp::now(),
        );
        println!();
        print!("{previewed}");
        let rollout_code = if !previewed.refused().is_empty() {
            EXIT_BLOCKED
        } else if !previewed.changes().is_empty() {
            EXIT_CHANGES
        } else {
            0
        };
        if code != EXIT_INPUT_ERROR {
            code = code.max(rollout_code);
        }
    }
    ExitCode::from(code)
}

async fn run(args: RunArgs) -> ExitCode {
    let overrides = Overrides {
        namespaces: args.namespaces,
        label_selector: args.label_selector,
        member_failure_grace_seconds: args.member_failure_grace_seconds,
        deletion_timeout_seconds: args.deletion_timeout_seconds,
        requeue_converged_seconds: args.requeue_converged_seconds,
        leader_election: args.leader_elect,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        lease_duration_seconds: args.lease_duration_seconds,
        renew_interval_seconds: args.lease_renew_interval_seconds,
        renew_deadline_seconds: args.lease_renew_deadline_seconds,
        sharding: args.sharding,
        shard_name: args.shard_name,
        shard_lease_prefix: args.shard_lease_prefix,
        metrics_address: args.metrics_address,
        log_format: args.log_format,
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        max_reconciles_per_namespace: args.max_reconciles_per_namespace,
        debounce_milliseconds: args.debounce_milliseconds,
        shutdown_grace_seconds: args.shutdown_grace_seconds,
        dialer: args.dialer.as_deref().map(|d| match d {
            "direct" => DialerKind::Direct,
            _ => DialerKind::PortForward,
        }),
        otlp_endpoint: args.otlp_endpoint,
        seeder_image: args.seeder_image,
        ca_rotate_before_days: args.ca_rotate_before_days,
        max_concurrent_drills: args.max_concurrent_drills,
        drill_timeout_seconds: args.drill_timeout_seconds,
        tenancy: etcdfleet_controllers::tenancy::TenancyOverrides {
            workload_identity_namespaces: args.workload_identity_namespaces,
            local_destination_namespaces: args.local_destination_namespaces,
            min_schedule_interval_seconds: args.min_schedule_interval_seconds,
            default_retention_count: args.default_retention_count,
        },
    };
    let config = match ControllerConfig::load(args.config.as_deref(), overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // Kept until `run` returns: dropping it flushes the buffered spans.
    let _telemetry = match telemetry::init(config.log_format, &config.tracing) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    runner::run(
        config,
        ClientSource {
            kubeconfig: args.kubeconfig,
        },
    )
    .await
}
