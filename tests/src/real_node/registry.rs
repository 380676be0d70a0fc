//! The registry real nodes pull every image from: the CNCF distribution
//! registry (Debian `docker-registry`) as a process of the test on a loopback
//! port of the test's network namespace, its storage in a temporary
//! directory. Images are pushed into it with skopeo from the OCI layouts the
//! test command built; each node's containerd reaches it as the mirror of
//! every registry an image may name ([`LocalRegistry::write_hosts_dir`]), so
//! pod specs keep the names the product writes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::etcd_harness::{EtcdProcess, ProcessSpec, free_ports};

/// Registries whose names the product and the nodes use: the controller's
/// image (`etcdfleet/controller`, Docker Hub), etcd's (`gcr.io`), the
/// sandbox's (`registry.k8s.io`), and `_default` for any other.
const MIRRORED: [(&str, &str); 4] = [
    ("docker.io", "https://registry-1.docker.io"),
    ("gcr.io", "https://gcr.io"),
    ("registry.k8s.io", "https://registry.k8s.io"),
    ("_default", ""),
];

/// One OCI image layout and the full name the image is known by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImage {
    /// As a pod spec names it: `gcr.io/etcd-development/etcd:v3.6.16`.
    pub name: String,
    /// The OCI layout holding it under its tag.
    pub layout: PathBuf,
}

impl NodeImage {
    /// The images of `hack/upstream/node-images.sh`: each `<dir>/<image>/`
    /// holds `oci/` and `name`.
    pub fn all_in(dir: &Path) -> Result<Vec<NodeImage>> {
        let mut images = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            let name = std::fs::read_to_string(path.join("name"))
                .with_context(|| format!("{}/name", path.display()))?;
            images.push(NodeImage {
                name: name.trim().to_string(),
                layout: path.join("oci"),
            });
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// The controller image `make image` builds (`target/image/oci`, tag
    /// `v<version>`), under the name the shipped manifests give it.
    pub fn controller(layout: &Path, tag: &str) -> NodeImage {
        NodeImage {
            name: format!("etcdfleet/controller:{tag}"),
            layout: layout.to_path_buf(),
        }
    }

    fn tag(&self) -> &str {
        self.name
            .rsplit_once(':')
            .map(|(_, t)| t)
            .unwrap_or("latest")
    }

    /// The repository path inside a registry: the name less its registry
    /// host (a first component with a dot, or `docker.io`'s implied one).
    fn repository(&self) -> &str {
        let without_tag = self
            .name
            .rsplit_once(':')
            .map(|(n, _)| n)
            .unwrap_or(&self.name);
        match without_tag.split_once('/') {
            Some((host, rest)) if host.contains('.') || host.contains(':') => rest,
            _ => without_tag,
        }
    }
}

/// The registry process and its address.
pub struct LocalRegistry {
    process: EtcdProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

impl LocalRegistry {
    /// Starts `registry` (the `docker-registry` binary) on a free loopback
    /// port, storing into a new temporary directory.
    pub async fn start(registry: &Path) -> Result<LocalRegistry> {
        let dir = tempfile::Builder::new()
            .prefix("etcdfleet-registry-")
            .tempdir()?;
        let port = free_ports(1)?[0];
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        std::fs::write(dir.path().join("config.yml"), config)?;
        let process = EtcdProcess::spawn(&ProcessSpec {
            binary: registry.to_path_buf(),
            args: vec![
                "serve".into(),
                dir.path().join("config.yml").display().to_string(),
            ],
            env: vec![],
            log_file: dir.path().join("registry.log"),
            hosts_file: None,
        })?;
        let registry = LocalRegistry {
            process,
            port,
            _dir: dir,
        };
        registry.wait_serving(Duration::from_secs(20)).await?;
        Ok(registry)
    }

    async fn wait_serving(&self, timeout: Duration) -> Result<()> {
        let addr = format!("127.0.0.1:{}", self.port).parse()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((200, _)) = crate::controller_process::http_get(addr, "/v2/") {
                return Ok(());
            }
            if !self.process.is_running() {
                bail!("registry exited:\n{}", self.process.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("registry not serving:\n{}", self.process.log_tail(20))
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Copies `image` into the registry under its repository and tag.
    pub async fn push(&self, image: &NodeImage) -> Result<()> {
        let source = format!("oci:{}:{}", image.layout.display(), image.tag());
        let dest = format!(
            "docker://{}/{}:{}",
            self.address(),
            image.repository(),
            image.tag()
        );
        let out = tokio::process::Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false", &source, &dest])
            .output()
            .await
            .context("running skopeo (Debian package skopeo)")?;
        ensure!(
            out.status.success(),
            "skopeo copy {source} {dest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Writes containerd's registry host configuration (`config_path`) into
    /// `dir`: every mirrored registry resolves and pulls through this one.
    pub fn write_hosts_dir(&self, dir: &Path) -> Result<()> {
        for (registry, server) in MIRRORED {
            let mut text = String::new();
            if !server.is_empty() {
                writeln!(text, "server = \"{server}\"")?;
            }
            writeln!(text, "[host.\"http://{}\"]", self.address())?;
            writeln!(text, "  capabilities = [\"pull\", \"resolve\"]")?;
            std::fs::create_dir_all(dir.join(registry))?;
            std::fs::write(dir.join(registry).join("hosts.toml"), text)?;
        }
        Ok(())
    }

    /// The registry's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_drops_the_registry_host() {
        let image = |name: &str| NodeImage {
            name: name.into(),
            layout: PathBuf::new(),
        };
        let etcd = image("gcr.io/etcd-development/etcd:v3.6.16");
        assert_eq!(etcd.repository(), "etcd-development/etcd");
        assert_eq!(etcd.tag(), "v3.6.16");
        assert_eq!(
            image("etcdfleet/controller:v0.2.0").repository(),
            "etcdfleet/controller"
        );
        assert_eq!(image("registry.k8s.io/pause:3.10.2").repository(), "pause");
        assert_eq!(image("127.0.0.1:5000/x/y:1").repository(), "x/y");
    }
}
