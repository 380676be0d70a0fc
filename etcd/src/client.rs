//! The etcd client layer: every call carries a deadline, retries only what
//! etcd documents as "try again later" (strict reconfiguration check, learner
//! not yet in sync, elections), and returns an [`EtcdError`]; how, is in
//! [`super::call`].
//!
//! `etcd_client::Client::connect` is lazy (it succeeds against a closed port),
//! so nothing here treats a successful connect as a sign of life: health and
//! reachability always come from an RPC answered within a deadline.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, ConnectOptions, GetOptions, MemberAddOptions,
};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::call::{LostAnswer, Retry, with_deadline};
use super::error::EtcdError;
use super::health::{ClusterHealth, MemberObservation};
use super::member::{Alarm, AlarmKind, Member, MemberStatus};
use super::transport::{Deadlines, EtcdConfig, TlsConfig, tls_config};

pub type Result<T, E = EtcdError> = std::result::Result<T, E>;

/// The answer to a successful `member add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedMember {
    pub id: u64,
    /// The member list after the add, the new member included.
    pub members: Vec<Member>,
}

/// What [`MemberClient::snapshot`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Bytes written to the sink: the database plus etcd's 32-byte SHA-256
    /// trailer when etcd sent one (restore tools expect and check it).
    pub bytes_written: u64,
    /// Hex SHA-256 of everything written (what `sha256sum` of the file gives).
    pub sha256: String,
    /// Size of the database part, as announced by etcd and checked.
    pub db_size: u64,
    /// Whether etcd sent its own digest of the database and it matched.
    pub etcd_digest_verified: bool,
}

fn members(list: &[etcd_client::Member]) -> Vec<Member> {
    list.iter().map(Member::from).collect()
}

/// One lazy client per endpoint, each over its own channel (see
/// [`super::transport::channel`]), all with the one TLS config `tls`.
async fn connect_each(
    endpoints: &[String],
    config: &EtcdConfig,
    tls: Option<&TlsConfig>,
) -> Result<Vec<(String, Client)>> {
    if endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    let mut clients = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        clients.push((endpoint.clone(), connect_one(endpoint, config, tls).await?));
    }
    Ok(clients)
}

/// The TLS config of `config`'s material, built once for a whole cluster.
fn shared_tls(config: &EtcdConfig) -> Result<Option<TlsConfig>> {
    config.tls.as_ref().map(tls_config).transpose()
}

async fn connect_one(
    endpoint: &str,
    config: &EtcdConfig,
    tls: Option<&TlsConfig>,
) -> Result<Client> {
    let channel = super::transport::channel(endpoint, config, tls)?;
    with_deadline(
        "connect",
        config.deadlines.connect,
        None,
        Client::from_channel(
            etcd_client::Channel::Tonic(channel),
            Some(ConnectOptions::new()),
        ),
    )
    .await
    .map_err(|e| match e {
        EtcdError::InvalidEndpoint { message, .. } => EtcdError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            message,
        },
        other => other,
    })
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// A client for the whole cluster, balanced over all given client URLs:
/// membership changes, alarms, and the operations that must find the leader.
#[derive(Clone)]
pub struct ClusterClient {
    endpoints: Vec<String>,
    config: EtcdConfig,
    /// One client per endpoint: cluster-wide calls go to the preferred one
    /// and move on to the next when it is unreachable; member calls reuse the
    /// member's own client, so a cluster costs one connection per member.
    /// Each sits behind a lock so [`disconnect`](Self::disconnect) can swap
    /// it for every clone of this client at once.
    clients: Arc<Vec<(String, std::sync::Mutex<Client>)>>,
    preferred: Arc<AtomicUsize>,
    /// The TLS config all members' connections share.
    tls: Option<TlsConfig>,
}

