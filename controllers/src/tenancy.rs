//! The platform's fence around the tenants of a shared management cluster,
//! for what a tenant's object-store destination may use beyond what it
//! names itself:
//!
//! - a bucket is reached with the keys of the tenant's own Secret
//!   (`credentialsSecretName`), or with the controller's workload identity
//!   (IRSA's web identity or an EKS Pod Identity, from the controller pod's
//!   environment) only in the namespaces the platform names. Nothing else:
//!   the instance metadata service is never asked for the node's identity;
//! - a directory of the controller's own filesystem (`path`) only in the
//!   namespaces the platform names (development and tests).
//!
//! - no backup schedule runs more often than the platform allows, and one
//!   that sets no retention keeps the platform's default count.
//!
//! Configured under `tenancy` in the controller configuration
//! ([`TenancyConfig`]); [`Fence::reach`] is the one judgement, made before
//! any request. Pure; knows no reconciler.

use std::collections::BTreeSet;

use etcdfleet_api::ObjectStoreDestination;
use serde::{Deserialize, Serialize};

/// The `tenancy` section of the controller configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// Namespaces whose bucket destinations without `credentialsSecretName`
    /// use the controller's workload identity (`["*"]`: every namespace).
    /// Empty (the default): none; such a destination is refused.
    pub workload_identity_namespaces: Vec<String>,
    /// Namespaces whose destinations may be a directory of the controller's
    /// filesystem (`path`; `["*"]`: every namespace). Empty (the default):
    /// none; such a destination is refused.
    pub local_destination_namespaces: Vec<String>,
    /// No backup schedule may run more often than this (default 900: every
    /// 15 minutes); each run is an `EtcdBackup` object and a snapshot.
    pub min_schedule_interval_seconds: u64,
    /// A schedule that sets no retention (neither it nor its cluster's
    /// `spec.backup`) keeps this many successful backups (default 30).
    pub default_retention_count: u32,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        TenancyConfig {
            workload_identity_namespaces: Vec::new(),
            local_destination_namespaces: Vec::new(),
            min_schedule_interval_seconds: 900,
            default_retention_count: 30,
        }
    }
}

impl TenancyConfig {
    /// The first invalid entry, as `(field, message)`.
    pub fn invalid(&self) -> Option<(&'static str, String)> {
        let lists = [
            (
                "tenancy.workloadIdentityNamespaces",
                &self.workload_identity_namespaces,
            ),
            (
                "tenancy.localDestinationNamespaces",
                &self.local_destination_namespaces,
            ),
        ];
        for (field, list) in lists {
            if let Some(bad) = list.iter().find(|n| n.as_str() != "*" && !is_dns_label(n)) {
                return Some((
                    field,
                    format!("{bad:?} is neither \"*\" nor a namespace name"),
                ));
            }
        }
        if self.min_schedule_interval_seconds < 60 {
            let field = "tenancy.minScheduleIntervalSeconds";
            return Some((
                field,
                "must be at least 60 (cron runs once a minute)".into(),
            ));
        }
        if self.default_retention_count == 0 {
            let field = "tenancy.defaultRetentionCount";
            return Some((field, "must be at least 1".into()));
        }
        None
    }
}

/// Flag values over the `tenancy` section (`None`/empty: keep the file's).
#[derive(Debug, Clone, Default)]
pub struct TenancyOverrides {
    pub workload_identity_namespaces: Vec<String>,
    pub local_destination_namespaces: Vec<String>,
    pub min_schedule_interval_seconds: Option<u64>,
    pub default_retention_count: Option<u32>,
}

impl TenancyOverrides {
    /// `config` with these flags over it.
    pub fn apply(self, config: &mut TenancyConfig) {
        if !self.workload_identity_namespaces.is_empty() {
            config.workload_identity_namespaces = self.workload_identity_namespaces;
        }
        if !self.local_destination_namespaces.is_empty() {
            config.local_destination_namespaces = self.local_destination_namespaces;
        }
        if let Some(v) = self.min_schedule_interval_seconds {
            config.min_schedule_interval_seconds = v;
        }
        if let Some(v) = self.default_retention_count {
            config.default_retention_count = v;
        }
    }
}

/// Whether `s` is a DNS label (RFC 1123), as namespace names are.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A set of namespaces: none, all, or the listed ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Namespaces {
    #[default]
    None,
    All,
    Listed(BTreeSet<String>),
}

impl Namespaces {
    fn of(list: &[String]) -> Self {
        if list.iter().any(|n| n == "*") {
            Namespaces::All
        } else if list.is_empty() {
            Namespaces::None
        } else {
            Namespaces::Listed(list.iter().cloned().collect())
        }
    }

    fn holds(&self, namespace: &str) -> bool {
        match self {
            Namespaces::None => false,
            Namespaces::All => true,
            Namespaces::Listed(names) => names.contains(namespace),
        }
    }
}

