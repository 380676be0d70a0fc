//! The controller image as `make image` built it (`hack/build-image.sh`):
//! the OCI layout in `target/image/oci`, tagged `v<workspace version>`, and
//! the same image unpacked again by umoci into `target/image/unpacked`.
//!
//! The test world has no container runtime: it maps images onto local
//! binaries ([`crate::runtime::ImageTable`]). The seeder image maps onto the
//! binary inside the unpacked image ([`BuiltImage::rootfs_binary`]), so
//! every restore in the test world runs the image's own bits.

use std::path::PathBuf;
use std::time::SystemTime;

use crate::controller_process::newest_mtime;
use crate::etcd_harness::workspace_root;

/// The image `make image` builds from this tree.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// `target/image`.
    pub dir: PathBuf,
    /// `v<workspace version>`.
    pub tag: String,
}

impl BuiltImage {
    pub fn locate() -> BuiltImage {
        BuiltImage {
            dir: workspace_root().join("target/image"),
            tag: format!("v{}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// The OCI image layout.
    pub fn layout(&self) -> PathBuf {
        self.dir.join("oci")
    }

    /// `etcdfleet/controller:v<version>`: what the manifests and the
    /// controller's default seeder image name.
    pub fn reference(&self) -> String {
        format!("etcdfleet/controller:{}", self.tag)
    }

    /// The root filesystem of the image, unpacked by umoci.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("unpacked/rootfs")
    }

    /// The image's entrypoint binary, as unpacked.
    pub fn rootfs_binary(&self) -> PathBuf {
        self.rootfs().join("etcdfleet")
    }

    /// Why the built image cannot stand for this tree, if it cannot: missing,
    /// or older than the controller sources.
    pub fn stale(&self) -> Option<String> {
        let binary = self.rootfs_binary();
        let built = match std::fs::metadata(&binary).and_then(|m| m.modified()) {
            Ok(t) => t,
            Err(_) => return Some(format!("{} is missing", binary.display())),
        };
        let root = workspace_root();
        let sources: SystemTime =
            newest_mtime(&root.join("controllers/src")).max(newest_mtime(&root.join("api/src")));
        (built < sources)
            .then(|| format!("{} is older than the controller sources", binary.display()))
    }

    /// The unpacked binary if the image is current, else `None`.
    pub fn current_binary(&self) -> Option<PathBuf> {
        self.stale().is_none().then(|| self.rootfs_binary())
    }
}

/// The built image, or `None` after a loud `SKIPPED:` line when it is
/// missing or stale. Under `ETCDFLEET_REQUIRE_ETCD=1` (the Makefile's test
/// command, which runs `make image` first) that panics instead.
pub fn require_image() -> Option<BuiltImage> {
    let image = BuiltImage::locate();
    let Some(why) = image.stale() else {
        return Some(image);
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let message = format!("{test}: {why} (run `make image`)");
    if std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() == Ok("1") {
        panic!("ETCDFLEET_REQUIRE_ETCD=1 but {message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}