fn locked(slot: &std::sync::Mutex<Client>) -> std::sync::MutexGuard<'_, Client> {
    // A panic while holding the lock leaves a valid client behind: use it.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl ClusterClient {
    /// Prepares a client over `endpoints` (client URLs). Lazy: it does not
    /// prove any member is up.
    pub async fn connect(endpoints: &[String], config: &EtcdConfig) -> Result<Self> {
        let tls = shared_tls(config)?;
        Ok(ClusterClient {
            endpoints: endpoints.to_vec(),
            config: config.clone(),
            clients: Arc::new(
                connect_each(endpoints, config, tls.as_ref())
                    .await?
                    .into_iter()
                    .map(|(endpoint, client)| (endpoint, std::sync::Mutex::new(client)))
                    .collect(),
            ),
            preferred: Arc::new(AtomicUsize::new(0)),
            tls,
        })
    }

    /// The client cluster-wide calls use now.
    pub(super) fn client(&self) -> Client {
        let i = self.preferred.load(Ordering::Relaxed) % self.clients.len();
        locked(&self.clients[i].1).clone()
    }

    /// Moves cluster-wide calls to the next endpoint after `e` said the
    /// current one cannot be reached, or refused a membership change as
    /// unsafe; the caller's retry then uses it. etcd's strict
    /// reconfiguration check is the receiving member's view of its own peer
    /// connections (each connected for 5 s): a member whose connection to a
    /// new peer dropped once (its name did not resolve yet when the peer was
    /// added) refuses for 5 s after it reconnects, while the new peer itself
    /// may already accept. So a refused change is asked of each member in turn.
    pub(super) fn note(&self, e: &EtcdError) {
        if matches!(
            e,
            EtcdError::Unreachable(_) | EtcdError::Timeout { .. } | EtcdError::UnhealthyCluster(_)
        ) {
            self.preferred.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Closes this client's connection to `endpoint` (every clone's): a
    /// fresh, lazy one takes its place, and the old one closes once the calls
    /// under way on it end. Used before a member is stopped: etcd's graceful
    /// shutdown waits for its connected clients to leave, about a second for
    /// an idle HTTP/2 client that keeps its connection, so the member would
    /// come back that much later. Cluster-wide calls that went to this
    /// member move on to the next one: a call to a member on its way down is
    /// refused and retried only after a backoff (100 ms a reconcile, seen
    /// on the roll's last restart in `make bench`).
    pub async fn disconnect(&self, endpoint: &str) -> Result<()> {
        let Some(i) = self.clients.iter().position(|(e, _)| e == endpoint) else {
            return Ok(());
        };
        let preferred = self.preferred.load(Ordering::Relaxed);
        if preferred % self.clients.len() == i {
            // Lost to a concurrent move: that one moved on already.
            let _ = self.preferred.compare_exchange(
                preferred,
                preferred + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let slot = &self.clients[i].1;
        let fresh = connect_one(endpoint, &self.config, self.tls.as_ref()).await?;
        let old = std::mem::replace(&mut *locked(slot), fresh);
        drop(old);
        Ok(())
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// A client for one member, with this cluster's TLS and deadlines; one
    /// of this cluster's endpoints reuses its connection.
    pub async fn member(&self, endpoint: &str) -> Result<MemberClient> {
        match self.clients.iter().find(|(e, _)| e == endpoint) {
            Some((_, slot)) => Ok(MemberClient {
                endpoint: endpoint.to_string(),
                config: self.config.clone(),
                client: locked(slot).clone(),
            }),
            None => MemberClient::connect_with(endpoint, &self.config, self.tls.as_ref()).await,
        }
    }

    /// The raw etcd-client handle, for key-value access.
    pub fn kv(&self) -> Client {
        self.client()
    }

    /// The shape of every cluster-wide call: `call` on the client calls go
    /// to now, within the request deadline; a failure is noted (so the next
    /// attempt goes to the next member) and asked again as `retry` says.
    /// `op` names the call in its trace span and its timeout, `member_id`
    /// the member it is about.
    pub(super) async fn ask<T, F, Fut>(
        &self,
        op: &'static str,
        member_id: Option<u64>,
        retry: Retry,
        call: F,
    ) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let attempt = || self.ask_once(op, member_id, &call);
        retry.run(&self.config.deadlines, attempt).await
    }

    async fn ask_once<T, F, Fut>(&self, op: &'static str, id: Option<u64>, call: &F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let request = self.config.deadlines.request;
        let answer = with_deadline(op, request, id, call(self.client())).await;
        answer.inspect_err(|e| self.note(e))
    }

    /// A membership change about `member_id`, asked as [`ask`](Self::ask)
    /// does, answered with the member list after it. Once an attempt's
    /// answer was lost, a later refusal `made_already` recognises means the
    /// lost attempt made the change: the member list is read instead.
    async fn change<F, Fut>(
        &self,
        op: &'static str,
        member_id: u64,
        retry: Retry,
        made_already: fn(&EtcdError) -> bool,
        call: F,
    ) -> Result<Vec<Member>>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<Vec<Member>, etcd_client::Error>>,
    {
        let lost = LostAnswer::default();
        let attempt = || async {
            let answer = self.ask_once(op, Some(member_id), &call).await;
            answer.inspect_err(|e| lost.note(e))
        };
        match retry.run(&self.config.deadlines, attempt).await {
            Err(e) if made_already(&e) && lost.happened() => self.list_members().await,
            other => other,
        }
    }

    pub async fn list_members(&self) -> Result<Vec<Member>> {
        let list = |mut c: Client| async move { c.member_list().await };
        let resp = self.ask("member list", None, Retry::READ, list).await?;
        Ok(members(resp.members()))
    }

    /// Adds a learner with `peer_urls`. Retries etcd's "unhealthy cluster"
    /// refusal (strict reconfiguration check) with backoff. Idempotent: if a
    /// learner with exactly these peer URLs already exists (a previous attempt
    /// succeeded but its answer was lost), that learner is returned.
    pub async fn add_learner(&self, peer_urls: &[String]) -> Result<AddedMember> {
        let learner = || Some(MemberAddOptions::new().with_is_learner());
        let add = |mut c: Client| async move { c.member_add(peer_urls, learner()).await };
        let added = self.ask("member add", None, Retry::MEMBERSHIP, add).await;
        let added = added.and_then(|resp| {
            let member = resp.member().ok_or_else(|| EtcdError::Rpc {
                code: "Internal".into(),
                message: "member add answered without the new member".into(),
            })?;
            let (id, members) = (member.id(), members(resp.member_list()));
            Ok(AddedMember { id, members })
        });
        let Err(EtcdError::MemberExists(message)) = added else {
            return added;
        };
        let members = self.list_members().await?;
        let existing = members
            .iter()
            .find(|m| m.is_learner && same_urls(&m.peer_urls, peer_urls));
        match existing {
            Some(existing) => Ok(AddedMember {
                id: existing.id,
                members,
            }),
            None => Err(EtcdError::MemberExists(message)),
        }
    }

    /// Promotes learner `member_id` to voter, retrying while etcd answers that
    /// it is not yet in sync with the leader, up to the promote deadline.
    /// Timeouts are retried too (see [`remove_member`](Self::remove_member));
    /// "not a learner" after a timed-out attempt means that attempt promoted
    /// it. Returns the member list after the promotion.
    pub async fn promote_learner(&self, member_id: u64) -> Result<Vec<Member>> {
        let promote = |mut c: Client| async move {
            let resp = c.member_promote(member_id).await;
            resp.map(|r| members(r.members()))
        };
        let promoted = |e: &EtcdError| matches!(e, EtcdError::NotALearner { .. });
        let retry = Retry::PROMOTE;
        self.change("member promote", member_id, retry, promoted, promote)
            .await
    }

    /// Removes `member_id`. Retries etcd's transient refusals (a member that
    /// restarted less than ~5 s ago does not count as active yet) and
    /// timeouts (raft silently drops a conf change proposed while another is
    /// pending, which looks like a hang). If an attempt timed out and a later
    /// one answers "member not found", the timed-out one did remove it: that
    /// is success. It does not judge safety: ask [`ClusterHealth::can_remove`]
    /// first.
    pub async fn remove_member(&self, member_id: u64) -> Result<Vec<Member>> {
        let remove = |mut c: Client| async move {
            let resp = c.member_remove(member_id).await;
            resp.map(|r| members(r.members()))
        };
        let removed = |e: &EtcdError| matches!(e, EtcdError::MemberNotFound { .. });
        let retry = Retry::MEMBERSHIP;
        self.change("member remove", member_id, retry, removed, remove)
            .await
    }

    /// Asks every configured endpoint for its status and returns the client
    /// of the one that is the leader, with its status.
    pub async fn leader(&self) -> Result<(MemberClient, MemberStatus)> {
        let probes = self.endpoints.iter().map(|endpoint| async move {
            let member = self.member(endpoint).await?;
            let status = member.status().await?;
            Ok::<_, EtcdError>((member, status))
        });
        let mut last_error = None;
        for probe in futures::future::join_all(probes).await {
            match probe {
                Ok((member, status)) if status.is_leader() => return Ok((member, status)),
                Ok(_) => {}
                Err(e) => last_error = Some(e),
            }
        }
        Err(EtcdError::NoLeader(match last_error {
            Some(e) => format!("no endpoint reports itself leader (last error: {e})"),
            None => "no endpoint reports itself leader".into(),
        }))
    }

    /// Moves leadership to `target_id`, sending the request to the current
    /// leader as etcd requires. Does nothing if `target_id` already leads.
    pub async fn move_leader(&self, target_id: u64) -> Result<()> {
        Retry::LEADER
            .run(&self.config.deadlines, || async {
                let (leader, status) = self.leader().await?;
                if status.member_id == target_id {
                    return Ok(());
                }
                leader.move_leader(target_id).await
            })
            .await
    }

    /// Alarms raised anywhere in the cluster.
    pub async fn alarms(&self) -> Result<Vec<Alarm>> {
        let list =
            |mut c: Client| async move { c.alarm(AlarmAction::Get, AlarmType::None, None).await };
        let resp = self.ask("alarm list", None, Retry::ALARMS, list).await?;
        Ok(resp
            .alarms()
            .iter()
            .filter_map(|a| {
                let kind = match a.alarm() {
                    AlarmType::Nospace => AlarmKind::NoSpace,
                    AlarmType::Corrupt => AlarmKind::Corrupt,
                    AlarmType::None => return None,
                };
                Some(Alarm {
                    member_id: a.member_id(),
                    kind,
                })
            })
            .collect())
    }

    /// Compacts the keyspace history up to the current revision and returns
    /// that revision. Compacting an already compacted revision is not an error.
    pub async fn compact_to_current(&self) -> Result<i64> {
        // Serializable reads and compaction are allowed under a NOSPACE alarm.
        let read = |mut c: Client| async move {
            c.get("\0", Some(GetOptions::new().with_keys_only().with_limit(1)))
                .await
        };
        let resp = self.ask("read revision", None, Retry::ONCE, read).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if revision <= 1 {
            return Ok(revision);
        }
        let physical = || Some(etcd_client::CompactionOptions::new().with_physical());
        let compact = |mut c: Client| async move { c.compact(revision, physical()).await };
        match self.ask("compact", None, Retry::ONCE, compact).await {
            Ok(_) => Ok(revision),
            Err(EtcdError::Rpc { message, .. }) if message.contains("compacted") => Ok(revision),
            Err(e) => Err(e),
        }
    }

    /// Disarms one alarm (after its cause was dealt with: for NOSPACE,
    /// compact and defragment first).
    pub async fn disarm_alarm(&self, alarm: Alarm) -> Result<()> {
        let kind = match alarm.kind {
            AlarmKind::NoSpace => AlarmType::Nospace,
            AlarmKind::Corrupt => AlarmType::Corrupt,
        };
        let disarm = |mut c: Client| async move {
            let mut options = AlarmOptions::new();
            options.with_member(alarm.member_id);
            c.alarm(AlarmAction::Deactivate, kind, Some(options)).await
        };
        let member = Some(alarm.member_id);
        self.ask("alarm disarm", member, Retry::ONCE, disarm)
            .await?;
        Ok(())
    }

    /// Observes the whole cluster: the member list, then status and health of
    /// every member through its first advertised client URL, concurrently.
    /// Fails only if the member list itself cannot be read.
    pub async fn observe(&self) -> Result<ClusterHealth> {
        let members = self.list_members().await?;
        let observations =
            futures::future::join_all(members.into_iter().map(|member| async move {
                match member.client_urls.first() {
                    Some(url) => observe_through(member.clone(), self.member(url).await).await,
                    None => MemberObservation::unreachable(member, "member has not started"),
                }
            }))
            .await;
        Ok(ClusterHealth::new(observations))
    }
}

/// Status and health of one member through `endpoint`; never fails, an
/// unreachable member is an observation too.
pub async fn observe(member: Member, endpoint: &str, config: &EtcdConfig) -> MemberObservation {
    observe_through(member, MemberClient::connect(endpoint, config).await).await
}

/// Status and health of one member through a client prepared for it.
pub async fn observe_through(member: Member, client: Result<MemberClient>) -> MemberObservation {
    let client = match client {
        Ok(c) => c,
        Err(e) => return MemberObservation::unreachable(member, &e.to_string()),
    };
    if member.is_learner {
        // Learners refuse linearizable reads ("rpc not supported for
        // learner"): a learner is healthy when it answers status and knows
        // the leader it replicates from.
        return match client.status().await {
            Ok(s) if s.leader != 0 => MemberObservation {
                member,
                status: Some(s),
                healthy: true,
                error: None,
            },
            Ok(s) => MemberObservation {
                member,
                status: Some(s),
                healthy: false,
                error: Some("learner knows no leader".into()),
            },
            Err(e) => MemberObservation::unreachable(member, &e.to_string()),
        };
    }
    let (status, health) = tokio::join!(client.status(), client.check_health());
    let (status, status_error) = match status {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let (healthy, error) = match health {
        Ok(_) => (true, status_error),
        Err(e) => (false, Some(e.to_string())),
    };
    MemberObservation {
        member,
        status,
        healthy,
        error,
    }
}

/// A client bound to exactly one member: status, health, defragment,
/// snapshot and alarms of that member.
#[derive(Clone)]
pub struct MemberClient {
    endpoint: String,
    config: EtcdConfig,
    client: Client,
}

impl std::fmt::Debug for MemberClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl MemberClient {
    /// Prepares a client for the member at `endpoint` (lazy, see module docs).
    pub async fn connect(endpoint: &str, config: &EtcdConfig) -> Result<Self> {
        Self::connect_with(endpoint, config, shared_tls(config)?.as_ref()).await
    }

    /// As [`connect`](Self::connect), with a TLS config already built.
    async fn connect_with(
        endpoint: &str,
        config: &EtcdConfig,
        tls: Option<&TlsConfig>,
    ) -> Result<Self> {
        Ok(MemberClient {
            endpoint: endpoint.to_string(),
            config: config.clone(),
            client: connect_one(endpoint, config, tls).await?,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One RPC on this member within its deadline (`within` picks it), as
    /// [`ClusterClient::ask`] but without a retry: this client has no other
    /// member to ask.
    pub(crate) async fn ask<T, Fut>(
        &self,
        op: &'static str,
        within: fn(&Deadlines) -> Duration,
        member_id: Option<u64>,
        call: impl FnOnce(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = within(&self.config.deadlines);
        with_deadline(op, deadline, member_id, call(self.client.clone())).await
    }

    /// A linearizable read within the health deadline: it goes through raft,
    /// so the member is connected to a quorum with a leader. "Permission
    /// denied" went through raft too (`None`: no answer to read).
    async fn quorum_read(&self, op: &'static str) -> Result<Option<etcd_client::GetResponse>> {
        let count_only = || Some(GetOptions::new().with_count_only());
        let read = |mut c: Client| async move { c.get("health", count_only()).await };
        match self.ask(op, |d| d.health, None, read).await {
            Ok(r) => Ok(Some(r)),
            Err(EtcdError::Rpc { code, .. }) if code == "PermissionDenied" => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn status(&self) -> Result<MemberStatus> {
        let status = |mut c: Client| async move { c.status().await };
        let resp = self.ask("status", |d| d.request, None, status).await?;
        Ok(MemberStatus {
            member_id: resp.header().map(|h| h.member_id()).unwrap_or_default(),
            cluster_id: resp.header().map(|h| h.cluster_id()).unwrap_or_default(),
            version: resp.version().to_string(),
            leader: resp.leader(),
            raft_index: resp.raft_index(),
            raft_term: resp.raft_term(),
            raft_applied_index: resp.raft_applied_index(),
            revision: resp.header().map(|h| h.revision()).unwrap_or_default(),
            db_size: resp.db_size(),
            db_size_in_use: resp.raft_used_db_size(),
            is_learner: resp.is_learner(),
            errors: resp.errors().to_vec(),
            storage_version: resp.storage_version().to_string(),
            downgrade_target: resp
                .downgrade_info()
                .filter(|d| d.enabled())
                .map(|d| d.target_version().to_string()),
        })
    }

    /// The store revision this member has applied (from the header of its
    /// `Status` answer): a snapshot started after this holds at least it.
    pub async fn revision(&self) -> Result<i64> {
        let status = |mut c: Client| async move { c.status().await };
        let resp = self.ask("status", |d| d.request, None, status).await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// The membership as of now, from this member, and this member's id.
    /// etcd's MemberList answers from the member's local store (etcd-client
    /// 0.21 sends `linearizable: false`), so a partitioned or removed member
    /// can answer with old membership. A linearizable read first makes the
    /// member confirm with a quorum that it has applied everything committed
    /// (ReadIndex); the list that follows from the same member is then at
    /// least that fresh. Both answers must come from the same member id, and
    /// that id must be in the list (a removed member is not).
    pub async fn fresh_members(&self) -> Result<(u64, Vec<Member>)> {
        let read = self.quorum_read("linearizable read").await?;
        let read_by = read.and_then(|r| r.header().map(|h| h.member_id()));
        let list = |mut c: Client| async move { c.member_list().await };
        let resp = self.ask("member list", |d| d.request, None, list).await?;
        let listed_by = resp.header().map(|h| h.member_id()).unwrap_or_default();
        if read_by.is_some_and(|r| r != listed_by) {
            return Err(EtcdError::Unreachable(format!(
                "{}: the linearizable read and the member list were answered by different members",
                self.endpoint
            )));
        }
        let members = members(resp.members());
        if !members.iter().any(|m| m.id == listed_by) {
            return Err(EtcdError::Unreachable(format!(
                "{}: member {listed_by:x} answered but is not in its own member list (removed)",
                self.endpoint
            )));
        }
        Ok((listed_by, members))
    }

    /// The membership as this member's own store has it, and its id,
    /// without asking a quorum: what a member can still say when the
    /// cluster has lost its quorum (it may be stale; only a caller that
    /// knows the quorum is gone should use it).
    pub async fn local_members(&self) -> Result<(u64, Vec<Member>)> {
        let list = |mut c: Client| async move { c.member_list().await };
        let resp = self.ask("member list", |d| d.request, None, list).await?;
        let listed_by = resp.header().map(|h| h.member_id()).unwrap_or_default();
        Ok((listed_by, members(resp.members())))
    }

    /// Healthy means this member answers a linearizable read within the
    /// health deadline, which needs it to be connected to a quorum with a
    /// leader (as `etcdctl endpoint health`). "Permission denied" counts as
    /// healthy: the read went through raft. Returns the read latency.
    pub async fn check_health(&self) -> Result<Duration> {
        let started = Instant::now();
        self.quorum_read("health check").await?;
        Ok(started.elapsed())
    }

    /// Defragments this member's backend. Blocks the member while it runs:
    /// do one member at a time, the leader last.
    pub async fn defragment(&self) -> Result<()> {
        let defragment = |mut c: Client| async move { c.defragment().await };
        self.ask("defragment", |d| d.defragment, None, defragment)
            .await?;
        Ok(())
    }

    /// Transfers leadership to `target_id`. Must be sent to the leader; use
    /// [`ClusterClient::move_leader`] unless you know this member leads.
    pub async fn move_leader(&self, target_id: u64) -> Result<()> {
        let move_leader = |mut c: Client| async move { c.move_leader(target_id).await };
        let about = Some(target_id);
        self.ask("move leader", |d| d.request, about, move_leader)
            .await?;
        Ok(())
    }

    /// Streams a snapshot of this member's database into `sink`, checking the
    /// size etcd announces (`remaining_bytes`) and the SHA-256 it appends.
    pub async fn snapshot<W: AsyncWrite + Unpin>(&self, sink: &mut W) -> Result<SnapshotInfo> {
        let after = self.config.deadlines.snapshot;
        match tokio::time::timeout(after, self.stream_snapshot(sink)).await {
            Err(_) => Err(EtcdError::Timeout {
                op: "snapshot",
                after,
            }),
            Ok(r) => r,
        }
    }

    async fn stream_snapshot<W: AsyncWrite + Unpin>(&self, sink: &mut W) -> Result<SnapshotInfo> {
        use ring::digest::{Context, SHA256};
        let from_client = |e| EtcdError::from_client(e, None);
        let mut c = self.client.clone();
        let mut stream = c.snapshot().await.map_err(from_client)?;
        let mut db_digest = Context::new(&SHA256);
        let mut file_digest = Context::new(&SHA256);
        let mut db_size: Option<u64> = None;
        let mut db_bytes = 0u64;
        let mut written = 0u64;
        let mut etcd_digest: Option<Vec<u8>> = None;
        while let Some(msg) = stream.message().await.map_err(from_client)? {
            let blob = msg.blob();
            if db_size == Some(db_bytes) {
                // The database is complete; etcd sends its SHA-256 last.
                if etcd_digest.is_some() || blob.len() != SHA256.output_len() {
                    return Err(EtcdError::SnapshotIntegrity(format!(
                        "unexpected {} bytes after the end of the database",
                        blob.len()
                    )));
                }
                etcd_digest = Some(blob.to_vec());
            } else {
                let expected =
                    *db_size.get_or_insert(db_bytes + blob.len() as u64 + msg.remaining_bytes());
                db_bytes += blob.len() as u64;
                if db_bytes + msg.remaining_bytes() != expected {
                    return Err(EtcdError::SnapshotIntegrity(format!(
                        "etcd announced {expected} bytes, stream is at {db_bytes} with {} remaining",
                        msg.remaining_bytes()
                    )));
                }
                db_digest.update(blob);
            }
            sink.write_all(blob).await?;
            file_digest.update(blob);
            written += blob.len() as u64;
        }
        sink.flush().await?;
        let db_size = db_size.unwrap_or_default();
        if db_bytes != db_size || db_size == 0 {
            return Err(EtcdError::SnapshotIntegrity(format!(
                "stream ended after {db_bytes} of {db_size} database bytes"
            )));
        }
        let etcd_digest_verified = match etcd_digest {
            Some(d) if d.as_slice() == db_digest.finish().as_ref() => true,
            Some(_) => {
                return Err(EtcdError::SnapshotIntegrity(
                    "SHA-256 sent by etcd does not match the database received".into(),
                ));
            }
            None => false,
        };
        Ok(SnapshotInfo {
            bytes_written: written,
            sha256: hex(file_digest.finish().as_ref()),
            db_size,
            etcd_digest_verified,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Deadlines;

    #[tokio::test]
    async fn connect_is_lazy_so_health_comes_from_an_rpc_with_a_deadline() {
        // Nothing listens on port 1; connect succeeds, the health read fails fast.
        let config = EtcdConfig {
            deadlines: Deadlines {
                health: Duration::from_millis(500),
                connect: Duration::from_millis(300),
                ..Deadlines::default()
            },
            ..EtcdConfig::default()
        };
        let member = MemberClient::connect("http://127.0.0.1:1", &config)
            .await
            .unwrap();
        let started = Instant::now();
        let err = member.check_health().await.unwrap_err();
        assert!(
            matches!(err.reason(), "Unreachable" | "Timeout"),
            "unexpected {err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// A client over three endpoints nothing listens on (connecting is lazy).
    async fn three_lazy_members() -> ([String; 3], ClusterClient) {
        let endpoints = [
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
        ]
        .map(String::from);
        let etcd = ClusterClient::connect(&endpoints, &EtcdConfig::default())
            .await
            .unwrap();
        (endpoints, etcd)
    }

    /// Which of the three endpoints cluster-wide calls use now.
    fn at(c: &ClusterClient) -> usize {
        c.preferred.load(Ordering::Relaxed) % 3
    }

    #[tokio::test]
    async fn a_refused_membership_change_moves_on_to_the_next_member() {
        let (_, etcd) = three_lazy_members().await;
        assert_eq!(at(&etcd), 0);
        // etcd's strict reconfiguration check is the receiving member's own
        // view: the retry asks the next one.
        etcd.note(&EtcdError::UnhealthyCluster(
            "etcdserver: unhealthy cluster".into(),
        ));
        assert_eq!(at(&etcd), 1);
        etcd.note(&EtcdError::Unreachable("refused".into()));
        assert_eq!(at(&etcd), 2);
        // An answer about the request itself stays with the same member.
        etcd.note(&EtcdError::NotInSync { member_id: 1 });
        etcd.note(&EtcdError::MemberExists("exists".into()));
        assert_eq!(at(&etcd), 2);
        etcd.note(&EtcdError::UnhealthyCluster(String::new()));
        assert_eq!(at(&etcd), 0, "round the members");
    }

    #[tokio::test]
    async fn letting_go_of_the_member_cluster_calls_use_moves_them_to_the_next() {
        let (endpoints, etcd) = three_lazy_members().await;
        // Another member let go of: cluster calls stay where they are.
        etcd.disconnect(&endpoints[2]).await.unwrap();
        assert_eq!(at(&etcd), 0);
        etcd.disconnect(&endpoints[0]).await.unwrap();
        assert_eq!(at(&etcd), 1);
        // Let go of again at the next poll: no further move.
        etcd.disconnect(&endpoints[0]).await.unwrap();
        assert_eq!(at(&etcd), 1);
        etcd.disconnect("http://127.0.0.1:9").await.unwrap();
        assert_eq!(at(&etcd), 1, "an endpoint of no member moves nothing");
    }

    #[tokio::test]
    async fn endpoints_are_validated() {
        let config = EtcdConfig::default();
        assert_eq!(
            ClusterClient::connect(&[], &config)
                .await
                .unwrap_err()
                .reason(),
            "NoEndpoints"
        );
        assert_eq!(
            MemberClient::connect("127.0.0.1:2379", &config)
                .await
                .unwrap_err()
                .reason(),
            "InvalidEndpoint"
        );
        assert_eq!(
            MemberClient::connect("https://127.0.0.1:2379", &config)
                .await
                .unwrap_err()
                .reason(),
            "TLSError"
        );
    }
}