/// The controller's own identity for buckets, as its pod's environment
/// gives it (never the instance metadata service).
#[derive(Clone, PartialEq, Eq)]
pub enum WorkloadIdentity {
    /// AssumeRoleWithWebIdentity with a projected token (IRSA):
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`.
    WebIdentity {
        token_file: String,
        role_arn: String,
        session_name: Option<String>,
        sts_endpoint: Option<String>,
    },
    /// An EKS Pod Identity agent: `AWS_CONTAINER_CREDENTIALS_FULL_URI` and
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`.
    PodIdentity {
        full_uri: String,
        token_file: String,
    },
}

impl std::fmt::Debug for WorkloadIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkloadIdentity::WebIdentity { role_arn, .. } => write!(f, "WebIdentity({role_arn})"),
            WorkloadIdentity::PodIdentity { full_uri, .. } => write!(f, "PodIdentity({full_uri})"),
        }
    }
}

impl WorkloadIdentity {
    /// The identity the environment `var` reads gives, if any.
    pub fn from(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        if let (Some(token_file), Some(role_arn)) =
            (set("AWS_WEB_IDENTITY_TOKEN_FILE"), set("AWS_ROLE_ARN"))
        {
            return Some(WorkloadIdentity::WebIdentity {
                token_file,
                role_arn,
                session_name: set("AWS_ROLE_SESSION_NAME"),
                sts_endpoint: set("AWS_ENDPOINT_URL_STS"),
            });
        }
        match (
            set("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
            set("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
        ) {
            (Some(full_uri), Some(token_file)) => Some(WorkloadIdentity::PodIdentity {
                full_uri,
                token_file,
            }),
            _ => None,
        }
    }

    /// The identity of this process's environment, if any.
    pub fn from_env() -> Option<Self> {
        Self::from(|name| std::env::var(name).ok())
    }
}

/// How a tenant's destination is reached, once [`Fence::reach`] allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach<'a> {
    /// With the keys of the Secret of this name, in the tenant's namespace.
    Keys(&'a str),
    /// With the controller's workload identity.
    Workload(&'a WorkloadIdentity),
    /// A directory of the controller's filesystem.
    Local,
}

/// Why a destination is refused before any request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "a bucket destination needs credentialsSecretName: the controller reaches a tenant's \
         bucket with the keys of the tenant's own Secret, with its workload identity only in \
         the namespaces the platform names (tenancy.workloadIdentityNamespaces: {namespace} is \
         not one), and never with the identity of the node it runs on"
    )]
    NoCredentials { namespace: String },
    #[error(
        "a bucket destination needs credentialsSecretName: namespace {namespace} may use the \
         controller's workload identity, but the controller pod has none (neither \
         AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN nor AWS_CONTAINER_CREDENTIALS_FULL_URI \
         with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE is set)"
    )]
    NoWorkloadIdentity { namespace: String },
    #[error(
        "destination.path names a directory of the controller's own filesystem, which the \
         platform allows only in the namespaces it names (tenancy.localDestinationNamespaces: \
         {namespace} is not one); use a bucket"
    )]
    LocalDestination { namespace: String },
}

impl Refused {
    /// Short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::NoCredentials { .. } | Refused::NoWorkloadIdentity { .. } => {
                "CredentialsRequired"
            }
            Refused::LocalDestination { .. } => "LocalDestinationRefused",
        }
    }
}

/// The fence, as the configuration and the controller's environment set it.
#[derive(Debug, Clone)]
pub struct Fence {
    workload_identity: Option<WorkloadIdentity>,
    workload_identity_namespaces: Namespaces,
    local_destination_namespaces: Namespaces,
    /// The shortest interval a schedule may have, in seconds.
    pub min_schedule_interval: u64,
    /// The retention count of a schedule that sets none.
    pub default_retention_count: u32,
}

impl Default for Fence {
    /// The fence of the default configuration, lending no identity.
    fn default() -> Self {
        Fence::new(&TenancyConfig::default(), None)
    }
}

impl Fence {
    /// The fence of `config`, with the workload identity `identity` (the
    /// controller's environment's, [`WorkloadIdentity::from_env`]).
    pub fn new(config: &TenancyConfig, identity: Option<WorkloadIdentity>) -> Self {
        Fence {
            workload_identity: identity,
            workload_identity_namespaces: Namespaces::of(&config.workload_identity_namespaces),
            local_destination_namespaces: Namespaces::of(&config.local_destination_namespaces),
            min_schedule_interval: config.min_schedule_interval_seconds,
            default_retention_count: config.default_retention_count,
        }
    }

