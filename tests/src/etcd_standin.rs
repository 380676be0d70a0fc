//! An etcd stand-in for `make bench-fleet`: a small gRPC server that answers
//! the calls a converged reconcile makes (member list, status, alarms, a
//! count-only read) so the controller's own cost can be measured across a
//! thousand clusters on a two-core machine, where a thousand real etcd
//! processes (each with its own raft loop and WAL fsyncs) would measure etcd.
//!
//! **Never a test of etcd behaviour.** It has no raft, no store and no
//! membership changes: every member of a cluster answers from the
//! `--initial-cluster` it was started with, the first member is always the
//! leader, reads return nothing, and every call a converged reconcile does
//! not make answers `Unimplemented`. Real etcd stays the truth for behaviour
//! in every test.
//!
//! It is started by the workload runtime exactly like etcd (the `etcd`
//! command of an image mapped onto the `etcd-standin` binary, see
//! [`crate::runtime::ImageTable::standin`]), takes etcd's own flags, serves
//! TLS with client-certificate verification from `--cert-file`, `--key-file`
//! and `--trusted-ca-file` on `--listen-client-urls`, and answers
//! `GET /health` on `--listen-metrics-urls` like etcd's metrics listener.
//! Its version is the name of the directory its `argv[0]` sits in (`v3.5.1/etcd`):
//! the image table maps each image tag onto such a path.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;

use anyhow::{Context as _, Result, anyhow, bail};
use etcd_client::proto::*;
use futures::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// What the stand-in was started with (etcd's flags, the ones it uses).
#[derive(Debug, Clone, PartialEq)]
pub struct StandinConfig {
    pub name: String,
    pub version: String,
    pub client_listen: SocketAddr,
    pub client_tls: bool,
    pub metrics_listen: Option<SocketAddr>,
    pub advertise_client_urls: Vec<String>,
    /// `name → peer URLs`, in `--initial-cluster` order.
    pub initial_cluster: Vec<(String, Vec<String>)>,
    pub cluster_token: String,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub trusted_ca_file: Option<String>,
}

fn flag_values(args: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let Some(bare) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        match bare.split_once('=') {
            Some((k, v)) => {
                out.insert(k.to_string(), v.to_string());
            }
            None => {
                let v = iter.next().cloned().unwrap_or_default();
                out.insert(bare.to_string(), v);
            }
        }
    }
    out
}

fn socket_of(url: &str) -> Result<SocketAddr> {
    let authority = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(url)
        .split('/')
        .next()
        .unwrap_or_default();
    authority
        .parse()
        .with_context(|| format!("{url:?} does not listen on an IP:port"))
}

impl StandinConfig {
    /// Parses etcd's flags; `argv0` gives the version (see the module docs).
    pub fn from_args(argv0: &str, args: &[String]) -> Result<Self> {
        let flags = flag_values(args);
        let get = |k: &str| flags.get(k).cloned();
        let version = std::path::Path::new(argv0)
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix('v'))
            .filter(|v| v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
            .ok_or_else(|| {
                anyhow!("{argv0}: the directory of argv[0] must be the version, e.g. v3.5.1/etcd")
            })?
            .to_string();
        let name = get("name").unwrap_or_else(|| "default".into());
        let client = get("listen-client-urls").context("--listen-client-urls is required")?;
        let first_client = client.split(',').next().unwrap_or_default().to_string();
        let advertise_client_urls: Vec<String> = get("advertise-client-urls")
            .unwrap_or_else(|| first_client.clone())
            .split(',')
            .map(str::to_string)
            .collect();
        let mut initial_cluster: Vec<(String, Vec<String>)> = Vec::new();
        for entry in get("initial-cluster").unwrap_or_default().split(',') {
            let Some((n, url)) = entry.split_once('=') else {
                continue;
            };
            match initial_cluster.iter_mut().find(|(m, _)| m == n) {
                Some((_, urls)) => urls.push(url.to_string()),
                None => initial_cluster.push((n.to_string(), vec![url.to_string()])),
            }
        }
        if initial_cluster.is_empty() {
            let peer = get("initial-advertise-peer-urls")
                .unwrap_or_else(|| "http://localhost:2380".into());
            initial_cluster.push((name.clone(), vec![peer]));
        }
        if !initial_cluster.iter().any(|(n, _)| *n == name) {
            bail!("--initial-cluster does not name this member {name:?}");
        }
        Ok(StandinConfig {
            name,
            version,
            client_tls: first_client.starts_with("https://"),
            client_listen: socket_of(&first_client)?,
            metrics_listen: get("listen-metrics-urls")
                .map(|m| socket_of(m.split(',').next().unwrap_or_default()))
                .transpose()?,
            advertise_client_urls,
            initial_cluster,
            cluster_token: get("initial-cluster-token").unwrap_or_else(|| "etcd-cluster".into()),
            cert_file: get("cert-file"),
            key_file: get("key-file"),
            trusted_ca_file: get("trusted-ca-file"),
        })
    }
}

