//! The README's command blocks as tests: the ```sh blocks of one section,
//! run verbatim with bash and the kubectl of the Kubernetes build against a
//! real management cluster, in a copy of the repository's manifests (files
//! the commands write stay out of the repository). A README command that
//! stops working fails its section's test.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail, ensure};

use super::world::KubeWorld;
use crate::controller_process::repo;

/// The ```sh blocks of the README section headed `## <title>`, in order.
pub fn sh_blocks(title: &str) -> Result<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md"))?;
    let heading = format!("\n## {title}\n");
    let start = readme
        .find(&heading)
        .with_context(|| format!("the README has no ## {title} section"))?;
    let section = &readme[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut blocks = Vec::new();
    let mut rest = &section[..end];
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("\n```").context("an unclosed ```sh block")?;
        blocks.push(body[..close].to_string());
        rest = &body[close + 4..];
    }
    ensure!(!blocks.is_empty(), "## {title} has no ```sh block");
    Ok(blocks)
}

/// A working directory with the repository's manifests, as a reader's
/// checkout.
pub fn checkout(dir: &Path) -> Result<()> {
    for part in ["config", "templates"] {
        let status = Command::new("cp")
            .arg("-r")
            .arg(repo().join(part))
            .arg(dir)
            .status()?;
        ensure!(status.success(), "copying {part}");
    }
    Ok(())
}

/// Runs one block with `bash -euo pipefail` in `dir`, the management
/// cluster as kubectl's current context and `env` set; a failure shows the
/// block, its output and the management cluster's pod logs.
pub fn run_block(
    world: &KubeWorld,
    dir: &Path,
    env: &[(String, String)],
    block: &str,
) -> Result<()> {
    let path = format!(
        "{}:{}",
        world.binaries.dir.display(),
        std::env::var("PATH").context("PATH")?
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", world.management.admin_kubeconfig_file())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .context("bash")?;
    if !out.status.success() {
        bail!(
            "README block failed ({}):\n{block}\n--- stdout\n{}\n--- stderr\n{}\n--- controller\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            world.management_pod_logs(40)
        );
    }
    Ok(())
}
