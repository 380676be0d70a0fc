//! Object-store access, shared by backups, restores and the EtcdCluster
//! reconciler (the restore seeder's credentials): the credentials Secret,
//! a client for an S3-compatible bucket or a local directory, and streaming
//! reads and writes with their SHA-256. Knows no reconciler.
//!
//! Destinations through `object_store`: an S3-compatible bucket or a
//! local directory. Uploads stream through a multipart writer holding at most
//! [`PART_SIZE`] × ([`UPLOAD_CONCURRENCY`] + 1) bytes, whatever the snapshot's
//! size; reads stream too.
//!
//! The S3 client verifies HTTPS endpoints with the system's CA certificates
//! (reqwest's rustls-platform-verifier), which it refuses to build without,
//! even for an endpoint that never speaks TLS. A process with none (an etcd
//! image the restore seeder runs in, an image without a bundle) therefore
//! builds its client without them for a plain-HTTP endpoint, and refuses an
//! HTTPS one by name ([`StoreError::NoCaCertificates`]).

use std::sync::{Arc, OnceLock};

use etcdfleet_api::ObjectStoreDestination;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload};
use ring::digest::{Context as Digest, SHA256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::tenancy::{Fence, Reach, Refused, WorkloadIdentity};

/// Keys of the credentials Secret.
pub const ACCESS_KEY_ID: &str = "accessKeyId";
pub const SECRET_ACCESS_KEY: &str = "secretAccessKey";
pub const SESSION_TOKEN: &str = "sessionToken";

/// Size of one multipart part (S3 wants at least 5 MiB per part).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts in flight at once.
pub const UPLOAD_CONCURRENCY: usize = 2;

/// Failures of a destination.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("credentials Secret {0}: {1}")]
    Credentials(String, String),
    #[error("destination: {0}")]
    Config(String),
    #[error(
        "no CA certificates on this system to verify {0} (none in /etc/ssl/certs/ca-certificates.crt \
         or the other usual bundles, SSL_CERT_FILE or SSL_CERT_DIR)"
    )]
    NoCaCertificates(String),
    #[error("object {key}: {source}")]
    Object {
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("object {0} does not exist")]
    NotFound(String),
    #[error("object {key}: {message}")]
    Integrity { key: String, message: String },
    #[error("management API: {0}")]
    Api(#[source] kube::Error),
    #[error("{0}")]
    Refused(#[from] Refused),
}

impl StoreError {
    /// Short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::Credentials(..) => "CredentialsUnavailable",
            StoreError::Config(_) => "InvalidDestination",
            StoreError::NoCaCertificates(_) => "NoCACertificates",
            StoreError::Object { .. } => "ObjectStoreError",
            StoreError::NotFound(_) => "ObjectNotFound",
            StoreError::Integrity { .. } => "ChecksumMismatch",
            StoreError::Api(_) => "ManagementAPIError",
            StoreError::Refused(r) => r.reason(),
        }
    }

    /// A write into an upload that failed: the store's error as the
    /// upload's writer reports it (object_store's own error when it carries
    /// one, e.g. the request that failed after its retries).
    pub fn upload(key: &str, e: std::io::Error) -> Self {
        let generic = |source| object_store::Error::Generic {
            store: "upload",
            source,
        };
        let source = if e.get_ref().is_some() {
            let inner = e.into_inner().unwrap_or_else(|| "the upload failed".into());
            match inner.downcast::<object_store::Error>() {
                Ok(store) => *store,
                Err(other) => generic(other),
            }
        } else {
            generic(Box::new(e))
        };
        // Not `object()`: a 404 to an upload is a missing bucket, not a
        // missing object.
        StoreError::Object {
            key: key.to_string(),
            source,
        }
    }

    fn object(key: &str, source: object_store::Error) -> Self {
        match source {
            object_store::Error::NotFound { .. } => StoreError::NotFound(key.to_string()),
            source => StoreError::Object {
                key: key.to_string(),
                source,
            },
        }
    }
}

