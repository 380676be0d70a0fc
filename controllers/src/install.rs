//! The init container that copies the etcdfleet binary out of the
//! controller's image into an `emptyDir`, so a second init container can
//! run it inside the etcd image next to etcd's own tools (etcd images carry
//! no shell and no `cp`). Shared by the restore seeder and the recovery's
//! `force-new-cluster`. A leaf: it imports nothing of the crate.

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, Volume, VolumeMount};

/// An install container, its `emptyDir` and where it mounts it.
pub struct Installed {
    pub container: Container,
    pub volume: Volume,
    pub mount: VolumeMount,
    /// The path of the installed binary, for the container that runs it.
    pub binary: String,
}

/// `name` runs `image_binary install-seeder <mount>/etcdfleet` from `image`
/// into the `emptyDir` `volume` mounted at `mount`.
pub fn install_etcdfleet(
    name: &str,
    volume: &str,
    image: &str,
    image_binary: &str,
    mount: &str,
) -> Installed {
    let mount = VolumeMount {
        name: volume.to_string(),
        mount_path: mount.to_string(),
        ..Default::default()
    };
    let binary = format!("{}/etcdfleet", mount.mount_path);
    Installed {
        container: Container {
            name: name.to_string(),
            image: Some(image.to_string()),
            image_pull_policy: Some("IfNotPresent".to_string()),
            command: Some(vec![
                image_binary.to_string(),
                "install-seeder".to_string(),
                binary.clone(),
            ]),
            volume_mounts: Some(vec![mount.clone()]),
            ..Default::default()
        },
        volume: Volume {
            name: volume.to_string(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        mount,
        binary,
    }
}
