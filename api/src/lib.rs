//! The etcdfleet API (`v1beta1`, also served as `v1alpha1`): the custom
//! resource types, their conditions, template resolution and the version
//! policy. Pure data and pure functions:
//! nothing in this crate performs I/O.

pub mod adopt;
pub mod backup;
pub mod ca_rotation;
pub mod conditions;
pub mod destination;
pub mod drill;
pub mod names;
pub mod quantity;
pub mod recovery;
pub mod replacement;
pub mod restore;
pub mod rollout;
pub mod template;
pub mod types;
pub mod validation;
pub mod version;
pub mod yaml;

pub use backup::{
    EtcdBackup, EtcdBackupSchedule, EtcdBackupScheduleSpec, EtcdBackupScheduleStatus,
    EtcdBackupSpec, EtcdBackupStatus, RetentionPolicy,
};
pub use rollout::{
    ClusterRolloutStatus, EtcdFleetRollout, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus,
    FleetSelector, MaintenanceWindow, RolloutStrategy,
};
pub use types::*;

/// API group of every etcdfleet kind.
pub const GROUP: &str = "etcdfleet.dev";
/// API version of this crate's kinds: the version the controller speaks and
/// the CRDs' storage version.
pub const VERSION: &str = "v1beta1";
/// Versions served beside [`VERSION`] with the same schema (no conversion
/// webhook: the API server converts by rewriting `apiVersion`). Objects
/// stored under them are rewritten by `etcdfleet migrate-storage`, after
/// which a release may stop serving them.
pub const ALSO_SERVED: &[&str] = &["v1alpha1"];
/// Field manager the controller uses for server-side apply and status writes.
pub const FIELD_MANAGER: &str = "etcdfleet-controller";