/// S3 credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Opens namespace `namespace`'s `destination` as the fence allows (the
/// tenant's own keys, the controller's workload identity where the platform
/// lends it, or a local directory where it allows one), or refuses it
/// before any request. Returns the store and the keys it was opened with.
pub async fn open_for(
    management: &kube::Client,
    fence: &Fence,
    namespace: &str,
    destination: &ObjectStoreDestination,
) -> Result<(Store, Option<Credentials>), StoreError> {
    match fence.reach(namespace, destination)? {
        Reach::Keys(name) => {
            let credentials = get_credentials(management, namespace, name).await?;
            Ok((
                Store::open(destination, Some(&credentials))?,
                Some(credentials),
            ))
        }
        Reach::Workload(identity) => Ok((Store::open_as(destination, identity)?, None)),
        Reach::Local => Ok((Store::open(destination, None)?, None)),
    }
}

/// The keys namespace `namespace`'s `destination` is reached with, for a
/// pod of the workload cluster that reads it (the restore seeder, a drill):
/// `None` for a local directory the fence allows. The controller's workload
/// identity is its own and reaches no pod elsewhere, so a bucket without
/// `credentialsSecretName` is refused here wherever the fence lends it.
pub async fn read_credentials(
    management: &kube::Client,
    fence: &Fence,
    namespace: &str,
    destination: &ObjectStoreDestination,
) -> Result<Option<Credentials>, StoreError> {
    match fence.reach(namespace, destination)? {
        Reach::Keys(name) => Ok(Some(get_credentials(management, namespace, name).await?)),
        Reach::Workload(_) => Err(Refused::NoCredentials {
            namespace: namespace.to_string(),
        }
        .into()),
        Reach::Local => Ok(None),
    }
}

/// Reads the credentials Secret `name` with one GET (never a list or
/// watch: the controller reads only the Secrets it is pointed at).
async fn get_credentials(
    management: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Credentials, StoreError> {
    if let Some(problem) = etcdfleet_api::names::reference_problem("credentialsSecretName", name) {
        return Err(StoreError::Credentials(
            name.chars().take(64).collect(),
            problem,
        ));
    }
    let api: Api<Secret> = Api::namespaced(management.clone(), namespace);
    let secret = api
        .get_opt(name)
        .await
        .map_err(StoreError::Api)?
        .ok_or_else(|| StoreError::Credentials(name.to_string(), "not found".into()))?;
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let (Some(access_key_id), Some(secret_access_key)) =
        (value(ACCESS_KEY_ID), value(SECRET_ACCESS_KEY))
    else {
        return Err(StoreError::Credentials(
            name.to_string(),
            format!("needs the keys {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}"),
        ));
    };
    Ok(Credentials {
        access_key_id,
        secret_access_key,
        session_token: value(SESSION_TOKEN),
    })
}

/// How many of the system's CA certificates the S3 client's verifier would
/// trust, loaded as it loads them (rustls-native-certs: `SSL_CERT_FILE` /
/// `SSL_CERT_DIR`, else the bundle openssl-probe finds,
/// `/etc/ssl/certs/ca-certificates.crt` first on Linux), once per process.
pub fn system_ca_certificates() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        let (parsed, _ignored) =
            rustls::RootCertStore::empty().add_parsable_certificates(loaded.certs);
        parsed
    })
}

/// Whether an S3 client of `destination` is built with the system's CA
/// certificates (true) or without (false, only where no TLS is spoken), in
/// a process that has `system_cas` of them.
fn with_system_cas(
    destination: &ObjectStoreDestination,
    system_cas: usize,
) -> Result<bool, StoreError> {
    if system_cas > 0 {
        return Ok(true);
    }
    match destination.endpoint.as_deref() {
        Some(e)
            if e.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://")) =>
        {
            Ok(false)
        }
        Some(e) => Err(StoreError::NoCaCertificates(e.to_string())),
        None => Err(StoreError::NoCaCertificates(format!(
            "https://s3.{}.amazonaws.com",
            destination.region.as_deref().unwrap_or("us-east-1")
        ))),
    }
}

