//! Everything the controller does to etcd itself: a client layer over
//! etcd-client with deadlines, retries and typed errors ([`client`], each
//! call made as [`call`] says), and the pure cluster-health view that
//! decides which membership change is safe ([`health`]).
//!
//! Two kinds of client exist because etcd answers some calls for the member
//! you are connected to (status, defragment, snapshot, health) and others for
//! the whole cluster (membership): [`MemberClient`] talks to exactly one
//! endpoint, [`ClusterClient`] balances over all of them. etcd's online
//! downgrade API is in [`downgrade`].

pub mod call;
pub mod client;
pub mod downgrade;
pub mod error;
pub mod fingerprint;
pub mod health;
pub mod member;
pub mod pool;
pub mod probe;
pub mod transport;

pub use client::{
    AddedMember, ClusterClient, MemberClient, SnapshotInfo, observe, observe_through,
};
pub use downgrade::DowngradeAnswer;
pub use error::EtcdError;
pub use fingerprint::Fingerprint;
pub use health::{ClusterHealth, MemberObservation, UnsafeReason, quorum};
pub use member::{Alarm, AlarmKind, Member, MemberStatus};
pub use pool::{ClientPool, PoolSettings};
pub use probe::{ProbeAnswer, ProbeError, probe_tls};
pub use transport::{Deadlines, EtcdConfig, EtcdStream, TlsMaterial, Transport};
