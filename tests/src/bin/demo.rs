//! `make demo`: a management cluster and three workload clusters, in-process,
//! on real etcd. See `etcdfleet_tests::demo`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use etcdfleet_tests::demo::{DemoOptions, check_mount_namespaces, run_demo};
use etcdfleet_tests::etcd_harness::{EtcdBinary, EtcdVersion};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    for (version, role) in [
        (EtcdVersion::V3_5Latest, "the templates' 3.5"),
        (EtcdVersion::V3_6, "the upgrade to 3.6"),
    ] {
        if let Some(missing) = EtcdBinary::locate(version).missing() {
            eprintln!(
                "demo: etcd {} ({role}) not found at {} — run `make tools` (hack/install-tools.sh) first",
                version.label(),
                missing.display()
            );
            return ExitCode::FAILURE;
        }
    }
    // Say what is missing now, not after a phase times out.
    if let Err(why) = check_mount_namespaces() {
        eprintln!("demo: {why}");
        return ExitCode::FAILURE;
    }
    let stdout = std::io::stdout();
    let options = DemoOptions {
        live: stdout.is_terminal(),
        ..DemoOptions::default()
    };
    // First ctrl-c: stop at the next round and clean up. Second: leave now
    // (the etcd processes die with us: PR_SET_PDEATHSIG).
    let cancel = options.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!(
                "\ndemo: interrupted, stopping the etcd processes (ctrl-c again to quit at once)"
            );
            cancel.store(true, Ordering::SeqCst);
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    let mut out = stdout.lock();
    match run_demo(&mut out, options).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            drop(out);
            eprintln!("\ndemo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
