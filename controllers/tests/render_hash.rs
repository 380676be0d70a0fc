//! The render hash of a fixed set of EtcdClusters, pinned.
//!
//! Every object etcdfleet writes into a workload cluster carries the hash of
//! the inputs it was rendered from (`etcdfleet.dev/inputs-hash`), and the
//! controller rewrites an object only when that hash changes. So the hash a
//! release computes for an unchanged CR decides whether installing the
//! release touches the fleet: if it differs from the previous release's, the
//! new controller rewrites every Service, PDB and TLS Secret, and rewrites
//! and ROLLS every StatefulSet of every cluster — without any CR changing.
//!
//! These values were computed by release v0.1.0 (CHANGELOG.md): this file,
//! compiled against a worktree of that release's commit, printed exactly
//! this table, and `etcdfleet render` of that release stamps the same
//! StatefulSet, Service and PodDisruptionBudget hashes on the fixtures. They
//! must never change. The CRs below are stored objects as a fleet holds them
//! after materialization (defaults written into the spec), with fixed UIDs.

use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::etcdcluster::plan::ObjectKind;
use etcdfleet_controllers::etcdcluster::resolve::{render_inputs, resolve_own_spec};
use etcdfleet_controllers::render::{self, RenderInputs, RenderProfile, carried_hash};

const RULE: &str = "\
The render hash of an unchanged EtcdCluster changed. Installing this release would \
rewrite the workload objects of every cluster in the fleet and roll every etcd member, \
with no CR changing: the first rule of etcdfleet forbids it.
What a hash covers is a contract with every release already installed. To add a render \
input, add it to RenderInputs as an Option skipped when None (serde \
skip_serializing_if), so clusters that do not set it keep their hash; never rename, \
reorder or re-type a serialized field, and never change the kind strings. If a hash must \
change, keep the old one recognised as current (see RenderInputs::legacy_statefulset_hash \
and render::drift), prove it with the previous-release upgrade test \
(tests/tests/real_upgrade_previous_release.rs), and only then pin the new value here.";

/// A fixed fleet: name, stored manifest.
const FLEET: &[(&str, &str)] = &[
    (
        "minimal",
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata: {name: shop, namespace: team-a, uid: 0b5e7c1e-0000-4000-8000-000000000001}
spec:
  clusterRef: {name: shop}
  version: 3.5.1
  replicas: 3
  imageRepository: gcr.io/etcd-development/etcd
  workloadNamespace: etcd-system
  storage: {size: 8Gi}
  tls: {enabled: true}
",
    ),
    (
        "full",
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata: {name: payments-prod, namespace: team-payments, uid: 0b5e7c1e-0000-4000-8000-000000000002}
spec:
  kubeconfigSecretRef: {name: payments-prod-admin-kubeconfig, key: kubeconfig}
  templateRef: {kind: EtcdTemplate, name: payments}
  paused: false
  version: 3.5.1
  replicas: 5
  imageRepository: registry.example.com/mirror/etcd
  workloadNamespace: etcd
  storage: {storageClassName: premium-ssd, size: 50Gi}
  resources:
    requests: {cpu: '1', memory: 4Gi}
    limits: {memory: 8Gi}
  tls: {enabled: true}
  podTemplate:
    labels: {team: payments}
    annotations: {example.com/owner: payments-oncall}
    nodeSelector: {node-role.kubernetes.io/etcd: ''}
    tolerations: [{key: node-role.kubernetes.io/etcd, operator: Exists, effect: NoSchedule}]
    priorityClassName: system-cluster-critical
  etcd:
    heartbeatIntervalMillis: 100
    electionTimeoutMillis: 1000
    quotaBackendBytes: 8589934592
    autoCompactionRetention: 30m
    snapshotCount: 10000
",
    ),
    (
        "plain-3.4",
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata: {name: legacy, namespace: team-b, uid: 0b5e7c1e-0000-4000-8000-000000000003}
spec:
  clusterRef: {name: legacy}
  version: 3.4.23
  replicas: 1
  imageRepository: gcr.io/etcd-development/etcd
  workloadNamespace: etcd-legacy
  storage: {size: 2Gi}
  tls: {enabled: false}
  paused: true
",
    ),
    (
        "restored",
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata: {name: restored, namespace: team-a, uid: 0b5e7c1e-0000-4000-8000-000000000004}
spec:
  clusterRef: {name: restored}
  version: 3.5.1
  replicas: 3
  imageRepository: gcr.io/etcd-development/etcd
  workloadNamespace: etcd-system
  storage: {size: 8Gi}
  tls: {enabled: true}
  bootstrap:
    restore: {backupName: shop-nightly-202611220300}
status:
  restore:
    backupName: shop-nightly-202611220300
    destination: {bucket: backups, prefix: prod, credentialsSecretName: s3}
    objectKey: prod/team-a/shop/20261122T030000Z-42-shop-nightly-202611220300.db
    sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    sizeBytes: 20480
    seederImage: etcdfleet/controller:v0.1.0
    verifiedTime: '2026-11-22T03:01:00Z'
",
    ),
];