/// Who a bucket is reached as: every provider is set explicitly, so the
/// S3 client's last resort, the instance metadata service, is never built.
enum Principal<'a> {
    Keys(&'a Credentials),
    Workload(&'a WorkloadIdentity),
}

impl Principal<'_> {
    fn apply(&self, b: AmazonS3Builder) -> AmazonS3Builder {
        use object_store::aws::AmazonS3ConfigKey as Key;
        match self {
            Principal::Keys(c) => {
                let b = b
                    .with_access_key_id(&c.access_key_id)
                    .with_secret_access_key(&c.secret_access_key);
                match &c.session_token {
                    Some(t) => b.with_token(t),
                    None => b,
                }
            }
            Principal::Workload(WorkloadIdentity::WebIdentity {
                token_file,
                role_arn,
                session_name,
                sts_endpoint,
            }) => {
                let mut b = b
                    .with_config(Key::WebIdentityTokenFile, token_file)
                    .with_config(Key::RoleArn, role_arn);
                if let Some(name) = session_name {
                    b = b.with_config(Key::RoleSessionName, name);
                }
                if let Some(sts) = sts_endpoint {
                    b = b.with_config(Key::StsEndpoint, sts);
                }
                b
            }
            Principal::Workload(WorkloadIdentity::PodIdentity {
                full_uri,
                token_file,
            }) => b
                .with_config(Key::ContainerCredentialsFullUri, full_uri)
                .with_config(Key::ContainerAuthorizationTokenFile, token_file),
        }
    }
}

/// An opened destination.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// What the destination is, for messages (`s3://bucket`, `file:///dir`).
    pub location: String,
}

impl Store {
    /// Opens `destination` (no request is made yet): a bucket with the keys
    /// `credentials`, which it needs (the instance metadata service is never
    /// asked for an identity), or a local directory.
    pub fn open(
        destination: &ObjectStoreDestination,
        credentials: Option<&Credentials>,
    ) -> Result<Store, StoreError> {
        match (&destination.bucket, &destination.path) {
            (Some(bucket), None) => match credentials {
                Some(c) => Self::s3(destination, bucket, Principal::Keys(c)),
                None => Err(StoreError::Config(format!(
                    "bucket {bucket}: no credentials (credentialsSecretName); a bucket is \
                     reached only with keys or a workload identity, never with the identity \
                     of the node"
                ))),
            },
            (None, Some(path)) => Self::local(path),
            _ => Err(StoreError::Config(
                "exactly one of bucket or path must be set".into(),
            )),
        }
    }

    /// Opens the bucket of `destination` as the controller's workload
    /// identity `identity` (no request is made yet).
    pub fn open_as(
        destination: &ObjectStoreDestination,
        identity: &WorkloadIdentity,
    ) -> Result<Store, StoreError> {
        match (&destination.bucket, &destination.path) {
            (Some(bucket), None) => Self::s3(destination, bucket, Principal::Workload(identity)),
            _ => Err(StoreError::Config(
                "a workload identity reaches buckets only".into(),
            )),
        }
    }

    fn s3(
        destination: &ObjectStoreDestination,
        bucket: &str,
        principal: Principal,
    ) -> Result<Store, StoreError> {
        let system_cas = with_system_cas(destination, system_ca_certificates())?;
        // First: the setters below change these options.
        let options = ClientOptions::new().with_no_system_certificates(!system_cas);
        let mut b = AmazonS3Builder::new()
            .with_client_options(options)
            .with_bucket_name(bucket)
            .with_region(destination.region.as_deref().unwrap_or("us-east-1"))
            .with_virtual_hosted_style_request(!destination.force_path_style.unwrap_or(false))
            .with_allow_http(destination.allow_http.unwrap_or(false));
        if let Some(endpoint) = &destination.endpoint {
            b = b.with_endpoint(endpoint);
        }
        b = principal.apply(b);
        let store = b.build().map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(Store {
            inner: Arc::new(store),
            location: format!("s3://{bucket}"),
        })
    }