/// FNV-1a, never 0: stable member and cluster ids from names.
fn id_of(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h.max(1)
}

/// The answers, fixed at start.
#[derive(Debug, Clone)]
struct Answers {
    member_id: u64,
    cluster_id: u64,
    leader: u64,
    version: String,
    members: Vec<PbMember>,
}

impl Answers {
    fn new(config: &StandinConfig) -> Self {
        let members: Vec<PbMember> = config
            .initial_cluster
            .iter()
            .map(|(name, peers)| {
                let client_urls = if *name == config.name {
                    config.advertise_client_urls.clone()
                } else {
                    // Its siblings advertise the same host on the client port.
                    peers.iter().map(|p| p.replace(":2380", ":2379")).collect()
                };
                PbMember {
                    id: id_of(&[&config.cluster_token, name]),
                    name: name.clone(),
                    peer_ur_ls: peers.clone(),
                    client_ur_ls: client_urls,
                    is_learner: false,
                }
            })
            .collect();
        Answers {
            member_id: id_of(&[&config.cluster_token, &config.name]),
            cluster_id: id_of(&[&config.cluster_token]),
            leader: members[0].id,
            version: config.version.clone(),
            members,
        }
    }

    fn header(&self) -> Option<PbResponseHeader> {
        Some(PbResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision: 1,
            raft_term: 2,
        })
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn unimplemented<T>(call: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "the etcd stand-in answers only what a converged reconcile asks, not {call}"
    )))
}

#[tonic::async_trait]
impl PbClusterService for Answers {
    async fn member_add(
        &self,
        _: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        unimplemented("MemberAdd")
    }
    async fn member_remove(
        &self,
        _: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        unimplemented("MemberRemove")
    }
    async fn member_update(
        &self,
        _: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        unimplemented("MemberUpdate")
    }
    async fn member_list(
        &self,
        _: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        Ok(Response::new(PbMemberListResponse {
            header: self.header(),
            members: self.members.clone(),
        }))
    }
    async fn member_promote(
        &self,
        _: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        unimplemented("MemberPromote")
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for Answers {
    async fn alarm(&self, _: Request<PbAlarmRequest>) -> Result<Response<PbAlarmResponse>, Status> {
        Ok(Response::new(PbAlarmResponse {
            header: self.header(),
            alarms: Vec::new(),
        }))
    }
    async fn status(
        &self,
        _: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        Ok(Response::new(PbStatusResponse {
            header: self.header(),
            version: self.version.clone(),
            db_size: 20480,
            leader: self.leader,
            raft_index: 10,
            raft_term: 2,
            raft_applied_index: 10,
            errors: Vec::new(),
            db_size_in_use: 16384,
            is_learner: false,
            ..Default::default()
        }))
    }
    async fn defragment(
        &self,
        _: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        unimplemented("Defragment")
    }
    async fn hash(&self, _: Request<PbHashRequest>) -> Result<Response<PbHashResponse>, Status> {
        unimplemented("Hash")
    }
    async fn hash_kv(
        &self,
        _: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        unimplemented("HashKV")
    }
    type SnapshotStream = BoxStream<PbSnapshotResponse>;
    async fn snapshot(
        &self,
        _: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        unimplemented("Snapshot")
    }
    async fn move_leader(
        &self,
        _: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        unimplemented("MoveLeader")
    }
    async fn downgrade(
        &self,
        _: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        unimplemented("Downgrade")
    }
}

#[tonic::async_trait]
impl PbKvService for Answers {
    async fn range(&self, _: Request<PbRangeRequest>) -> Result<Response<PbRangeResponse>, Status> {
        Ok(Response::new(PbRangeResponse {
            header: self.header(),
            ..Default::default()
        }))
    }
    type RangeStreamStream = BoxStream<PbRangeStreamResponse>;
    async fn range_stream(
        &self,
        _: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        unimplemented("RangeStream")
    }
    async fn put(&self, _: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        unimplemented("Put")
    }
    async fn delete_range(
        &self,
        _: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        unimplemented("DeleteRange")
    }
    async fn txn(&self, _: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        unimplemented("Txn")
    }
    async fn compact(
        &self,
        _: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        unimplemented("Compact")
    }
}

/// Answers `GET /health...` with etcd's healthy body on the metrics listener.
async fn serve_metrics(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let body = r#"{"health":"true","reason":""}"#;
            let _ = stream
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        });
    }
}

