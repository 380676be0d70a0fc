//! Everything the controller does to etcd itself: a client layer over
//! etcd-client with deadlines, retries and typed errors ([`client`]), and the
//! pure cluster-health view that decides which membership change is safe
//! ([`health`]).
//!
//! Two kinds of client exist because etcd answers some calls for the member
//! you are connected to (status, defragment, snapshot, health) and others for
//! the whole cluster (membership): [`MemberClient`] talks to exactly one
//! endpoint, [`ClusterClient`] balances over all of them. etcd's online
//! downgrade API is in [`downgrade`].

pub mod client;
pub mod downgrade;
pub mod error;
pub mod health;
pub mod pool;
pub mod transport;

pub use client::{
    AddedMember, Alarm, AlarmKind, ClusterClient, Deadlines, EtcdConfig, MemberClient,
    MemberStatus, SnapshotInfo, TlsMaterial, observe, observe_through,
};
pub use downgrade::DowngradeAnswer;
pub use error::EtcdError;
pub use health::{ClusterHealth, MemberObservation, UnsafeReason, quorum};
pub use pool::{ClientPool, PoolSettings};
pub use transport::{EtcdStream, Transport};

/// One member as etcd's member list reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// Empty while the member was added but has not started yet.
    pub name: String,
    pub peer_urls: Vec<String>,
    /// Empty while the member has not started yet.
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl Member {
    /// A member that was added but never started (etcd shows it "unstarted").
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }
}

impl From<&etcd_client::Member> for Member {
    fn from(m: &etcd_client::Member) -> Self {
        Member {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
        }
    }
}
