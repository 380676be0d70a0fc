//! The drill pod, rendered (pure): a one-member etcd of the backup's own
//! version, seeded from the snapshot object by the same init containers a
//! restoring cluster's member 0 runs (`install-seeder`, `restore-seed`:
//! size and SHA-256 checked while streaming, then `etcdutl snapshot
//! restore`), on an `emptyDir`. It listens on the pod's loopback only, so
//! nothing but a port-forward reaches it, and carries none of the members'
//! labels, so no Service, StatefulSet or PodDisruptionBudget of the cluster
//! selects it. Its credentials Secret is owned by the pod (removed with it).

use std::collections::BTreeMap;

use etcdfleet_api::ObjectStoreDestination;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, Pod, PodSpec, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::render::{
    OWNER_LABEL, RESTORE_CREDENTIAL_KEYS, SEEDER_IMAGE_BINARY, SEEDER_MOUNT, restore_tool,
};

/// Label every drill pod carries (its value: the EtcdCluster's owner label).
pub const DRILL_LABEL: &str = "etcdfleet.dev/drill-of";
/// Annotation: `<namespace>/<EtcdBackup>` the pod restores.
pub const BACKUP_ANNOTATION: &str = "etcdfleet.dev/drill-backup";
/// Annotation: the EtcdBackupSchedule that started the drill.
pub const SCHEDULE_ANNOTATION: &str = "etcdfleet.dev/drill-schedule";
/// The client port of the drill etcd, on the pod's loopback.
pub const DRILL_CLIENT_PORT: u16 = 2379;
const DATA_DIR: &str = "/var/lib/etcd-drill";
const PEER_URL: &str = "http://127.0.0.1:2380";

/// Everything a drill pod is rendered from.
#[derive(Debug, Clone, PartialEq)]
pub struct DrillPodInputs {
    pub pod_name: String,
    pub secret_name: String,
    pub namespace: String,
    /// The EtcdCluster's owner label value.
    pub owner: String,
    /// `<namespace>/<EtcdBackup>`.
    pub backup: String,
    pub schedule: String,
    /// The backup's uid: the scratch cluster's token, unlike any other.
    pub backup_uid: String,
    pub etcd_version: String,
    pub etcd_image: String,
    pub seeder_image: String,
    pub destination: ObjectStoreDestination,
    pub object_key: String,
    pub sha256: String,
    pub size_bytes: Option<u64>,
    /// Whether the credentials Secret is mounted (the destination names one).
    pub credentials: bool,
    pub node_selector: BTreeMap<String, String>,
}

