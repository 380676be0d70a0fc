//! The etcd stand-in of `make bench-fleet` (see `etcdfleet_tests::etcd_standin`):
//! started by the workload runtime in place of etcd, with etcd's flags.

use std::process::ExitCode;

use etcdfleet_tests::etcd_standin::{StandinConfig, serve};

fn main() -> ExitCode {
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_default();
    let args: Vec<String> = argv.collect();
    let config = match StandinConfig::from_args(&argv0, &args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("etcd stand-in: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Both rustls providers are in the tree; the controller uses ring too.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("etcd stand-in: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("etcd stand-in: {e:#}");
            ExitCode::FAILURE
        }
    }
}