/// Every hash a release stamps for one cluster: (object, hash).
fn hashes(inputs: &RenderInputs) -> Vec<(String, String)> {
    let mut out = vec![
        ("StatefulSet".to_string(), inputs.statefulset_hash()),
        (
            "StatefulSet (legacy hash, still recognised)".to_string(),
            inputs.legacy_statefulset_hash(),
        ),
    ];
    for kind in [
        ObjectKind::PeerService,
        ObjectKind::ClientService,
        ObjectKind::PodDisruptionBudget,
        ObjectKind::ServerTlsSecret,
        ObjectKind::PeerTlsSecret,
    ] {
        let kind = format!("{kind:?}");
        out.push((kind.clone(), inputs.identity_hash(&kind)));
    }
    out
}

fn inputs_of(manifest: &str) -> RenderInputs {
    let cluster: EtcdCluster = etcdfleet_api::yaml::from_str(manifest).expect("fixture parses");
    let resolution = resolve_own_spec(&cluster.spec).expect("fixture resolves");
    render_inputs(&cluster, &resolution)
}

/// What v0.1.0 computed for [`FLEET`], in its order.
#[rustfmt::skip]
const PINNED: &[(&str, &str, &str)] = &[
    ("minimal", "StatefulSet", "8e8cf42f74ca169e2d2b86c4"),
    ("minimal", "StatefulSet (legacy hash, still recognised)", "7c36901e9a3582e170dbdd50"),
    ("minimal", "PeerService", "f745ee3757ebb130695e7d5d"),
    ("minimal", "ClientService", "a99e8f95e5d6ca388477434b"),
    ("minimal", "PodDisruptionBudget", "c6b6c775ea4c09400a2cdf11"),
    ("minimal", "ServerTlsSecret", "2696da76c81a4a66d4f66058"),
    ("minimal", "PeerTlsSecret", "4b6242eed901cae78467f04a"),
    ("full", "StatefulSet", "18b715e4aa764deeea50dd9c"),
    ("full", "StatefulSet (legacy hash, still recognised)", "460593d616343dbdcf21d1d2"),
    ("full", "PeerService", "2c7c3a2f6bd4dd7fa62c3cb0"),
    ("full", "ClientService", "a95b4db5487f99d052d2d531"),
    ("full", "PodDisruptionBudget", "5d4ab7e9b98d50e0b253468a"),
    ("full", "ServerTlsSecret", "dc571cb12e90a137e5a4bc0b"),
    ("full", "PeerTlsSecret", "f8a45f68fc59d688928f1266"),
    ("plain-3.4", "StatefulSet", "8bed090f768aaa7fb04d1c1e"),
    ("plain-3.4", "StatefulSet (legacy hash, still recognised)", "499b95b6ce9cb9f32526fca9"),
    ("plain-3.4", "PeerService", "7361ed7a127aa1704a6a60ad"),
    ("plain-3.4", "ClientService", "c8665ef782ce2c1453184399"),
    ("plain-3.4", "PodDisruptionBudget", "3778706cc9deea9aa014442d"),
    ("plain-3.4", "ServerTlsSecret", "3ec43ae164e544d8c317c857"),
    ("plain-3.4", "PeerTlsSecret", "68779500be390cbbfe7b0d62"),
    ("restored", "StatefulSet", "33b4513dab86246dbf2e6259"),
    ("restored", "StatefulSet (legacy hash, still recognised)", "dc552715abf8294129480704"),
    ("restored", "PeerService", "46cd9f3d82ae07a59904927a"),
    ("restored", "ClientService", "580f0ef13299eba71ab332ff"),
    ("restored", "PodDisruptionBudget", "6575f610a7a5bf0f22bef63c"),
    ("restored", "ServerTlsSecret", "af622d92ff517d928081748c"),
    ("restored", "PeerTlsSecret", "e087bdd32e3fb29b1f6503f0"),
];

#[test]
fn the_render_hash_of_a_fixed_fleet_is_pinned() {
    let mut computed = Vec::new();
    for (name, manifest) in FLEET {
        let inputs = inputs_of(manifest);
        for (object, hash) in hashes(&inputs) {
            computed.push((name.to_string(), object, hash));
        }
        // What the rendered objects carry is what the hashes say.
        let sts = render::statefulset(&inputs, &RenderProfile::default(), 3);
        assert_eq!(
            carried_hash(&sts.metadata),
            Some(inputs.statefulset_hash().as_str())
        );
        let svc = render::peer_service(&inputs);
        assert_eq!(
            carried_hash(&svc.metadata),
            Some(inputs.identity_hash("PeerService").as_str())
        );
    }
    let pinned: Vec<(String, String, String)> = PINNED
        .iter()
        .map(|(n, o, h)| (n.to_string(), o.to_string(), h.to_string()))
        .collect();
    if computed != pinned {
        let table: String = computed
            .iter()
            .map(|(n, o, h)| format!("    ({n:?}, {o:?}, {h:?}),\n"))
            .collect();
        let changed: Vec<String> = computed
            .iter()
            .filter(|c| !pinned.contains(c))
            .map(|(n, o, h)| format!("{n} {o}: now {h}"))
            .collect();
        panic!("{RULE}\n\nChanged: {changed:#?}\n\nWhat this build computes:\n{table}");
    }
}
