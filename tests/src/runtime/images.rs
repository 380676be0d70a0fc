//! The image table: which local binary a container image runs (etcd by
//! tag, the controller's image by repository, an exact image where a test
//! needs one), and which other commands an image provides (`etcdctl`,
//! `etcdutl`, `etcdfleet`) for init containers and for the image's `PATH`.
//! An image the table does not map leaves its pod `Pending` with
//! `ErrImagePull`, as a registry without it would.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use etcdfleet_api::version::image_repository;

use crate::etcd_harness::{EtcdBinary, EtcdVersion};

/// The image the test world's controller names as its seeder image (the
/// controller's own image): [`ImageTable::installed`] maps its `etcdfleet`
/// command onto the built etcdfleet binary.
pub const SEEDER_IMAGE: &str = "etcdfleet/controller:test";

/// The repository of the controller's image, as the shipped manifests name it.
pub const CONTROLLER_IMAGE_REPOSITORY: &str = "etcdfleet/controller";

/// Maps container images onto local binaries.
#[derive(Debug, Clone, Default)]
pub struct ImageTable {
    rules: Vec<(ImageMatch, PathBuf)>,
    /// Non-etcd commands an image provides (init containers): `(image, command
    /// basename) -> binary`.
    commands: Vec<(ImageMatch, String, PathBuf)>,
}

#[derive(Debug, Clone)]
enum ImageMatch {
    Exact(String),
    /// Any tag of this repository (`etcdfleet/controller`).
    Repository(String),
    Tag(String),
}

impl ImageMatch {
    /// How specific a match is: exact rules win over repository rules, which
    /// win over tag rules.
    fn rank(&self, image: &str) -> Option<u8> {
        match self {
            ImageMatch::Exact(i) if i == image => Some(0),
            ImageMatch::Repository(r) if image_repository(image) == r => Some(1),
            ImageMatch::Tag(t) if image_tag(image) == Some(t.as_str()) => Some(2),
            _ => None,
        }
    }
}

impl ImageTable {
    /// A table that maps nothing.
    pub fn empty() -> Self {
        ImageTable::default()
    }

    /// The etcd versions installed for the suite, by tag, for any repository:
    /// `v3.4.23` / `3.4.23` / `3.4.23-0` and `v3.5.1` / `3.5.1` / `3.5.1-0`.
    pub fn installed() -> Self {
        let v34 = EtcdBinary::locate(EtcdVersion::V3_4).etcd;
        let v35 = EtcdBinary::locate(EtcdVersion::V3_5).etcd;
        let mut table = ImageTable::empty();
        let b34 = EtcdBinary::locate(EtcdVersion::V3_4);
        let b35 = EtcdBinary::locate(EtcdVersion::V3_5);
        for tag in ["v3.4.23", "3.4.23", "3.4.23-0"] {
            table = table
                .with_tag(tag, &v34)
                .with_tag_command(tag, "etcdctl", &b34.etcdctl);
        }
        for tag in ["v3.5.1", "3.5.1", "3.5.1-0"] {
            table = table
                .with_tag(tag, &v35)
                .with_tag_command(tag, "etcdctl", &b35.etcdctl);
            if let Some(etcdutl) = &b35.etcdutl {
                table = table.with_tag_command(tag, "etcdutl", etcdutl);
            }
        }
        for built in crate::etcd_harness::built_etcds() {
            let version = built.version_string();
            for tag in [
                format!("v{version}"),
                version.clone(),
                format!("{version}-0"),
            ] {
                table = table
                    .with_tag(&tag, &built.etcd)
                    .with_tag_command(&tag, "etcdctl", &built.etcdctl)
                    .with_tag_command(&tag, "etcdutl", &built.etcdutl);
            }
        }
        table.with_seeder()
    }

    /// Maps exactly `image` (e.g. `gcr.io/etcd-development/etcd:v3.5.1`).
    pub fn with_image(mut self, image: &str, binary: impl Into<PathBuf>) -> Self {
        self.rules
            .push((ImageMatch::Exact(image.to_string()), binary.into()));
        self
    }

    /// Maps any image with this tag.
    pub fn with_tag(mut self, tag: &str, binary: impl Into<PathBuf>) -> Self {
        self.rules
            .push((ImageMatch::Tag(tag.to_string()), binary.into()));
        self
    }

    /// Maps the command `command` (its basename, e.g. `etcdutl`) run from
    /// exactly `image` onto a local binary (init containers).
    pub fn with_command(mut self, image: &str, command: &str, binary: impl Into<PathBuf>) -> Self {
        self.commands.push((
            ImageMatch::Exact(image.to_string()),
            command.to_string(),
            binary.into(),
        ));
        self
    }

    /// Like [`with_command`](Self::with_command), for any image with this tag.
    pub fn with_tag_command(
        mut self,
        tag: &str,
        command: &str,
        binary: impl Into<PathBuf>,
    ) -> Self {
        self.commands.push((
            ImageMatch::Tag(tag.to_string()),
            command.to_string(),
            binary.into(),
        ));
        self
    }

