//! What etcd says about its members: the member list's entries, a
//! member's own status, and the alarms raised on members. Plain data.

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

/// What `Status` says about one member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberStatus {
    /// Id of the member that answered.
    pub member_id: u64,
    /// Id of the cluster it belongs to (0 when unknown).
    pub cluster_id: u64,
    pub version: String,
    /// Id of the leader as this member sees it; 0 when it knows none.
    pub leader: u64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    /// The store revision this member has applied (the answer's header).
    pub revision: i64,
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub is_learner: bool,
    pub errors: Vec<String>,
    /// The schema version of this member's data (3.6+; empty before).
    pub storage_version: String,
    /// The cluster's downgrade target while one is enabled, as this member
    /// reports it (3.6+; 3.5 members report none).
    pub downgrade_target: Option<String>,
}

impl MemberStatus {
    pub fn is_leader(&self) -> bool {
        self.leader != 0 && self.leader == self.member_id
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmKind {
    NoSpace,
    Corrupt,
}

/// An alarm raised on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alarm {
    pub member_id: u64,
    pub kind: AlarmKind,
}
