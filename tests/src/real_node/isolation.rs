//! A test's network namespace of its own: every address a real-node world
//! uses lives there, and the kernel removes the bridge, its addresses and
//! every iptables rule when the test process ends, however it ends.

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

/// Runs `test` in a network namespace of its own: this thread leaves the
/// machine's network namespace (`unshare(CLONE_NEWNET)`, which moves the
/// calling thread only), brings up its loopback, then builds the tokio
/// runtime, whose threads (and every process they spawn) start inside it.
/// Panics when the test fails, like a `#[tokio::test]`.
pub fn run_isolated<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    enter_own_network().expect("a network namespace for the test");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(test()) {
        panic!("{e:?}");
    }
}

/// The network namespace the test process started in (read before it left).
static MACHINE_NETWORK: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn enter_own_network() -> Result<()> {
    let machine = std::fs::read_link("/proc/thread-self/ns/net").context("own netns")?;
    let _ = MACHINE_NETWORK.set(machine);
    // SAFETY: a plain syscall on the calling thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!(
            "unshare(CLONE_NEWNET) (real nodes need root): {}",
            std::io::Error::last_os_error()
        );
    }
    ip(&["link", "set", "lo", "up"])?;
    ensure!(
        in_own_network()?,
        "the thread is still in the machine's network namespace"
    );
    Ok(())
}

/// Whether the calling thread runs in a network namespace [`run_isolated`]
/// made (not the one the test process started in): the pod network is only
/// ever made there.
pub fn in_own_network() -> Result<bool> {
    let own = std::fs::read_link("/proc/thread-self/ns/net").context("own netns")?;
    Ok(MACHINE_NETWORK.get().is_some_and(|machine| *machine != own))
}

/// `ip <args>`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (Debian package iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