    /// The binary behind `command` (any path; its basename is matched) in
    /// `image`, if mapped and present on disk. Exact rules win over tag rules.
    pub fn resolve_command(&self, image: &str, command: &str) -> Option<PathBuf> {
        let name = Path::new(command).file_name()?.to_str()?;
        self.commands
            .iter()
            .filter(|(_, c, _)| c == name)
            .filter_map(|(m, _, p)| Some((m.rank(image)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p.clone())
            .filter(|p| p.is_file())
    }

    /// Every command `image` provides (`etcd` and the mapped tools such as
    /// `etcdctl`/`etcdutl`), as `(name, binary)`: what the image's `PATH`
    /// holds. Exact rules win over tag rules.
    pub fn commands_of(&self, image: &str) -> Vec<(String, PathBuf)> {
        let mut names: BTreeSet<String> = self.commands.iter().map(|(_, c, _)| c.clone()).collect();
        names.insert("etcd".into());
        names
            .into_iter()
            .filter_map(|name| {
                let binary = if name == "etcd" {
                    self.resolve(image)
                } else {
                    self.resolve_command(image, &name)
                };
                binary.map(|b| (name, b))
            })
            .collect()
    }

    /// Maps every tag of the controller's image ([`CONTROLLER_IMAGE_REPOSITORY`],
    /// which [`SEEDER_IMAGE`] is one of) onto the binary inside the image
    /// `make image` built ([`crate::image::BuiltImage`]), unpacked from its
    /// OCI layout, when it is current, else onto the etcdfleet binary of this
    /// build: its entrypoint (a Deployment's pod runs `etcdfleet run`) and
    /// its `etcdfleet` command (the seeder init container, which so runs the
    /// image's own static binary). Nothing when neither was built.
    pub fn with_seeder(self) -> Self {
        let image = crate::image::BuiltImage::locate();
        let exe = std::env::current_exe().ok();
        let build = exe
            .as_deref()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .map(|dir| dir.join("etcdfleet"))
            .filter(|bin| bin.is_file());
        match image.current_binary().or(build) {
            Some(bin) => self.with_controller_image(bin),
            None => self,
        }
    }

    /// Maps every tag of [`CONTROLLER_IMAGE_REPOSITORY`] onto `binary`.
    pub fn with_controller_image(mut self, binary: impl Into<PathBuf>) -> Self {
        let binary = binary.into();
        let repository = ImageMatch::Repository(CONTROLLER_IMAGE_REPOSITORY.to_string());
        self.commands
            .push((repository.clone(), "etcdfleet".into(), binary.clone()));
        self.rules.push((repository, binary));
        self
    }

    /// Maps the etcd images of 3.4.23, 3.5.1 and 3.5.21 onto the etcd stand-in
    /// `binary` (see [`crate::etcd_standin`]) instead of etcd: links
    /// `dir/v<version>/etcd` → `binary`, the stand-in's version being the
    /// name of its directory. For measuring the controller's cost only.
    pub fn standin(binary: &Path, dir: &Path) -> Result<Self> {
        let mut table = ImageTable::empty();
        for version in ["3.4.23", "3.5.1", "3.5.21"] {
            let versioned = dir.join(format!("v{version}"));
            fs::create_dir_all(&versioned)?;
            let link = versioned.join("etcd");
            if !link.exists() {
                std::os::unix::fs::symlink(binary, &link)
                    .with_context(|| format!("linking {}", link.display()))?;
            }
            for tag in [
                format!("v{version}"),
                version.to_string(),
                format!("{version}-0"),
            ] {
                table = table.with_tag(&tag, &link);
            }
        }
        Ok(table)
    }

    /// The binary for `image`, if mapped and present on disk. Exact rules win
    /// over tag rules.
    pub fn resolve(&self, image: &str) -> Option<PathBuf> {
        self.rules
            .iter()
            .filter_map(|(m, p)| Some((m.rank(image)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p.clone())
            .filter(|p| p.is_file())
    }
}

/// The tag of an image reference (`repo/name:tag[@digest]`).
fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split_once(':').map(|(_, tag)| tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_map_by_exact_name_then_tag() {
        let bin = std::env::current_exe().unwrap();
        let table = ImageTable::empty()
            .with_tag("v3.5.1", &bin)
            .with_image("example/etcd:custom", &bin);
        assert_eq!(
            table.resolve("gcr.io/etcd-development/etcd:v3.5.1"),
            Some(bin.clone())
        );
        assert_eq!(
            table.resolve("localhost:5000/etcd:v3.5.1@sha256:abc"),
            Some(bin.clone())
        );
        assert_eq!(table.resolve("example/etcd:custom"), Some(bin));
        assert_eq!(table.resolve("gcr.io/etcd-development/etcd:v3.6.0"), None);
        assert_eq!(table.resolve("localhost:5000/etcd"), None);
    }
}
