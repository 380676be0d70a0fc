//! What etcdfleet writes into a workload cluster, as a pure function of
//! [`RenderInputs`] (the cluster's identity and its resolved spec).
//!
//! The render contract: every object carries, in the annotation
//! [`INPUTS_HASH`], a hash of the inputs it was rendered from — not of the
//! rendered output. The controller writes an object only when it is missing,
//! when that hash differs, or when a guarded field drifted ([`drift`]). A
//! controller release that renders differently therefore writes nothing until
//! a CR changes. StatefulSet `replicas` and the members ConfigMap are not
//! rendered from the spec: they are membership state that the planner moves
//! one step at a time.

use std::collections::BTreeMap;

use etcdfleet_api::PodTemplateOverrides;
use etcdfleet_api::restore::RestoreRecord;
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapKeySelector, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, Namespace, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretKeySelector, SecretVolumeSource, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

pub use crate::names::{CLIENT_PORT, Names, PEER_PORT, scheme, selector_labels, selector_string};

/// Annotation holding the hash of the inputs an object was rendered from.
pub const INPUTS_HASH: &str = "etcdfleet.dev/inputs-hash";
/// Annotation on the pod template (and so on every pod made from it) holding
/// the StatefulSet's inputs hash: a pod whose value differs from the
/// template's was made from an older template and is rolled.
pub const TEMPLATE_HASH: &str = "etcdfleet.dev/template-hash";
/// Annotation on the StatefulSet recording `<inputs hash>=<image>` when the
/// API server stored another image than the one written (an admission
/// webhook pointing at a mirror or pinning a digest): that image is then
/// what this write looks like, not drift to undo in an endless loop.
pub const ADMITTED_IMAGE: &str = "etcdfleet.dev/admitted-image";
/// Label naming the management-side owner (`<namespace>.<name>`) of a workload object.
/// Workload objects never carry ownerReferences across clusters.
pub const OWNER_LABEL: &str = "etcdfleet.dev/owner";
pub const METRICS_PORT: u16 = 2381;
/// Key of the members ConfigMap with etcd's `--initial-cluster`.
pub const INITIAL_CLUSTER_KEY: &str = "initial-cluster";
/// Key of the members ConfigMap with etcd's `--initial-cluster-state`.
pub const INITIAL_CLUSTER_STATE_KEY: &str = "initial-cluster-state";
const DATA_MOUNT: &str = "/var/lib/etcd";
const SERVER_TLS_MOUNT: &str = "/etc/etcd/tls/server";
const PEER_TLS_MOUNT: &str = "/etc/etcd/tls/peer";
/// Where the restore seeder is copied to (an `emptyDir` shared by the two
/// init containers of a restoring member).
pub const SEEDER_MOUNT: &str = "/opt/etcdfleet";
/// Where the seeder image (the controller's, `hack/build-image.sh`) holds
/// the etcdfleet binary. `install-seeder` runs it by this path: the image
/// sets no `PATH`, and `/` is on no runtime's default one. Every image the
/// project built holds the binary there, so a restore record naming an
/// older release's image runs too.
pub const SEEDER_IMAGE_BINARY: &str = "/etcdfleet";
/// Keys of the restore credentials Secret in the workload namespace.
pub const RESTORE_CREDENTIAL_KEYS: [(&str, &str); 3] = [
    ("accessKeyId", "ETCDFLEET_RESTORE_ACCESS_KEY_ID"),
    ("secretAccessKey", "ETCDFLEET_RESTORE_SECRET_ACCESS_KEY"),
    ("sessionToken", "ETCDFLEET_RESTORE_SESSION_TOKEN"),
];

/// Everything a workload object is rendered from. Field order and names are
/// part of the hash: add new fields as `Option`s skipped when `None`, so that
/// existing clusters keep their hash.
///
/// Two inputs matter only when etcd bootstraps (the first start of member 0
/// on an empty data directory): `uid`, which makes the initial cluster token
/// unique, and `restore`, which seeds member 0. They are rendered, but the
/// StatefulSet's hash leaves them out ([`RenderInputs::statefulset_hash`]):
/// an EtcdCluster deleted without its finalizer and applied again (a new
/// UID, no status) must not roll members that run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderInputs {
    /// EtcdCluster name.
    pub name: String,
    /// EtcdCluster namespace in the management cluster.
    pub owner_namespace: String,
    /// EtcdCluster UID: makes the etcd cluster token unique. Bootstrap-only.
    pub uid: String,
    pub workload_namespace: String,
    pub image: String,
    pub version: String,
    pub tls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    pub storage_size: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    pub pod: PodTemplateOverrides,
    pub heartbeat_interval_millis: i32,
    pub election_timeout_millis: i32,
    pub quota_backend_bytes: i64,
    pub snapshot_count: i64,
    pub auto_compaction_retention: String,
    /// The verified snapshot member 0 is seeded from (`status.restore`).
    /// Bootstrap-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreRecord>,
    /// The `--initial-cluster-token` the members were bootstrapped with, as
    /// the existing StatefulSet records it; `None`: derived from `uid`. Not
    /// part of any hash (never serialized).
    #[serde(skip)]
    pub initial_cluster_token: Option<String>,
    /// Where a CA rotation stands for the members (see
    /// `etcdfleet_api::ca_rotation::roll_stamp`): each phase that changes
    /// what they trust or present changes it, which rolls them. Absent
    /// (and out of every hash) until a rotation changed the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_roll_stamp: Option<String>,
    /// The CA bundle ConfigMap is published (once a rotation was asked for).
    /// Not part of any hash.
    #[serde(skip)]
    pub publish_ca_bundle: bool,
    /// A recovery forcing a new cluster from one member (the
    /// `force-new-cluster` init containers). Not part of any hash: it is
    /// membership state, taken out again once the member forced.
    #[serde(skip)]
    pub force_new_cluster: Option<crate::recovery::ForceNewCluster>,
}

