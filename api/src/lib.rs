//! The etcdfleet `v1alpha1` API: the custom resource types, their conditions,
//! template resolution and the version policy. Pure data and pure functions:
//! nothing in this crate performs I/O.

pub mod adopt;
pub mod backup;
pub mod ca_rotation;
pub mod conditions;
pub mod destination;
pub mod restore;
pub mod template;
pub mod types;
pub mod validation;
pub mod version;

pub use backup::{
    EtcdBackup, EtcdBackupSchedule, EtcdBackupScheduleSpec, EtcdBackupScheduleStatus,
    EtcdBackupSpec, EtcdBackupStatus, RetentionPolicy,
};
pub use types::*;

/// API group of every etcdfleet kind.
pub const GROUP: &str = "etcdfleet.dev";
/// API version of this crate's kinds.
pub const VERSION: &str = "v1alpha1";
/// Field manager the controller uses for server-side apply and status writes.
pub const FIELD_MANAGER: &str = "etcdfleet-controller";
