pub mod access;
pub mod backup;
pub mod cli;
pub mod config;
pub mod connector;
pub mod crd;
pub mod dialer;
/// The etcd engine, a crate of its own (`etcd/`): it knows no CRs.
pub use etcdfleet_etcd as etcd;
pub mod etcdcluster;
pub mod http;
pub mod install;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod names;
pub mod pki;
pub mod recovery;
pub mod render;
pub mod restore;
pub mod rollout;
pub mod runner;
pub mod shard;
pub mod shutdown;
pub mod slots;
pub mod snapshot;
pub mod store;
pub mod telemetry;
pub mod tenancy;
pub mod version_flags;

/// Parameters of the controller's non-apply patches: every write names the
/// controller's field manager, so `managedFields` on a real API server shows
/// who set a field (the default would be the client's generic name).
pub fn controller_patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(etcdfleet_api::FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}