/// How this controller release renders. Tests switch to a "next release"
/// profile to prove that a rendering change alone writes nothing, and to a
/// "previous release" one to prove that objects it wrote are not rewritten.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderProfile {
    /// Extra labels on every pod template (what a later release might add).
    pub extra_pod_labels: BTreeMap<String, String>,
    /// Stamp the StatefulSet with [`RenderInputs::legacy_statefulset_hash`],
    /// as releases before bootstrap-only inputs were left out did.
    pub legacy_inputs_hash: bool,
    /// Render etcd's command line without the per-version flags
    /// ([`crate::version_flags`]), as releases before them did.
    pub legacy_flags: bool,
}

impl RenderProfile {
    /// The inputs hash this release stamps on a StatefulSet it writes.
    pub fn statefulset_hash(&self, inputs: &RenderInputs) -> String {
        if self.legacy_inputs_hash {
            inputs.legacy_statefulset_hash()
        } else {
            inputs.statefulset_hash()
        }
    }
}

fn hash_of<T: Serialize>(kind: &str, value: &T) -> String {
    let json = serde_json::to_vec(value).expect("render inputs serialize");
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(kind.as_bytes());
    ctx.update(&[0]);
    ctx.update(&json);
    let digest = ctx.finish();
    digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The identity part of the inputs: what Services, PDB and certificates depend on.
#[derive(Serialize)]
struct IdentityInputs<'a> {
    name: &'a str,
    owner_namespace: &'a str,
    workload_namespace: &'a str,
    tls: bool,
}

impl RenderInputs {
    pub fn names(&self) -> Names {
        Names::new(&self.name, &self.workload_namespace)
    }
    fn identity(&self) -> IdentityInputs<'_> {
        IdentityInputs {
            name: &self.name,
            owner_namespace: &self.owner_namespace,
            workload_namespace: &self.workload_namespace,
            tls: self.tls,
        }
    }
    /// Hash of the inputs of the StatefulSet: every input running members
    /// depend on, the bootstrap-only ones (`uid`, `restore`) blanked. The
    /// JSON is the legacy one with those two fields emptied, so no other
    /// input's serialization moves.
    pub fn statefulset_hash(&self) -> String {
        let rolled = RenderInputs {
            uid: String::new(),
            restore: None,
            ..self.clone()
        };
        hash_of("StatefulSet", &rolled)
    }

    /// The StatefulSet hash releases before this one stamped: every input,
    /// bootstrap-only ones included. A StatefulSet that carries it is
    /// current while it matches (no write, no roll: a controller upgrade
    /// changes nothing); its next write for a change of inputs stamps
    /// [`statefulset_hash`](Self::statefulset_hash).
    pub fn legacy_statefulset_hash(&self) -> String {
        hash_of("StatefulSet", self)
    }
    /// Hash of the inputs of Services, PDB and TLS Secrets: the identity.
    pub fn identity_hash(&self, kind: &str) -> String {
        hash_of(kind, &self.identity())
    }
    pub fn owner_label(&self) -> String {
        format!("{}.{}", self.owner_namespace, self.name)
    }
}

fn meta(inputs: &RenderInputs, name: String, hash: String) -> ObjectMeta {
    let mut labels = selector_labels(&inputs.names());
    labels.insert(OWNER_LABEL.to_string(), inputs.owner_label());
    ObjectMeta {
        name: Some(name),
        namespace: Some(inputs.workload_namespace.clone()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(INPUTS_HASH.to_string(), hash)])),
        ..Default::default()
    }
}

pub fn namespace(inputs: &RenderInputs) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(inputs.workload_namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "etcdfleet".to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port: port.into(),
        target_port: Some(IntOrString::Int(port.into())),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }
}

