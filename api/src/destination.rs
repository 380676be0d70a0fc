//! Where snapshots go: the object-store destination, and the backup
//! defaults a cluster (or its template) gives its backups. Used by the
//! cluster types, backups and restores alike; imports none of them.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A duration of whole seconds, minutes, hours or days (`90s`, `15m`, `72h`, `30d`).
pub const DURATION_RULE: &str = "self.matches('^[1-9][0-9]{0,8}(s|m|h|d)$')";
/// A cron schedule has five space-separated fields (what each field may
/// hold is checked by the controller and offline, with the parser it runs).
pub const CRON_SHAPE_RULE: &str = "self.matches('^[^ ]+( [^ ]+){4}$')";
pub const CRON_SHAPE_MESSAGE: &str =
    "schedule must have five space-separated cron fields, e.g. '0 */6 * * *'";
const DURATION_MESSAGE: &str = "must be a positive whole number followed by s, m, h or d, e.g. 72h";

/// Backup defaults of a cluster: the values an `EtcdBackup` or
/// `EtcdBackupSchedule` naming the cluster uses for the fields it leaves
/// empty. Templates provide them like every other setting. Nothing is backed
/// up until an `EtcdBackup` or `EtcdBackupSchedule` exists.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Cron schedule, e.g. `0 */6 * * *`. Empty: no scheduled backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(CRON_SHAPE_RULE).message(CRON_SHAPE_MESSAGE))]
    pub schedule: Option<String>,
    /// How many successful snapshots to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("retention must be at least 1"))]
    pub retention: Option<i32>,
    /// Successful snapshots older than this are pruned (the newest is always
    /// kept), e.g. `72h`, `30d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub retention_max_age: Option<String>,
    /// Where snapshots go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ObjectStoreDestination>,
    /// Restore drills of the scheduled backups (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<DrillPolicy>,
}

/// Restore drills: the newest successful backup of a schedule restored, on
/// a schedule, into a scratch one-member etcd of the backup's own version
/// (a pod in the workload cluster's etcd namespace, on an `emptyDir`, never
/// reachable from outside its pod), compared with the fingerprint recorded
/// when it was taken, read, timed and removed (docs/backups.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillPolicy {
    /// Drill every Nth successful backup of the schedule: 1 drills each
    /// one, 4 one in four (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("drill.everyNthBackup must be at least 1"))]
    pub every_nth_backup: Option<i32>,
    /// How long a passed drill counts as proof, e.g. `7d` (default `7d`):
    /// past it, the cluster's `BackupsRestorable` condition turns Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub fresh_for: Option<String>,
    /// Nodes of the workload cluster the drill pod may run on (labels), to
    /// keep it off the members' nodes, for example.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<std::collections::BTreeMap<String, String>>,
    /// Run no drills while true (the last result stays, and ages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// Where snapshots go: an S3-compatible bucket (`bucket`) or a directory on
/// the controller's filesystem (`path`, for development and tests).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.bucket) != has(self.path)").message("exactly one of bucket (S3-compatible store) or path (local directory) must be set"))]
pub struct ObjectStoreDestination {
    /// Bucket name of an S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// Absolute path of a local directory of the controller's filesystem
    /// instead of a bucket (development and tests): refused outside the
    /// namespaces the platform allows it in (`tenancy.localDestinationNamespaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("path must be absolute"))]
    pub path: Option<String>,
    /// Key prefix inside the bucket or directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Endpoint URL of the object store (empty: the provider's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region of the bucket (default `us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Address the bucket as `<endpoint>/<bucket>` instead of `<bucket>.<endpoint>`
    /// (most self-hosted S3-compatible stores need this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// Allow a plain `http://` endpoint (loopback test servers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_http: Option<bool>,
    /// Secret (in the namespace of the EtcdCluster) with the keys
    /// `accessKeyId`, `secretAccessKey` and optionally `sessionToken`.
    /// Required for a bucket: the controller uses no identity of the node it
    /// runs on, and its own workload identity only in the namespaces the
    /// platform lends it to (`tenancy.workloadIdentityNamespaces`), never
    /// for a restore or a drill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("credentialsSecretName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub credentials_secret_name: Option<String>,
}