    /// How namespace `namespace`'s `destination` is reached, or why it may
    /// not be. A destination with both or neither of bucket and path is the
    /// store's to refuse; this judges only what the platform allows.
    pub fn reach<'a>(
        &'a self,
        namespace: &str,
        destination: &'a ObjectStoreDestination,
    ) -> Result<Reach<'a>, Refused> {
        if destination.path.is_some() {
            if !self.local_destination_namespaces.holds(namespace) {
                return Err(Refused::LocalDestination {
                    namespace: namespace.to_string(),
                });
            }
            return Ok(Reach::Local);
        }
        if let Some(name) = &destination.credentials_secret_name {
            return Ok(Reach::Keys(name));
        }
        if !self.workload_identity_namespaces.holds(namespace) {
            return Err(Refused::NoCredentials {
                namespace: namespace.to_string(),
            });
        }
        match &self.workload_identity {
            Some(identity) => Ok(Reach::Workload(identity)),
            None => Err(Refused::NoWorkloadIdentity {
                namespace: namespace.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(credentials: Option<&str>) -> ObjectStoreDestination {
        ObjectStoreDestination {
            bucket: Some("b".into()),
            credentials_secret_name: credentials.map(String::from),
            ..Default::default()
        }
    }

    fn pod_identity() -> WorkloadIdentity {
        WorkloadIdentity::PodIdentity {
            full_uri: "http://169.254.170.23/v1/credentials".into(),
            token_file: "/var/run/secrets/pods.eks.amazonaws.com/token".into(),
        }
    }

    #[test]
    fn the_default_fence_reaches_a_bucket_only_with_the_tenants_own_keys() {
        let fence = Fence::default();
        assert_eq!(fence.reach("a", &bucket(Some("s3"))), Ok(Reach::Keys("s3")));
        let refused = fence.reach("a", &bucket(None)).unwrap_err();
        assert_eq!(refused.reason(), "CredentialsRequired");
        assert!(refused.to_string().contains("a is not one"), "{refused}");
        let local = ObjectStoreDestination {
            path: Some("/tmp/x".into()),
            ..Default::default()
        };
        let refused = fence.reach("a", &local).unwrap_err();
        assert_eq!(refused.reason(), "LocalDestinationRefused");
    }

    #[test]
    fn workload_identity_serves_only_the_namespaces_the_platform_names() {
        let config = TenancyConfig {
            workload_identity_namespaces: vec!["team-a".into()],
            ..Default::default()
        };
        let identity = pod_identity();
        let fence = Fence::new(&config, Some(identity.clone()));
        assert_eq!(
            fence.reach("team-a", &bucket(None)),
            Ok(Reach::Workload(&identity))
        );
        assert_eq!(
            fence.reach("team-b", &bucket(None)),
            Err(Refused::NoCredentials {
                namespace: "team-b".into()
            })
        );
        // Named, but the controller pod has no identity to lend.
        let without = Fence::new(&config, None);
        assert_eq!(
            without.reach("team-a", &bucket(None)).unwrap_err().reason(),
            "CredentialsRequired"
        );
        let all = TenancyConfig {
            local_destination_namespaces: vec!["*".into()],
            ..Default::default()
        };
        let local = ObjectStoreDestination {
            path: Some("/tmp/x".into()),
            ..Default::default()
        };
        assert_eq!(
            Fence::new(&all, None).reach("any", &local),
            Ok(Reach::Local)
        );
    }

    #[test]
    fn the_identity_comes_from_the_variables_the_platforms_webhooks_set() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                (pairs.iter())
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(WorkloadIdentity::from(env(&[])), None);
        assert_eq!(
            WorkloadIdentity::from(env(&[("AWS_ROLE_ARN", "arn:aws:iam::1:role/r")])),
            None,
            "a role without its token is no identity"
        );
        let irsa = WorkloadIdentity::from(env(&[
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "/var/run/secrets/eks.amazonaws.com/token",
            ),
        ]));
        assert!(
            matches!(irsa, Some(WorkloadIdentity::WebIdentity { .. })),
            "{irsa:?}"
        );
        let pod = WorkloadIdentity::from(env(&[
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://169.254.170.23/v1/credentials",
            ),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/t"),
        ]));
        assert!(
            matches!(pod, Some(WorkloadIdentity::PodIdentity { .. })),
            "{pod:?}"
        );
    }

    #[test]
    fn a_namespace_list_holds_names_or_the_star_only() {
        let bad = TenancyConfig {
            local_destination_namespaces: vec!["../x".into()],
            ..Default::default()
        };
        let (field, message) = bad.invalid().unwrap();
        assert_eq!(field, "tenancy.localDestinationNamespaces");
        assert!(message.contains("../x"), "{message}");
        let good = TenancyConfig {
            workload_identity_namespaces: vec!["*".into(), "team-a".into()],
            ..Default::default()
        };
        assert_eq!(good.invalid(), None);
    }
}