    fn local(path: &str) -> Result<Store, StoreError> {
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::Config(format!("directory {path}: {e}")))?;
        let store = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(Store {
            inner: Arc::new(store),
            location: format!("file://{path}"),
        })
    }
    /// A writer that uploads what it is given as a multipart upload (or one
    /// PUT when it stays under one part). `shutdown` completes the upload;
    /// [`Upload::abort`] cancels it.
    pub fn upload(&self, key: &str) -> Upload {
        Upload {
            key: key.to_string(),
            writer: BufWriter::with_capacity(self.inner.clone(), Path::from(key), PART_SIZE)
                .with_max_concurrency(UPLOAD_CONCURRENCY),
        }
    }

    /// Stores a small object in one PUT.
    pub async fn put_small(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.inner
            .put(&Path::from(key), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| StoreError::object(key, e))
    }

    /// Reads a small object whole.
    pub async fn get_small(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let got = self
            .inner
            .get(&Path::from(key))
            .await
            .map_err(|e| StoreError::object(key, e))?;
        got.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| StoreError::object(key, e))
    }

    /// Streams an object through SHA-256 (and into `sink` when given);
    /// returns its size and hex digest.
    pub async fn read_through<W: AsyncWrite + Unpin>(
        &self,
        key: &str,
        mut sink: Option<&mut W>,
    ) -> Result<(u64, String), StoreError> {
        let got = self
            .inner
            .get(&Path::from(key))
            .await
            .map_err(|e| StoreError::object(key, e))?;
        let mut stream = got.into_stream();
        let mut digest = Digest::new(&SHA256);
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| StoreError::object(key, e))?;
            digest.update(&chunk);
            size += chunk.len() as u64;
            if let Some(sink) = sink.as_deref_mut() {
                sink.write_all(&chunk)
                    .await
                    .map_err(|e| StoreError::Integrity {
                        key: key.to_string(),
                        message: format!("writing the local copy: {e}"),
                    })?;
            }
        }
        if let Some(sink) = sink {
            sink.flush().await.map_err(|e| StoreError::Integrity {
                key: key.to_string(),
                message: format!("writing the local copy: {e}"),
            })?;
        }
        Ok((size, hex(digest.finish().as_ref())))
    }

    /// Checks that `key` holds exactly `size` bytes with SHA-256 `sha256`
    /// (reads it back whole, streaming).
    pub async fn verify(&self, key: &str, size: u64, sha256: &str) -> Result<(), StoreError> {
        let (got_size, got_sha) = self.read_through::<tokio::io::Sink>(key, None).await?;
        if got_size != size {
            return Err(StoreError::Integrity {
                key: key.to_string(),
                // Neither what it holds nor its digest is told: the key
                // may name an object the caller does not own.
                message: format!(
                    "does not hold the {size} bytes recorded (it is {})",
                    if got_size < size { "smaller" } else { "larger" }
                ),
            });
        }
        if got_sha != sha256 {
            return Err(StoreError::Integrity {
                key: key.to_string(),
                message: format!("its SHA-256 is not the {sha256} recorded"),
            });
        }
        Ok(())
    }

    /// Deletes an object; one that is already gone is fine.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::object(key, e)),
        }
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.inner.head(&Path::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(StoreError::object(key, e)),
        }
    }
}

/// A streaming upload in progress.
pub struct Upload {
    pub key: String,
    writer: BufWriter,
}

impl Upload {
    pub fn writer(&mut self) -> &mut (impl AsyncWrite + Unpin) {
        &mut self.writer
    }

    /// Completes the upload.
    pub async fn finish(mut self) -> Result<(), StoreError> {
        self.writer
            .shutdown()
            .await
            .map_err(|e| StoreError::upload(&self.key, e))
    }

