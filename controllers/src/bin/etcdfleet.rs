//! The etcdfleet controller binary.
//!
//! - `run`: the controller (management client, connector, metrics and health
//!   endpoints, optional Lease leader election, one watch per namespace);
//! - `render`: offline, what the controller would write for a cluster;
//! - `plan`: offline, what the controller would do next for clusters as
//!   `kubectl get -o yaml` shows them.
//!
//! The wiring is thin on purpose: decisions live in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::cli::{
    EXIT_INPUT_ERROR, Manifests, plan_all, plan_exit_code, render_cluster,
};
use etcdfleet_controllers::config::{ControllerConfig, LogFormat, Overrides};
use etcdfleet_controllers::connector::{
    ConnectorSettings, KubeconfigClientFactory, WorkloadClusterConnector,
};
use etcdfleet_controllers::dialer::DirectDialer;
use etcdfleet_controllers::etcdcluster::{self, Context};
use etcdfleet_controllers::http::{Health, serve_http};
use etcdfleet_controllers::leader::LeaderElector;
use etcdfleet_controllers::metrics::Metrics;
use futures::StreamExt;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, info, warn};

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
    Run(RunArgs),
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
    /// Print what the controller would do next for each EtcdCluster, and why.
    ///
    /// Every object is first validated as the API server would (CRD schema
    /// and CEL rules; unknown fields are errors offline). Exit codes, for CI:
    /// 0 every cluster converged (or paused); 3 some cluster has changes to
    /// make; 4 some cluster is rejected or blocked (template does not resolve,
    /// version rejected, step blocked); 2 input errors (unreadable file, bad
    /// YAML, an object the API server would refuse). Valid clusters are
    /// planned and printed even when others are invalid.
    #[command(verbatim_doc_comment)]
    Plan {
        /// Multi-document YAML of EtcdClusters (with status) and templates.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// How long a member may be unhealthy before it is replaced.
        #[arg(long, default_value_t = 120)]
        member_failure_grace_seconds: u64,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Configuration file (YAML); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Namespace to watch (repeatable); none = all namespaces.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Label selector the EtcdClusters must match.
    #[arg(long)]
    label_selector: Option<String>,
    #[arg(long)]
    member_failure_grace_seconds: Option<u64>,
    #[arg(long)]
    deletion_timeout_seconds: Option<u64>,
    #[arg(long)]
    requeue_converged_seconds: Option<u64>,
    /// Enable or disable Lease leader election.
    #[arg(long)]
    leader_elect: Option<bool>,
    /// Namespace of the leader Lease (the controller's own namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    #[arg(long)]
    metrics_address: Option<String>,
    /// text or json.
    #[arg(long)]
    log_format: Option<LogFormat>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(run(args))
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
    ExitCode::from(plan_exit_code(&plans, invalid))
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
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
        metrics_address: args.metrics_address,
        log_format: args.log_format,
    };
    let config = match ControllerConfig::load(args.config.as_deref(), overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(config.log_format);
    info!(scope = %config.describe_scope(), leader_election = config.leader_election.enabled, "starting etcdfleet controller");

    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot build the management cluster client");
            return ExitCode::from(1);
        }
    };
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());

    let listener = match tokio::net::TcpListener::bind(&config.metrics_address).await {
        Ok(l) => l,
        Err(e) => {
            error!(address = %config.metrics_address, error = %e, "cannot listen");
            return ExitCode::from(1);
        }
    };
    tokio::spawn(serve_http(listener, metrics.clone(), health.clone()));

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown_tx = Arc::new(shutdown_tx);
    tokio::spawn({
        let tx = shutdown_tx.clone();
        async move {
            wait_for_signal().await;
            info!("shutdown requested");
            let _ = tx.send(true);
        }
    });
    let shutdown = move || {
        let mut rx = shutdown_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    // Leader election: wait for the Lease (or for shutdown), then keep it.
    let lease_lost = Arc::new(AtomicBool::new(false));
    let elector = config.leader_election.enabled.then(|| {
        Arc::new(LeaderElector::new(
            client.clone(),
            &config.leader_election,
            LeaderElector::default_identity(),
        ))
    });
    if let Some(elector) = &elector {
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown() => return ExitCode::SUCCESS,
        }
        tokio::spawn({
            let elector = elector.clone();
            let tx = shutdown_tx.clone();
            let lost = lease_lost.clone();
            let health = health.clone();
            async move {
                let why = elector.hold().await;
                error!(error = %why, "lost leadership; stopping the controller");
                lost.store(true, Ordering::SeqCst);
                health.ready.store(false, Ordering::SeqCst);
                let _ = tx.send(true);
                // Never reconcile after another replica may have taken over:
                // leave before the lease can expire for the others.
                tokio::time::sleep(elector.renew_interval()).await;
                std::process::exit(1);
            }
        });
    }

    let connector = WorkloadClusterConnector::new(
        client.clone(),
        Arc::new(KubeconfigClientFactory::default()),
        ConnectorSettings::default(),
    );
    let owner = config.clone();
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            connector,
            Arc::new(DirectDialer),
            config.reconciler_settings(),
            metrics.clone(),
        )
        .with_owner_filter(Arc::new(move |c: &EtcdCluster| owner.owns(c))),
    );
    tokio::spawn({
        let ctx = ctx.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let evicted = ctx.connector.evict_idle();
                if evicted > 0 {
                    info!(evicted, "dropped idle workload cluster clients");
                }
            }
        }
    });

    let mut watch_config = watcher::Config::default();
    if let Some(selector) = &config.label_selector {
        watch_config = watch_config.labels(selector);
    }
    let apis: Vec<Api<EtcdCluster>> = if config.namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        config
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let controllers = apis.into_iter().map(|api| {
        Controller::new(api, watch_config.clone())
            .graceful_shutdown_on(shutdown())
            .run(
                etcdcluster::reconcile,
                etcdcluster::error_policy,
                ctx.clone(),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    warn!(error = %e, "reconcile failed");
                }
            })
    });
    health.ready.store(true, Ordering::SeqCst);
    info!("controller running");
    futures::future::join_all(controllers).await;
    health.ready.store(false, Ordering::SeqCst);

    if lease_lost.load(Ordering::SeqCst) {
        return ExitCode::from(1);
    }
    if let Some(elector) = &elector {
        elector.release().await;
    }
    info!("stopped");
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
