//! Real local etcd for tests: locating the etcd releases this project
//! tests against (3.4.23, 3.5.1, and the 3.5, 3.6 and 3.7 patches built from
//! `hack/upstream`), running etcd processes that always die with the test, whole
//! local clusters (plain or mutual TLS) whose members can be stopped, killed,
//! restarted on another binary, wiped and joined, and an acknowledged-write
//! checker that proves no acknowledged write is lost across an operation.
//!
//! [`EtcdProcess`] is deliberately independent of [`LocalEtcdCluster`]: the
//! end-to-end harness plays kubelet with it, one process per etcd pod, each
//! with its own loopback IP and a private `/etc/hosts` ([`ProcessSpec::hosts_file`]).
//!
//! Rooms: [`binaries`] (which releases, where), [`process`] (one process),
//! [`cluster`] (a local cluster of them), [`writer`] (the acknowledged-write
//! checkers), [`nospace`] (live data that keeps a cluster at NOSPACE),
//! [`each_member`] (reads every member must answer, each waited for).
//! Every public name is re-exported here.

pub mod binaries;
pub mod cluster;
pub mod each_member;
pub mod nospace;
pub mod process;
pub mod writer;

pub use binaries::{
    BuiltEtcd, EtcdBinary, EtcdVersion, built_etcds, newest_built_etcd, pinned_etcd, require_both,
    require_etcd, workspace_root,
};
pub use cluster::{
    ClusterOptions, ClusterTls, FAST_ETCD_FLAGS, LocalEtcdCluster, LocalMember, SeedTarget,
    http_get,
};
pub use each_member::{MEMBER_ANSWER_BOUND, get_from_member};
pub use nospace::{LiveFill, fill_with_live_data};
pub use process::{EtcdProcess, ProcessSpec, free_ports, random_u64};
pub use writer::{AckedWriter, FollowingWriter, WriteReport, lost_writes, verify_acknowledged};