    /// Cancels the upload (best effort: parts already sent are discarded by the store).
    pub async fn abort(mut self) {
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(key = %self.key, error = %e, "aborting a multipart upload failed");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &std::path::Path) -> Store {
        Store::open(
            &ObjectStoreDestination {
                path: Some(dir.display().to_string()),
                ..Default::default()
            },
            None,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_multipart_upload_reads_back_with_the_same_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = local(dir.path());
        // Three parts and a bit, so the multipart path is taken.
        let data: Vec<u8> = (0..(3 * PART_SIZE + 12345))
            .map(|i| (i % 251) as u8)
            .collect();
        let mut upload = store.upload("ns/c/x.db");
        upload.writer().write_all(&data).await.unwrap();
        upload.finish().await.unwrap();
        let want = hex(ring::digest::digest(&SHA256, &data).as_ref());
        store
            .verify("ns/c/x.db", data.len() as u64, &want)
            .await
            .unwrap();
        let err = store
            .verify("ns/c/x.db", data.len() as u64, &"0".repeat(64))
            .await
            .unwrap_err();
        assert_eq!(err.reason(), "ChecksumMismatch", "{err}");
        let err = store.verify("ns/c/missing.db", 1, &want).await.unwrap_err();
        assert_eq!(err.reason(), "ObjectNotFound", "{err}");
        store.delete("ns/c/x.db").await.unwrap();
        store.delete("ns/c/x.db").await.unwrap();
        assert!(!store.exists("ns/c/x.db").await.unwrap());
    }

    #[test]
    fn a_failed_write_into_an_upload_is_the_stores_error() {
        let refused = object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        };
        let e = StoreError::upload("ns/c/x.db", std::io::Error::other(refused));
        assert_eq!(e.reason(), "ObjectStoreError");
        assert!(e.to_string().contains("ns/c/x.db"), "{e}");
        assert!(e.to_string().contains("connection refused"), "{e}");
        let missing_bucket = object_store::Error::NotFound {
            path: "ns/c/x.db".into(),
            source: "NoSuchBucket".into(),
        };
        let e = StoreError::upload("ns/c/x.db", std::io::Error::other(missing_bucket));
        assert_eq!(e.reason(), "ObjectStoreError", "{e}");
        let plain = StoreError::upload("k", std::io::ErrorKind::BrokenPipe.into());
        assert_eq!(plain.reason(), "ObjectStoreError");
        assert!(plain.to_string().contains("broken pipe"), "{plain}");
    }

    #[test]
    fn a_destination_is_a_bucket_or_a_path() {
        let both = ObjectStoreDestination {
            bucket: Some("b".into()),
            path: Some("/tmp/x".into()),
            ..Default::default()
        };
        assert_eq!(
            Store::open(&both, None).unwrap_err().reason(),
            "InvalidDestination"
        );
        let s3 = ObjectStoreDestination {
            bucket: Some("b".into()),
            endpoint: Some("http://127.0.0.1:9".into()),
            allow_http: Some(true),
            force_path_style: Some(true),
            ..Default::default()
        };
        let keys = Credentials {
            access_key_id: "k".into(),
            secret_access_key: "s".into(),
            session_token: None,
        };
        assert_eq!(Store::open(&s3, Some(&keys)).unwrap().location, "s3://b");
        // Without keys a bucket gets no client: the S3 client's last
        // resort would be the node's identity (instance metadata).
        let e = Store::open(&s3, None).unwrap_err();
        assert_eq!(e.reason(), "InvalidDestination");
        assert!(e.to_string().contains("never with the identity"), "{e}");
    }

    #[test]
    fn without_system_cas_only_a_plain_http_endpoint_gets_a_client() {
        let at = |endpoint: Option<&str>| ObjectStoreDestination {
            bucket: Some("b".into()),
            endpoint: endpoint.map(String::from),
            region: Some("eu-west-1".into()),
            ..Default::default()
        };
        // With system CAs, every endpoint verifies with them.
        for endpoint in [None, Some("https://minio:9000"), Some("http://minio:9000")] {
            assert!(with_system_cas(&at(endpoint), 142).unwrap());
        }
        // Without: a plain-HTTP endpoint speaks no TLS and needs none.
        for endpoint in ["http://10.0.0.1:9000", "HTTP://minio.svc:9000"] {
            assert!(!with_system_cas(&at(Some(endpoint)), 0).unwrap());
        }
        // An HTTPS one could verify nothing: refused by name, not a builder error.
        let e = with_system_cas(&at(Some("https://minio:9000")), 0).unwrap_err();
        assert_eq!(e.reason(), "NoCACertificates");
        assert!(e.to_string().contains("https://minio:9000"), "{e}");
        let e = with_system_cas(&at(None), 0).unwrap_err();
        assert!(
            e.to_string().contains("https://s3.eu-west-1.amazonaws.com"),
            "{e}"
        );
    }
}
