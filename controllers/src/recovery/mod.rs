//! Recovery from a permanent loss of quorum, the parts that run in the
//! members' pods: the `force-new-cluster` init container ([`force`]) and
//! how the StatefulSet's pod template carries it while a recovery forces
//! ([`init_containers`]). What decides a recovery is the planner's
//! (`etcdcluster::plan::recovery`); the policy and the record are
//! `etcdfleet_api::recovery`'s.

pub mod backup;
pub mod force;

use k8s_openapi::api::core::v1::{Container, EnvVar, Volume, VolumeMount};

/// Where the tools image's etcdfleet binary is copied for the init
/// container that runs in the etcd image.
pub const TOOLS_MOUNT: &str = "/opt/etcdfleet-recovery";
/// Name of the init container that forces the new cluster.
pub const FORCE_CONTAINER: &str = "force-new-cluster";
/// The argument that names the recovery (what the observe stage reads back
/// from the pod template and from each pod).
pub const RECOVERY_ID_ARG: &str = "--recovery-id=";

/// A recovery that forces a new cluster from one member (rendered into the
/// pod template while it does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceNewCluster {
    /// `status.lastRecovery.id`.
    pub recovery_id: String,
    /// The chosen member's pod name.
    pub member: String,
    /// The image holding the etcdfleet binary (the controller's).
    pub tools_image: String,
}

/// What the etcd container runs, as the init containers repeat it.
pub struct EtcdContainer {
    pub image: String,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub data_mount: VolumeMount,
    /// The other mounts of the etcd container (TLS).
    pub mounts: Vec<VolumeMount>,
    pub data_dir: String,
    /// Where the tools image holds the etcdfleet binary.
    pub tools_binary: &'static str,
}

/// The two init containers of a recovering cluster's members and their
/// shared volume: `install-recovery` copies the etcdfleet binary from the
/// tools image into an `emptyDir`; `force-new-cluster` runs it in the etcd
/// image, where it forces the new cluster on the chosen member once and
/// does nothing on any other (see [`force`]).
pub fn init_containers(force: &ForceNewCluster, etcd: &EtcdContainer) -> (Vec<Container>, Volume) {
    let crate::install::Installed {
        container: install,
        volume,
        mount: tools,
        binary,
    } = crate::install::install_etcdfleet(
        "install-recovery",
        "etcdfleet-recovery",
        &force.tools_image,
        etcd.tools_binary,
        TOOLS_MOUNT,
    );
    let mut args = vec![
        "force-new-cluster".to_string(),
        "--pod=$(POD_NAME)".to_string(),
        format!("--member={}", force.member),
        format!("{RECOVERY_ID_ARG}{}", force.recovery_id),
        format!("--data-dir={}", etcd.data_dir),
        "--".to_string(),
    ];
    args.extend(etcd.args.iter().cloned());
    let mut mounts = vec![etcd.data_mount.clone(), tools];
    mounts.extend(etcd.mounts.iter().cloned());
    let run = Container {
        name: FORCE_CONTAINER.to_string(),
        image: Some(etcd.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![binary]),
        args: Some(args),
        env: Some(etcd.env.clone()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    (vec![install, run], volume)
}

/// The recovery a pod spec's init containers force, if any.
pub fn forced_by(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<String> {
    spec.init_containers
        .iter()
        .flatten()
        .find(|c| c.name == FORCE_CONTAINER)?
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix(RECOVERY_ID_ARG))
        .map(str::to_string)
}