/// Serves until the process is killed.
pub async fn serve(config: StandinConfig) -> Result<()> {
    let answers = Answers::new(&config);
    if let Some(addr) = config.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics listener {addr}"))?;
        tokio::spawn(serve_metrics(listener));
    }
    let mut server = Server::builder();
    if config.client_tls {
        let read = |path: &Option<String>, what: &str| -> Result<Vec<u8>> {
            let path = path
                .as_ref()
                .with_context(|| format!("an https:// client URL needs --{what}"))?;
            std::fs::read(path).with_context(|| format!("reading --{what} {path}"))
        };
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            read(&config.cert_file, "cert-file")?,
            read(&config.key_file, "key-file")?,
        ));
        if config.trusted_ca_file.is_some() {
            tls = tls.client_ca_root(Certificate::from_pem(read(
                &config.trusted_ca_file,
                "trusted-ca-file",
            )?));
        }
        server = server.tls_config(tls).context("server TLS")?;
    }
    eprintln!(
        "etcd stand-in {} (version {}) serving {} on {}",
        config.name,
        config.version,
        if config.client_tls { "TLS" } else { "plain" },
        config.client_listen
    );
    server
        .add_service(PbClusterServer::new(answers.clone()))
        .add_service(PbMaintenanceServer::new(answers.clone()))
        .add_service(PbKvServer::new(answers))
        .serve(config.client_listen)
        .await
        .context("serving gRPC")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_etcd_flags_and_version_from_argv0() {
        let c = StandinConfig::from_args(
            "/tmp/x/v3.5.1/etcd",
            &args(&[
                "--name=m-0",
                "--listen-client-urls=https://127.1.2.3:2379",
                "--listen-metrics-urls",
                "http://127.1.2.3:2381",
                "--advertise-client-urls=https://m-0.p.ns.svc:2379",
                "--initial-cluster=m-0=https://m-0.p.ns.svc:2380,m-1=https://m-1.p.ns.svc:2380",
                "--initial-cluster-token=t",
                "--cert-file=/c",
            ]),
        )
        .unwrap();
        assert_eq!(c.version, "3.5.1");
        assert!(c.client_tls);
        assert_eq!(c.client_listen, "127.1.2.3:2379".parse().unwrap());
        assert_eq!(c.metrics_listen, Some("127.1.2.3:2381".parse().unwrap()));
        assert_eq!(c.initial_cluster.len(), 2);
        let a = Answers::new(&c);
        assert_eq!(a.members[1].client_ur_ls, vec!["https://m-1.p.ns.svc:2379"]);
        assert_eq!(a.leader, a.members[0].id);
        assert_eq!(a.member_id, a.members[0].id);
        assert!(
            StandinConfig::from_args(
                "/bin/etcd",
                &args(&["--listen-client-urls=http://127.0.0.1:1"])
            )
            .is_err()
        );
        assert!(
            StandinConfig::from_args(
                "/v3.5.1/etcd",
                &args(&[
                    "--name=x",
                    "--listen-client-urls=http://127.0.0.1:1",
                    "--initial-cluster=y=http://y:2380"
                ])
            )
            .is_err(),
            "a member missing from --initial-cluster is refused"
        );
    }
}