/// Headless Service giving every member a stable DNS name, ready or not.
pub fn peer_service(inputs: &RenderInputs) -> Service {
    let names = inputs.names();
    Service {
        metadata: meta(
            inputs,
            names.peer_service(),
            inputs.identity_hash("PeerService"),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(&names)),
            ports: Some(vec![port("peer", PEER_PORT), port("client", CLIENT_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// ClusterIP Service for etcd clients (the workload API server).
pub fn client_service(inputs: &RenderInputs) -> Service {
    let names = inputs.names();
    Service {
        metadata: meta(
            inputs,
            names.client_service(),
            inputs.identity_hash("ClientService"),
        ),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&names)),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// At most one member down by voluntary disruption: etcd tolerates one loss
/// at the sizes this controller runs only if nothing else is down.
pub fn pdb(inputs: &RenderInputs) -> PodDisruptionBudget {
    let names = inputs.names();
    PodDisruptionBudget {
        metadata: meta(
            inputs,
            names.pdb(),
            inputs.identity_hash("PodDisruptionBudget"),
        ),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&names)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Annotation (value [`CLOSES_ONCE_STARTED`]) of an announcing members
/// ConfigMap this release wrote, and so closes (rule 23); an earlier
/// release's stays until a membership change writes it (no CR asked).
pub const ANNOUNCEMENT_ANNOTATION: &str = "etcdfleet.dev/announcement";
pub const CLOSES_ONCE_STARTED: &str = "closes-once-started";

/// The members ConfigMap: `initial-cluster` and `initial-cluster-state` that a
/// member reads when it first starts on an empty data dir (ignored after).
pub fn members_configmap(inputs: &RenderInputs, initial_cluster: &str, state: &str) -> ConfigMap {
    let names = inputs.names();
    let mut cm = ConfigMap {
        metadata: meta(inputs, names.members_configmap(), String::new()),
        data: Some(BTreeMap::from([
            (INITIAL_CLUSTER_KEY.to_string(), initial_cluster.to_string()),
            (INITIAL_CLUSTER_STATE_KEY.to_string(), state.to_string()),
        ])),
        ..Default::default()
    };
    // Membership state, not from the spec: no inputs hash.
    cm.metadata.annotations = (initial_cluster != CLOSED_INITIAL_CLUSTER).then(|| {
        BTreeMap::from([(
            ANNOUNCEMENT_ANNOTATION.to_string(),
            CLOSES_ONCE_STARTED.to_string(),
        )])
    });
    cm
}

/// What the members ConfigMap announces when no member is to join: a
/// member that starts on an empty data directory finds its name missing and
/// exits (etcd: "couldn't find local name … in the initial cluster
/// configuration") instead of joining under its old member id with none of
/// its data, which etcd would accept (a member that joins an existing
/// cluster is matched to its old id by its peer URL) and which would let
/// it vote without the log it acknowledged.
pub const CLOSED_INITIAL_CLUSTER: &str = "etcdfleet-no-member-joins=https://closed.invalid:2380";

/// The members ConfigMap announcing no member to join
/// ([`CLOSED_INITIAL_CLUSTER`]), once every member has its data.
pub fn closed_members_configmap(inputs: &RenderInputs) -> ConfigMap {
    members_configmap(inputs, CLOSED_INITIAL_CLUSTER, "existing")
}

/// Key of the CA bundle ConfigMap: the CAs clients should trust.
pub const CA_BUNDLE_KEY: &str = "ca.crt";

/// The CA bundle ConfigMap (`<cluster>-etcd-ca-bundle`): where the
/// cluster's clients read which CAs to trust, during and after a rotation.
pub fn ca_bundle_configmap(inputs: &RenderInputs, bundle: &str) -> ConfigMap {
    let names = inputs.names();
    let mut cm = ConfigMap {
        metadata: meta(inputs, names.ca_bundle_configmap(), String::new()),
        data: Some(BTreeMap::from([(
            CA_BUNDLE_KEY.to_string(),
            bundle.to_string(),
        )])),
        ..Default::default()
    };
    // The management-side PKI, not the spec: no inputs hash.
    cm.metadata.annotations = None;
    cm
}

/// `name=peerURL` pairs for `--initial-cluster`.
pub fn initial_cluster(
    names: &Names,
    tls: bool,
    ordinals: impl IntoIterator<Item = u32>,
) -> String {
    initial_cluster_with(names, tls, ordinals, &[])
}

/// `name=peerURL` pairs for `--initial-cluster`: this cluster's members at
/// `ordinals`, then members of other names (`others`, `(name, peer URL)`:
/// the old members of an adopted etcd). A member joining an existing
/// cluster must list every member etcd has, with exactly its peer URLs.
pub fn initial_cluster_with(
    names: &Names,
    tls: bool,
    ordinals: impl IntoIterator<Item = u32>,
    others: &[(String, String)],
) -> String {
    ordinals
        .into_iter()
        .map(|o| format!("{}={}", names.pod(o), names.peer_url(o, tls)))
        .chain(others.iter().map(|(name, url)| format!("{name}={url}")))
        .collect::<Vec<_>>()
        .join(",")
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_configmap(name: &str, configmap: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: configmap.to_string(),
                key: key.to_string(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A member's DNS name with `$(POD_NAME)` for the kubelet to expand.
fn member_host_template(inputs: &RenderInputs) -> String {
    format!(
        "$(POD_NAME).{}.{}.svc",
        inputs.names().peer_service(),
        inputs.workload_namespace
    )
}

/// etcd's `--initial-cluster-token`: the one the members were bootstrapped
/// with when known, else unique per EtcdCluster object. etcd reads it only
/// when a member starts a new cluster on an empty data directory.
fn cluster_token(inputs: &RenderInputs) -> String {
    if let Some(token) = &inputs.initial_cluster_token {
        return token.clone();
    }
    format!(
        "{}-{}",
        inputs.name,
        inputs.uid.split('-').next().unwrap_or_default()
    )
}

/// The `--initial-cluster-token` of a cluster restored from a backup by a
/// recovery (`recovery`: the recovery's id and start time, which name it
/// once): etcd derives the member ids from the token and the peer URLs,
/// and the cluster id from the member ids, so the restored cluster shares
/// no id with the lost one (whose members, back on their old data, etcd
/// then refuses as another cluster's) nor with an earlier restore.
pub fn restored_cluster_token(name: &str, uid: &str, recovery: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, recovery.as_bytes());
    let stamp: String = (digest.as_ref()[..4].iter())
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{name}-{}-{stamp}",
        uid.split('-').next().unwrap_or_default()
    )
}

/// The `--initial-cluster-token` a StatefulSet's etcd container runs with.
pub fn statefulset_cluster_token(sts: &StatefulSet) -> Option<String> {
    pod_cluster_token(sts.spec.template.spec.as_ref()?)
}

/// The `--initial-cluster-token` of a pod's etcd container.
pub fn pod_cluster_token(pod: &PodSpec) -> Option<String> {
    let etcd = pod.containers.iter().find(|c| c.name == "etcd")?;
    etcd.args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--initial-cluster-token="))
        .map(str::to_string)
}

/// The etcd tool that restores a snapshot in this version's image: `etcdutl`
/// from 3.5 on, `etcdctl` (v3 API) before.
pub fn restore_tool(version: &str) -> &'static str {
    let mut parts = version.trim_start_matches('v').split('.');
    let major: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(3);
    let minor: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(5);
    if (major, minor) < (3, 5) {
        "etcdctl"
    } else {
        "etcdutl"
    }
}

/// The two init containers of a restoring cluster's members and their shared
/// volume: `install-seeder` copies the etcdfleet binary from the seeder image
/// into an `emptyDir`; `restore-seed` runs it in the etcd image (next to
/// `etcdutl`/`etcdctl`), where it seeds the data directory of a member that
/// bootstraps a `new` cluster and does nothing for one joining an existing
/// cluster (see `etcdfleet restore-seed`).
fn restore_init_containers(
    inputs: &RenderInputs,
    record: &RestoreRecord,
    data_mount: &VolumeMount,
) -> (Vec<Container>, Volume) {
    let names = inputs.names();
    let crate::install::Installed {
        container: install,
        volume,
        mount: tools,
        binary: seeder,
    } = crate::install::install_etcdfleet(
        "install-seeder",
        "etcdfleet-seeder",
        &record.seeder_image,
        SEEDER_IMAGE_BINARY,
        SEEDER_MOUNT,
    );
    // The destination as the seeder needs it: credentials come from the env.
    let mut destination = record.destination.clone();
    destination.credentials_secret_name = None;
    let s = scheme(inputs.tls);
    let host = member_host_template(inputs);
    let mut args = vec![
        "restore-seed".to_string(),
        format!(
            "--destination={}",
            serde_json::to_string(&destination).expect("destination serializes")
        ),
        format!("--object-key={}", record.object_key),
        format!("--sha256={}", record.sha256),
    ];
    if let Some(size) = record.size_bytes {
        args.push(format!("--size-bytes={size}"));
    }
    args.extend([
        format!("--data-dir={DATA_MOUNT}/data"),
        "--name=$(POD_NAME)".to_string(),
        "--initial-cluster=$(ETCD_INITIAL_CLUSTER)".to_string(),
        "--initial-cluster-state=$(ETCD_INITIAL_CLUSTER_STATE)".to_string(),
        format!("--initial-advertise-peer-urls={s}://{host}:{PEER_PORT}"),
        format!("--initial-cluster-token={}", cluster_token(inputs)),
        format!("--restore-tool={}", restore_tool(&inputs.version)),
    ]);
    let mut env = member_env(&names);
    if record.destination.credentials_secret_name.is_some() {
        for (key, var) in RESTORE_CREDENTIAL_KEYS {
            env.push(EnvVar {
                name: var.to_string(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: names.restore_secret(),
                        key: key.to_string(),
                        // A member that joins later (or restarts) needs none.
                        optional: Some(true),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    let seed = Container {
        name: "restore-seed".to_string(),
        image: Some(inputs.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![seeder]),
        args: Some(args),
        env: Some(env),
        volume_mounts: Some(vec![data_mount.clone(), tools]),
        ..Default::default()
    };
    (vec![install, seed], volume)
}

/// The env every member container gets: its name and the membership the
/// members ConfigMap announces.
fn member_env(names: &Names) -> Vec<EnvVar> {
    vec![
        env_field("POD_NAME", "metadata.name"),
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env_configmap(
            "ETCD_INITIAL_CLUSTER",
            &names.members_configmap(),
            INITIAL_CLUSTER_KEY,
        ),
        env_configmap(
            "ETCD_INITIAL_CLUSTER_STATE",
            &names.members_configmap(),
            INITIAL_CLUSTER_STATE_KEY,
        ),
    ]
}

/// etcd's command line for a member as this release renders it; `$(POD_NAME)`
/// is expanded by the kubelet.
pub fn etcd_args(inputs: &RenderInputs) -> Vec<String> {
    etcd_args_for(inputs, &RenderProfile::default())
}

/// etcd's command line as `profile` renders it: the flags every version
/// shares, then those of the version that runs ([`crate::version_flags`]).
/// Changing these changes no inputs hash: a StatefulSet written by an
/// earlier release keeps its command line until its inputs change.
pub fn etcd_args_for(inputs: &RenderInputs, profile: &RenderProfile) -> Vec<String> {
    let mut args = shared_etcd_args(inputs);
    if !profile.legacy_flags {
        args.extend(crate::version_flags::version_flags(&inputs.version));
    }
    args
}

/// The flags every supported etcd version accepts with the same meaning.
fn shared_etcd_args(inputs: &RenderInputs) -> Vec<String> {
    let s = scheme(inputs.tls);
    let host = member_host_template(inputs);
    let mut args = vec![
        "--name=$(POD_NAME)".to_string(),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!("--listen-peer-urls={s}://0.0.0.0:{PEER_PORT}"),
        format!("--listen-client-urls={s}://0.0.0.0:{CLIENT_PORT}"),
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
        format!("--advertise-client-urls={s}://{host}:{CLIENT_PORT}"),
        format!("--initial-advertise-peer-urls={s}://{host}:{PEER_PORT}"),
        format!("--initial-cluster-token={}", cluster_token(inputs)),
        format!("--heartbeat-interval={}", inputs.heartbeat_interval_millis),
        format!("--election-timeout={}", inputs.election_timeout_millis),
        format!("--quota-backend-bytes={}", inputs.quota_backend_bytes),
        format!("--snapshot-count={}", inputs.snapshot_count),
        "--auto-compaction-mode=periodic".to_string(),
        format!(
            "--auto-compaction-retention={}",
            inputs.auto_compaction_retention
        ),
    ];
    if inputs.tls {
        args.extend([
            "--client-cert-auth=true".to_string(),
            format!("--trusted-ca-file={SERVER_TLS_MOUNT}/ca.crt"),
            format!("--cert-file={SERVER_TLS_MOUNT}/tls.crt"),
            format!("--key-file={SERVER_TLS_MOUNT}/tls.key"),
            "--peer-client-cert-auth=true".to_string(),
            format!("--peer-trusted-ca-file={PEER_TLS_MOUNT}/ca.crt"),
            format!("--peer-cert-file={PEER_TLS_MOUNT}/tls.crt"),
            format!("--peer-key-file={PEER_TLS_MOUNT}/tls.key"),
        ]);
    }
    args
}

fn default_affinity(names: &Names) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        topology_key: "kubernetes.io/hostname".to_string(),
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels(names)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The member StatefulSet. `replicas` is the planner's, not the spec's.
pub fn statefulset(inputs: &RenderInputs, profile: &RenderProfile, replicas: i32) -> StatefulSet {
    let names = inputs.names();
    let pod_labels = pod_labels(inputs, profile, &names);
    let (mounts, mut volumes) = member_volumes(inputs, &names);
    let data_mount = mounts[0].clone();
    let container = etcd_container(inputs, profile, &names, mounts);
    let etcd_run = crate::recovery::EtcdContainer {
        image: inputs.image.clone(),
        args: container.args.clone().unwrap_or_default(),
        env: member_env(&names),
        data_mount: data_mount.clone(),
        mounts: mounts_after_data(&container),
        data_dir: format!("{DATA_MOUNT}/data"),
        tools_binary: SEEDER_IMAGE_BINARY,
    };
    let mut init_containers = inputs.restore.as_ref().map(|record| {
        let (containers, volume) = restore_init_containers(inputs, record, &data_mount);
        volumes.push(volume);
        containers
    });
    if let Some(force) = &inputs.force_new_cluster {
        let (containers, volume) = crate::recovery::init_containers(force, &etcd_run);
        volumes.push(volume);
        init_containers
            .get_or_insert_with(Vec::new)
            .extend(containers);
    }
    let overrides = &inputs.pod;
    let hash = profile.statefulset_hash(inputs);
    StatefulSet {
        metadata: meta(inputs, names.statefulset(), hash.clone()),
        spec: StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(names.peer_service()),
            pod_management_policy: Some("Parallel".to_string()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_string()),
                ..Default::default()
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".to_string()),
                    when_scaled: Some("Retain".to_string()),
                },
            ),
            selector: LabelSelector {
                match_labels: Some(selector_labels(&names)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some({
                        let mut a = overrides.annotations.clone().unwrap_or_default();
                        a.insert(TEMPLATE_HASH.to_string(), hash);
                        a
                    }),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers,
                    containers: vec![container],
                    volumes: Some(volumes),
                    node_selector: overrides.node_selector.clone(),
                    tolerations: overrides.tolerations.clone(),
                    affinity: Some(
                        overrides
                            .affinity
                            .clone()
                            .unwrap_or_else(|| default_affinity(&names)),
                    ),
                    priority_class_name: overrides.priority_class_name.clone(),
                    termination_grace_period_seconds: Some(30),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![data_claim_template(inputs, &names)]),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The etcd container's mounts other than its data volume (TLS).
fn mounts_after_data(container: &Container) -> Vec<VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .skip(1)
        .cloned()
        .collect()
}

/// The member pods' labels: the selector, the owner, then the spec's and the
/// profile's extra labels (never overriding those).
fn pod_labels(
    inputs: &RenderInputs,
    profile: &RenderProfile,
    names: &Names,
) -> BTreeMap<String, String> {
    let mut pod_labels = selector_labels(names);
    pod_labels.insert(OWNER_LABEL.to_string(), inputs.owner_label());
    if let Some(extra) = &inputs.pod.labels {
        for (k, v) in extra {
            pod_labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    for (k, v) in &profile.extra_pod_labels {
        pod_labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    pod_labels
}

/// The etcd container's mounts (data first) and the pod's Secret volumes.
fn member_volumes(inputs: &RenderInputs, names: &Names) -> (Vec<VolumeMount>, Vec<Volume>) {
    let mut mounts = vec![VolumeMount {
        name: "data".to_string(),
        mount_path: DATA_MOUNT.to_string(),
        ..Default::default()
    }];
    let mut volumes = vec![];
    if inputs.tls {
        for (vol, secret, path) in [
            ("server-tls", names.server_tls_secret(), SERVER_TLS_MOUNT),
            ("peer-tls", names.peer_tls_secret(), PEER_TLS_MOUNT),
        ] {
            mounts.push(VolumeMount {
                name: vol.to_string(),
                mount_path: path.to_string(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(Volume {
                name: vol.to_string(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret),
                    default_mode: Some(0o400),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    (mounts, volumes)
}

/// etcd's own health check (serializable: answered by the member itself).
fn etcd_probe(failure_threshold: i32, initial_delay: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health?serializable=true".to_string()),
            port: IntOrString::Int(METRICS_PORT.into()),
            scheme: Some("HTTP".to_string()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}

/// The etcd container.
fn etcd_container(
    inputs: &RenderInputs,
    profile: &RenderProfile,
    names: &Names,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: "etcd".to_string(),
        image: Some(inputs.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec!["etcd".to_string()]),
        args: Some(etcd_args_for(inputs, profile)),
        env: Some(member_env(names)),
        ports: Some(vec![
            ContainerPort {
                name: Some("client".into()),
                container_port: CLIENT_PORT.into(),
                ..Default::default()
            },
            ContainerPort {
                name: Some("peer".into()),
                container_port: PEER_PORT.into(),
                ..Default::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: METRICS_PORT.into(),
                ..Default::default()
            },
        ]),
        resources: inputs.resources.clone(),
        volume_mounts: Some(mounts),
        startup_probe: Some(etcd_probe(24, 5)),
        liveness_probe: Some(etcd_probe(8, 0)),
        // Ready = etcd's own health check passes in the pod (the member has a
        // leader, no alarm): the controller's second vantage point, so a
        // member it cannot reach but the workload cluster sees healthy is a
        // network problem, never a member to replace.
        readiness_probe: Some(etcd_probe(3, 0)),
        ..Default::default()
    }
}

/// The claim template of the members' data volumes.
fn data_claim_template(inputs: &RenderInputs, names: &Names) -> PersistentVolumeClaim {
    let mut storage_request = BTreeMap::new();
    storage_request.insert("storage".to_string(), Quantity(inputs.storage_size.clone()));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_string()),
            labels: Some(selector_labels(names)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: inputs.storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(storage_request),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The image the StatefulSet's etcd container runs.
pub fn statefulset_image(sts: &StatefulSet) -> Option<&str> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "etcd")?
        .image
        .as_deref()
}

/// The template hash of a StatefulSet's pod template, if stamped.
pub fn statefulset_template_hash(sts: &StatefulSet) -> Option<&str> {
    sts.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(TEMPLATE_HASH)
        .map(String::as_str)
}

/// The owner label of a workload object, if any.
pub fn owner_of(meta: &ObjectMeta) -> Option<&str> {
    meta.labels.as_ref()?.get(OWNER_LABEL).map(String::as_str)
}

/// The storage a StatefulSet's claim template asks for: (class, size).
pub fn statefulset_storage(sts: &StatefulSet) -> Option<(Option<String>, Option<String>)> {
    let claim = sts.spec.volume_claim_templates.as_ref()?.first()?;
    let spec = claim.spec.as_ref()?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    Some((spec.storage_class_name.clone(), size))
}

/// The value of [`ADMITTED_IMAGE`] for an image admitted for inputs `hash`.
pub fn admitted_image(hash: &str, image: &str) -> String {
    format!("{hash}={image}")
}

/// The inputs hash an object carries, if any.
pub fn carried_hash(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(INPUTS_HASH)
        .map(String::as_str)
}

/// Why an existing StatefulSet must be rewritten, if it must: its inputs hash
/// differs, or a guarded field (the image) drifted from what the inputs say.
/// The hash of a release before this one ([`RenderInputs::legacy_statefulset_hash`])
/// is current too while it matches.
pub fn drift(existing: &StatefulSet, inputs: &RenderInputs) -> Option<String> {
    let want = inputs.statefulset_hash();
    let want = match carried_hash(&existing.metadata) {
        Some(h) if h == want => want,
        Some(h) if h == inputs.legacy_statefulset_hash() => h.to_string(),
        Some(h) => return Some(format!("inputs changed (hash {h} → {want})")),
        None => return Some("no inputs hash".to_string()),
    };
    let admitted = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADMITTED_IMAGE));
    match statefulset_image(existing) {
        Some(img) if img == inputs.image => None,
        Some(img) if admitted == Some(&admitted_image(&want, img)) => None,
        other => Some(format!(
            "image drifted: {} (want {})",
            other.unwrap_or("none"),
            inputs.image
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> RenderInputs {
        RenderInputs {
            name: "main".into(),
            owner_namespace: "team-a".into(),
            uid: "1234abcd-0000".into(),
            workload_namespace: "etcd-system".into(),
            image: "gcr.io/etcd-development/etcd:v3.5.1".into(),
            version: "3.5.1".into(),
            tls: true,
            storage_class: None,
            storage_size: "8Gi".into(),
            resources: None,
            pod: PodTemplateOverrides::default(),
            heartbeat_interval_millis: 100,
            election_timeout_millis: 1000,
            quota_backend_bytes: 2 << 30,
            snapshot_count: 10000,
            auto_compaction_retention: "1h".into(),
            restore: None,
            initial_cluster_token: None,
            ca_roll_stamp: None,
            publish_ca_bundle: false,
            force_new_cluster: None,
        }
    }

    fn a_restore_record() -> RestoreRecord {
        RestoreRecord {
            backup_name: Some("nightly".into()),
            destination: etcdfleet_api::ObjectStoreDestination {
                bucket: Some("b".into()),
                credentials_secret_name: Some("s3".into()),
                ..Default::default()
            },
            object_key: "team/c/1.db".into(),
            sha256: "ab".repeat(32),
            size_bytes: Some(42),
            seeder_image: "etcdfleet/controller:v1".into(),
            verified_time: None,
        }
    }

    /// The previous release's StatefulSet hash is unchanged: a StatefulSet it
    /// wrote is current for this one (values computed by the previous
    /// release's `statefulset_hash` on these inputs).
    #[test]
    fn the_previous_releases_hash_is_recognised_bit_for_bit() {
        let mut i = inputs();
        assert_eq!(i.legacy_statefulset_hash(), "c378bd8e864a2daebd823cbe");
        let old = statefulset(
            &i,
            &RenderProfile {
                legacy_inputs_hash: true,
                ..Default::default()
            },
            3,
        );
        assert_eq!(
            carried_hash(&old.metadata),
            Some("c378bd8e864a2daebd823cbe")
        );
        assert_eq!(drift(&old, &i), None);
        i.restore = Some(a_restore_record());
        assert_eq!(i.legacy_statefulset_hash(), "3703f718b8723a78de291822");
        // A real change of inputs is still a change.
        i.snapshot_count += 1;
        assert!(drift(&old, &i).unwrap().contains("inputs changed"));
    }

    #[test]
    fn a_statefulset_whose_seeder_ran_etcdfleet_by_name_is_current() {
        // Releases before v0.2.0 rendered `etcdfleet install-seeder ...`,
        // which no image can run (the binary is /etcdfleet, the image sets
        // no PATH). The command is outside every hash and drift: a
        // StatefulSet they wrote is not rewritten, its members not rolled.
        let mut i = inputs();
        i.restore = Some(a_restore_record());
        let mut old = statefulset(&i, &RenderProfile::default(), 3);
        let pod = old.spec.template.spec.as_mut().unwrap();
        let install = &mut pod.init_containers.as_mut().unwrap()[0];
        assert_eq!(install.name, "install-seeder");
        assert_eq!(install.command.as_ref().unwrap()[0], SEEDER_IMAGE_BINARY);
        install.command.as_mut().unwrap()[0] = "etcdfleet".into();
        assert_eq!(drift(&old, &i), None);
        assert_eq!(
            statefulset_template_hash(&old),
            statefulset_template_hash(&statefulset(&i, &RenderProfile::default(), 3))
        );
    }

    #[test]
    fn bootstrap_only_inputs_change_no_hash_and_a_recorded_token_is_kept() {
        let a = inputs();
        let sts = statefulset(&a, &RenderProfile::default(), 3);
        assert_eq!(
            statefulset_cluster_token(&sts).as_deref(),
            Some("main-1234abcd")
        );
        // The same EtcdCluster applied again: a new UID, no status.restore.
        let mut again = a.clone();
        again.uid = "99999999-0000".into();
        assert_eq!(again.statefulset_hash(), a.statefulset_hash());
        assert_eq!(drift(&sts, &again), None);
        let mut restored = a.clone();
        restored.restore = Some(a_restore_record());
        assert_eq!(restored.statefulset_hash(), a.statefulset_hash());
        assert_eq!(drift(&sts, &restored), None);
        // Rewritten for a real change, the members keep the token they
        // were bootstrapped with.
        again.snapshot_count += 1;
        assert!(drift(&sts, &again).is_some());
        again.initial_cluster_token = statefulset_cluster_token(&sts);
        let rewritten = statefulset(&again, &RenderProfile::default(), 3);
        assert_eq!(
            statefulset_cluster_token(&rewritten).as_deref(),
            Some("main-1234abcd")
        );
        // Inputs that running members depend on still change the hash.
        let mut tuned = a.clone();
        tuned.heartbeat_interval_millis += 1;
        assert_ne!(tuned.statefulset_hash(), a.statefulset_hash());
    }

    #[test]
    fn names_are_deterministic_and_parse_back() {
        let n = Names::new("main", "etcd-system");
        assert_eq!(n.pod(2), "main-etcd-2");
        assert_eq!(n.pvc(2), "data-main-etcd-2");
        assert_eq!(
            n.peer_url(1, true),
            "https://main-etcd-1.main-etcd-peer.etcd-system.svc:2380"
        );
        assert_eq!(n.ordinal_of_peer_url(&n.peer_url(4, false)), Some(4));
        assert_eq!(
            n.ordinal_of_peer_url("https://main-etcd-1.other-peer.etcd-system.svc:2380"),
            None
        );
        assert_eq!(n.ordinal_of("main-etcd-x"), None);
        assert_eq!(
            initial_cluster(&n, false, [0, 1]),
            "main-etcd-0=http://main-etcd-0.main-etcd-peer.etcd-system.svc:2380,main-etcd-1=http://main-etcd-1.main-etcd-peer.etcd-system.svc:2380"
        );
    }

    #[test]
    fn hash_depends_on_inputs_not_on_profile() {
        let a = inputs();
        let sts = statefulset(&a, &RenderProfile::default(), 3);
        let mut profile = RenderProfile::default();
        profile
            .extra_pod_labels
            .insert("next-release".into(), "yes".into());
        let next = statefulset(&a, &profile, 3);
        assert_ne!(sts, next, "the next-release profile renders differently");
        assert_eq!(carried_hash(&sts.metadata), carried_hash(&next.metadata));
        assert_eq!(drift(&next, &a), None);

        let mut b = a.clone();
        b.version = "3.5.2".into();
        b.image = "gcr.io/etcd-development/etcd:v3.5.2".into();
        assert!(drift(&sts, &b).unwrap().contains("inputs changed"));
        // identity objects do not change with the version
        assert_eq!(
            a.identity_hash("PeerService"),
            b.identity_hash("PeerService")
        );
    }

    #[test]
    fn image_drift_is_detected_even_with_the_same_hash() {
        let a = inputs();
        let mut sts = statefulset(&a, &RenderProfile::default(), 1);
        sts.spec.template.spec.as_mut().unwrap().containers[0].image = Some("evil:latest".into());
        assert!(drift(&sts, &a).unwrap().contains("image drifted"));
    }

    #[test]
    fn an_image_rewritten_at_admission_is_not_drift_but_a_later_edit_is() {
        let a = inputs();
        let mut sts = statefulset(&a, &RenderProfile::default(), 1);
        let set_image = |sts: &mut StatefulSet, img: &str| {
            sts.spec.template.spec.as_mut().unwrap().containers[0].image = Some(img.into());
        };
        set_image(&mut sts, "mirror.example/etcd:v3.5.1");
        sts.metadata.annotations.as_mut().unwrap().insert(
            ADMITTED_IMAGE.into(),
            admitted_image(&a.statefulset_hash(), "mirror.example/etcd:v3.5.1"),
        );
        assert_eq!(drift(&sts, &a), None);
        set_image(&mut sts, "evil:latest");
        assert!(drift(&sts, &a).unwrap().contains("image drifted"));
    }

    #[test]
    fn statefulset_is_ondelete_retains_pvcs_and_reads_membership_from_configmap() {
        let sts = statefulset(&inputs(), &RenderProfile::default(), 1);
        let spec = sts.spec;
        assert_eq!(
            spec.update_strategy.unwrap().type_.as_deref(),
            Some("OnDelete")
        );
        let retention = spec.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(retention.when_deleted.as_deref(), Some("Retain"));
        assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
        let c = &spec.template.spec.unwrap().containers[0];
        let env: Vec<_> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert!(env.contains(&"ETCD_INITIAL_CLUSTER"));
        assert!(env.contains(&"ETCD_INITIAL_CLUSTER_STATE"));
        let args = c.args.as_ref().unwrap();
        assert!(args.contains(&"--client-cert-auth=true".to_string()));
        assert!(args.iter().any(|a| a.starts_with(
            "--advertise-client-urls=https://$(POD_NAME).main-etcd-peer.etcd-system.svc:2379"
        )));
        assert!(
            sts.metadata.owner_references.is_none(),
            "no cross-cluster owners"
        );
    }

    #[test]
    fn plain_http_without_tls() {
        let mut i = inputs();
        i.tls = false;
        let args = etcd_args(&i);
        assert!(
            args.iter()
                .all(|a| !a.contains("https") && !a.contains("cert"))
        );
    }

    #[test]
    fn a_restoring_cluster_seeds_through_two_init_containers_and_keeps_its_hash_otherwise() {
        let plain = inputs();
        let mut restoring = inputs();
        restoring.version = "3.4.23".into();
        restoring.restore = Some(RestoreRecord {
            backup_name: Some("nightly".into()),
            destination: etcdfleet_api::ObjectStoreDestination {
                bucket: Some("b".into()),
                credentials_secret_name: Some("s3".into()),
                ..Default::default()
            },
            object_key: "team/c/1.db".into(),
            sha256: "ab".repeat(32),
            size_bytes: Some(42),
            seeder_image: "etcdfleet/controller:v1".into(),
            verified_time: None,
        });
        // Not restoring: the template and its hash are what they were.
        let sts = statefulset(&plain, &RenderProfile::default(), 1);
        let pod = sts.spec.template.spec.unwrap();
        assert!(pod.init_containers.is_none());
        assert!(!serde_json::to_string(&plain).unwrap().contains("restore"));

        let sts = statefulset(&restoring, &RenderProfile::default(), 1);
        let pod = sts.spec.template.spec.unwrap();
        let inits = pod.init_containers.unwrap();
        assert_eq!(inits[0].image.as_deref(), Some("etcdfleet/controller:v1"));
        assert_eq!(
            inits[0].command.as_deref().unwrap(),
            ["/etcdfleet", "install-seeder", "/opt/etcdfleet/etcdfleet"]
        );
        assert_eq!(inits[1].image, Some(restoring.image.clone()));
        let args = inits[1].args.clone().unwrap();
        for want in [
            "--object-key=team/c/1.db",
            "--size-bytes=42",
            "--restore-tool=etcdctl",
            "--initial-cluster-state=$(ETCD_INITIAL_CLUSTER_STATE)",
            "--data-dir=/var/lib/etcd/data",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
        }
        // The seeder never sees the management-side Secret name; it reads
        // the copy in the workload namespace, optional for later members.
        assert!(!args.iter().any(|a| a.contains("credentialsSecretName")));
        let env = inits[1].env.clone().unwrap();
        let key = env
            .iter()
            .find(|e| e.name == "ETCDFLEET_RESTORE_ACCESS_KEY_ID")
            .and_then(|e| e.value_from.as_ref()?.secret_key_ref.clone())
            .unwrap();
        assert_eq!(key.name, "main-etcd-restore");
        assert_eq!(key.optional, Some(true));
        assert!(
            pod.volumes
                .unwrap()
                .iter()
                .any(|v| v.name == "etcdfleet-seeder" && v.empty_dir.is_some())
        );
        assert_eq!(restore_tool("3.5.1"), "etcdutl");
        assert_eq!(restore_tool("v3.6.0"), "etcdutl");
    }
}