/// The drill pod.
pub fn drill_pod(i: &DrillPodInputs) -> Pod {
    let data = VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..Default::default()
    };
    let tools = VolumeMount {
        name: "etcdfleet-seeder".into(),
        mount_path: SEEDER_MOUNT.into(),
        ..Default::default()
    };
    let seeder = format!("{SEEDER_MOUNT}/etcdfleet");
    let install = Container {
        name: "install-seeder".into(),
        image: Some(i.seeder_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![
            SEEDER_IMAGE_BINARY.into(),
            "install-seeder".into(),
            seeder.clone(),
        ]),
        volume_mounts: Some(vec![tools.clone()]),
        ..Default::default()
    };
    let seed = Container {
        name: "restore-seed".into(),
        image: Some(i.etcd_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![seeder]),
        args: Some(seed_args(i)),
        env: Some(credential_env(i)),
        volume_mounts: Some(vec![data.clone(), tools.clone()]),
        // The seeder's error (size, SHA-256, restore) becomes the verdict.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let etcd = Container {
        name: "etcd".into(),
        image: Some(i.etcd_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["etcd".into()]),
        args: Some(etcd_args(i)),
        volume_mounts: Some(vec![data]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(i.pod_name.clone()),
            namespace: Some(i.namespace.clone()),
            labels: Some(labels(i)),
            annotations: Some(BTreeMap::from([
                (BACKUP_ANNOTATION.to_string(), i.backup.clone()),
                (SCHEDULE_ANNOTATION.to_string(), i.schedule.clone()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![install, seed]),
            containers: vec![etcd],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_selector: (!i.node_selector.is_empty()).then(|| i.node_selector.clone()),
            volumes: Some(vec![
                Volume {
                    name: "data".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        size_limit: Some(scratch_size(i.size_bytes)),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "etcdfleet-seeder".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The labels of a drill pod and its Secret.
pub fn labels(i: &DrillPodInputs) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "etcd-drill".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "etcdfleet".to_string(),
        ),
        (DRILL_LABEL.to_string(), i.owner.clone()),
        (OWNER_LABEL.to_string(), i.owner.clone()),
    ])
}

/// Room for the downloaded snapshot and its restore (each about the
/// snapshot's size) and a margin: three times the size, at least 256Mi.
fn scratch_size(size: Option<u64>) -> Quantity {
    let mib = size
        .unwrap_or(0)
        .div_ceil(1 << 20)
        .saturating_mul(3)
        .max(256);
    Quantity(format!("{mib}Mi"))
}

fn seed_args(i: &DrillPodInputs) -> Vec<String> {
    let mut destination = i.destination.clone();
    destination.credentials_secret_name = None;
    let mut args = vec![
        "restore-seed".to_string(),
        format!(
            "--destination={}",
            serde_json::to_string(&destination).expect("destination serializes")
        ),
        format!("--object-key={}", i.object_key),
        format!("--sha256={}", i.sha256),
    ];
    if let Some(size) = i.size_bytes {
        args.push(format!("--size-bytes={size}"));
    }
    args.extend([
        format!("--data-dir={DATA_DIR}/data"),
        "--name=drill".to_string(),
        format!("--initial-cluster=drill={PEER_URL}"),
        "--initial-cluster-state=new".to_string(),
        format!("--initial-advertise-peer-urls={PEER_URL}"),
        format!("--initial-cluster-token={}", token(i)),
        format!("--restore-tool={}", restore_tool(&i.etcd_version)),
    ]);
    args
}

fn token(i: &DrillPodInputs) -> String {
    format!("drill-{}", i.backup_uid)
}

/// etcd on the pod's loopback: the restored data, served to port-forwards
/// only.
fn etcd_args(i: &DrillPodInputs) -> Vec<String> {
    let client = format!("http://127.0.0.1:{DRILL_CLIENT_PORT}");
    vec![
        "--name=drill".into(),
        format!("--data-dir={DATA_DIR}/data"),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={PEER_URL}"),
        format!("--initial-advertise-peer-urls={PEER_URL}"),
        format!("--initial-cluster=drill={PEER_URL}"),
        format!("--initial-cluster-token={}", token(i)),
        "--initial-cluster-state=new".into(),
    ]
}

fn credential_env(i: &DrillPodInputs) -> Vec<EnvVar> {
    if !i.credentials {
        return Vec::new();
    }
    RESTORE_CREDENTIAL_KEYS
        .iter()
        .map(|(key, var)| EnvVar {
            name: var.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: i.secret_name.clone(),
                    key: key.to_string(),
                    // The session token is optional; the keys are not.
                    optional: Some(*key == "sessionToken"),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn inputs() -> DrillPodInputs {
        DrillPodInputs {
            pod_name: "shop-etcd-drill".into(),
            secret_name: "shop-etcd-drill".into(),
            namespace: "etcd".into(),
            owner: "tenants.shop".into(),
            backup: "tenants/shop-nightly-202611280300".into(),
            schedule: "shop-nightly".into(),
            backup_uid: "b-uid".into(),
            etcd_version: "3.6.5".into(),
            etcd_image: "registry.local/etcd:v3.6.5".into(),
            seeder_image: "registry.local/etcdfleet:v1".into(),
            destination: ObjectStoreDestination {
                bucket: Some("backups".into()),
                credentials_secret_name: Some("s3".into()),
                ..Default::default()
            },
            object_key: "tenants/shop/x.db".into(),
            sha256: "ab".repeat(32),
            size_bytes: Some(100 << 20),
            credentials: true,
            node_selector: BTreeMap::new(),
        }
    }

    #[test]
    fn the_drill_etcd_runs_the_backups_version_on_its_loopback_and_no_member_selects_it() {
        let pod = drill_pod(&inputs());
        let spec = pod.spec.as_ref().unwrap();
        let etcd = &spec.containers[0];
        assert_eq!(etcd.image.as_deref(), Some("registry.local/etcd:v3.6.5"));
        let args = etcd.args.as_ref().unwrap();
        assert!(args.contains(&"--listen-client-urls=http://127.0.0.1:2379".to_string()));
        assert!(args.iter().all(|a| !a.contains("0.0.0.0")), "{args:?}");
        assert!(args.contains(&"--initial-cluster-token=drill-b-uid".to_string()));
        let seed = &spec.init_containers.as_ref().unwrap()[1];
        assert_eq!(seed.image, etcd.image);
        let seed_args = seed.args.as_ref().unwrap();
        assert!(seed_args.contains(&"--restore-tool=etcdutl".to_string()));
        assert!(seed_args.contains(&format!("--sha256={}", "ab".repeat(32))));
        // No credentials in the pod: they come from the Secret.
        assert!(
            seed_args.iter().all(|a| !a.contains("\"s3\"")),
            "{seed_args:?}"
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert!(
            !labels.contains_key("app.kubernetes.io/instance"),
            "{labels:?}"
        );
        assert_eq!(labels[DRILL_LABEL], "tenants.shop");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        // 100 MiB snapshot: 300Mi of scratch space.
        let data = &spec.volumes.as_ref().unwrap()[0];
        assert_eq!(
            data.empty_dir.as_ref().unwrap().size_limit,
            Some(Quantity("300Mi".into()))
        );
    }

    #[test]
    fn a_3_4_backup_restores_with_etcdctl_and_a_store_without_credentials_mounts_none() {
        let mut i = inputs();
        i.etcd_version = "3.4.37".into();
        i.credentials = false;
        let pod = drill_pod(&i);
        let seed = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[1];
        assert!(
            seed.args
                .as_ref()
                .unwrap()
                .contains(&"--restore-tool=etcdctl".to_string())
        );
        assert_eq!(seed.env.as_deref(), Some(&[][..]));
    }
}
