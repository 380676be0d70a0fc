//! The test CSI driver (`etcdfleet_tests::csi`):
//!
//! ```text
//! csi_hostpath controller --store DIR --socket PATH [--node-expansion]
//! csi_hostpath node --store DIR --socket PATH --node-id NAME
//!              --registration PATH [--node-expansion]
//! ```
//!
//! `controller` serves Identity and Controller for `csi-provisioner` and
//! `csi-resizer`; `node` serves Identity and Node on `--socket` and the
//! kubelet's plugin registration on `--registration` (a socket in the
//! kubelet's `plugins_registry` directory).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use etcdfleet_tests::csi::controller::{ControllerService, IdentityService};
use etcdfleet_tests::csi::node::{NodeService, RegistrationService};
use etcdfleet_tests::csi::proto::controller_server::ControllerServer;
use etcdfleet_tests::csi::proto::identity_server::IdentityServer;
use etcdfleet_tests::csi::proto::node_server::NodeServer;
use etcdfleet_tests::csi::registration::registration_server::RegistrationServer;
use etcdfleet_tests::csi::{Store, serve_unix};
use tonic::transport::Server;

struct Args {
    mode: String,
    store: PathBuf,
    socket: PathBuf,
    node_id: Option<String>,
    registration: Option<PathBuf>,
    node_expansion: bool,
}

fn parse(argv: &[String]) -> Result<Args> {
    let mode = argv.first().context("a mode: controller or node")?.clone();
    let (mut store, mut socket, mut node_id, mut registration) = (None, None, None, None);
    let mut node_expansion = false;
    let mut rest = argv[1..].iter();
    while let Some(flag) = rest.next() {
        let mut value = || rest.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => store = Some(PathBuf::from(value()?)),
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--node-id" => node_id = Some(value()?.clone()),
            "--registration" => registration = Some(PathBuf::from(value()?)),
            "--node-expansion" => node_expansion = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(Args {
        mode,
        store: store.context("--store is required")?,
        socket: socket.context("--socket is required")?,
        node_id,
        registration,
        node_expansion,
    })
}

async fn run(args: Args) -> Result<()> {
    let store = Store::new(&args.store);
    std::fs::create_dir_all(&args.store)?;
    let identity = IdentityServer::new(IdentityService);
    match args.mode.as_str() {
        "controller" => {
            let controller = ControllerServer::new(ControllerService {
                store,
                node_expansion: args.node_expansion,
            });
            let router = Server::builder()
                .add_service(identity)
                .add_service(controller);
            serve_unix(router, &args.socket).await
        }
        "node" => {
            let node = NodeServer::new(NodeService {
                store,
                node_id: args.node_id.context("node mode needs --node-id")?,
                node_expansion: args.node_expansion,
            });
            let registration = RegistrationServer::new(RegistrationService {
                endpoint: args.socket.clone(),
            });
            let registration_socket = args
                .registration
                .context("node mode needs --registration")?;
            let csi = serve_unix(
                Server::builder().add_service(identity).add_service(node),
                &args.socket,
            );
            let kubelet = serve_unix(
                Server::builder().add_service(registration),
                &registration_socket,
            );
            futures::try_join!(csi, kubelet).map(|_| ())
        }
        other => bail!("unknown mode {other} (controller or node)"),
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&argv).and_then(|args| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(run(args))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("csi_hostpath: {e:#}");
            ExitCode::FAILURE
        }
    }
}
