//! An S3-compatible server on loopback for the backup tests: `moto_server`
//! (PyPI `moto[server]`, installed by hack/install-tools.sh) on a free port,
//! stopped when dropped. The controller signs its requests (SigV4) with the
//! credentials the tests put in a Secret; moto accepts any credentials.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::ObjectStoreDestination;

use crate::etcd_harness::free_ports;

/// Credentials the tests configure (moto does not check them).
pub const ACCESS_KEY_ID: &str = "etcdfleet-test";
pub const SECRET_ACCESS_KEY: &str = "etcdfleet-test-secret";

/// A running S3-compatible server.
pub struct S3Server {
    child: Child,
    pub port: u16,
    /// The host in [`S3Server::endpoint`]: loopback, or the pods' gateway.
    host: String,
    _log: tempfile::TempDir,
}

/// The `moto_server` that `hack/install-tools.sh` installs into its own
/// virtualenv under `.tools/`, else one on PATH.
fn moto_server() -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.tools/moto-venv/bin/moto_server");
    if venv.is_file() {
        venv
    } else {
        "moto_server".into()
    }
}

impl S3Server {
    /// Starts the server, or `None` after a loud `SKIPPED:` line when
    /// `moto_server` is missing (a panic under `ETCDFLEET_REQUIRE_ETCD=1`).
    pub fn start() -> Option<S3Server> {
        Self::start_on("127.0.0.1", "127.0.0.1")
    }

    /// As [`S3Server::start`], reachable from the pods of real nodes too:
    /// listening on every address of the test's own network namespace
    /// ([`crate::real_node::run_isolated`], where alone it may be called),
    /// its endpoint the pods' gateway (restore seeders download from it).
    pub fn start_for_pods() -> Option<S3Server> {
        assert!(
            crate::real_node::in_own_network().unwrap_or(false),
            "S3Server::start_for_pods outside run_isolated would listen on the machine's addresses"
        );
        Self::start_on("0.0.0.0", &crate::real_node::network::GATEWAY.to_string())
    }

    fn start_on(bind: &str, host: &str) -> Option<S3Server> {
        let found = Command::new(moto_server())
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            let test = std::thread::current()
                .name()
                .unwrap_or("unnamed test")
                .to_string();
            let message = format!(
                "{test}: moto_server (PyPI moto[server]) not found (run hack/install-tools.sh)"
            );
            if std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() == Ok("1") {
                panic!("ETCDFLEET_REQUIRE_ETCD=1 but {message}");
            }
            eprintln!("SKIPPED: {message}");
            return None;
        }
        match Self::launch(bind, host) {
            Ok(s) => Some(s),
            Err(e) => panic!("moto_server is installed but did not start: {e:#}"),
        }
    }

    fn launch(bind: &str, host: &str) -> Result<S3Server> {
        let port = free_ports(1)?[0];
        let log = tempfile::tempdir()?;
        let out = std::fs::File::create(log.path().join("moto.log"))?;
        let child = Command::new(moto_server())
            .args(["-H", bind, "-p", &port.to_string()])
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("spawning moto_server")?;
        let server = S3Server {
            child,
            port,
            host: host.to_string(),
            _log: log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("moto_server did not listen on port {port} within 20 s")
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// Creates a bucket (moto accepts the unsigned `PUT /<bucket>`).
    pub fn create_bucket(&self, bucket: &str) -> Result<()> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response.lines().next().unwrap_or_default().to_string();
        if !status.contains(" 200") {
            bail!("creating bucket {bucket}: {status}");
        }
        Ok(())
    }

    /// A destination in `bucket` on this server (path-style, plain HTTP,
    /// credentials from the Secret `credentials_secret`).
    pub fn destination(&self, bucket: &str, credentials_secret: &str) -> ObjectStoreDestination {
        ObjectStoreDestination {
            bucket: Some(bucket.to_string()),
            prefix: Some("backups".into()),
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            force_path_style: Some(true),
            allow_http: Some(true),
            credentials_secret_name: Some(credentials_secret.to_string()),
            ..Default::default()
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The name of the credentials Secret [`put_credentials`] creates.
pub const CREDENTIALS: &str = "backup-credentials";

/// Creates the Secret [`CREDENTIALS`] in the fleet's namespace with this
/// server's keys, under the key names the controller reads.
pub async fn put_credentials(fleet: &crate::fleet::Fleet) -> Result<()> {
    put_credentials_in(fleet.management_direct(), fleet.namespace()).await
}

/// [`put_credentials`] into namespace `namespace` through `client`.
pub async fn put_credentials_in(client: kube::Client, namespace: &str) -> Result<()> {
    use etcdfleet_controllers::store;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CREDENTIALS.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(
            [
                (
                    store::ACCESS_KEY_ID.to_string(),
                    ByteString(ACCESS_KEY_ID.as_bytes().to_vec()),
                ),
                (
                    store::SECRET_ACCESS_KEY.to_string(),
                    ByteString(SECRET_ACCESS_KEY.as_bytes().to_vec()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    };
    kube::Api::<Secret>::namespaced(client, namespace)
        .create(&kube::api::PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// Takes one backup of `cluster` (in namespace `ns` of the management
/// cluster `management`) through the backup reconciler; returns it,
/// `Succeeded`.
pub async fn back_up(
    (management, ns): (kube::Client, &str),
    ctl: &crate::driver::TestController,
    name: &str,
    cluster: &str,
    destination: etcdfleet_api::ObjectStoreDestination,
) -> Result<etcdfleet_api::EtcdBackup> {
    use etcdfleet_api::backup::phase;
    use etcdfleet_api::{EtcdBackup, EtcdBackupSpec};
    use etcdfleet_controllers::backup::{
        Context as BackupContext, Outcome as BackupOutcome, reconcile_backup,
    };
    use kube::api::{Api, PostParams};
    let mut b = EtcdBackup::new(
        name,
        EtcdBackupSpec {
            cluster_name: cluster.into(),
            destination: Some(destination),
        },
    );
    b.metadata.namespace = Some(ns.into());
    let api = Api::<EtcdBackup>::namespaced(management, ns);
    api.create(&PostParams::default(), &b).await?;
    let bctx = BackupContext::new(ctl.ctx.clone());
    for _ in 0..60 {
        let b = api.get(name).await?;
        if matches!(
            reconcile_backup(&b, &bctx).await?,
            BackupOutcome::Done
                | BackupOutcome::Succeeded { .. }
                | BackupOutcome::AttemptFailed { .. }
        ) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let b = api.get(name).await?;
    let p = b.status.as_ref().and_then(|s| s.phase.clone());
    anyhow::ensure!(
        p.as_deref() == Some(phase::SUCCEEDED),
        "backup {name}: {:?}",
        b.status
    );
    Ok(b)
}
