//! Admission: whether a reconcile of one EtcdCluster goes on, before it
//! reads anything of the workload cluster. A short, pure list of named
//! rules ([`RULES`]), most decisive first, over the EtcdCluster alone; the
//! first that answers decides, and a cluster no rule stops is admitted.
//! What the cluster then does is the planner's ([`super::plan::RULES`]).
//! Together the two lists are everything the controller decides about a
//! cluster, read top to bottom.

use etcdfleet_api::{EtcdCluster, ManagedIdentity};
use kube::{Resource, ResourceExt};

use super::context::{FINALIZER, Outcome};
use super::plan::guards::identity_mismatch;
use super::plan::step::Refusal;
use crate::connector::KubeconfigLocation;
use etcdfleet_api::template::resolve_own_spec;

/// What admission decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// The reconcile ends here, having read and written nothing.
    Stop(Outcome),
    /// Being deleted: clean up the workload cluster, release the finalizer.
    Finalize,
    /// Refused before any workload I/O; only the status says why.
    Refuse(Refusal),
    /// Goes on. `writes`: false while paused (observed, planned and
    /// reported, nothing written); `add_finalizer`: it is not there yet.
    Proceed { writes: bool, add_finalizer: bool },
}

/// What admission decides from: the EtcdCluster, whether this controller
/// owns it (its namespaces and label selector), and the identity its spec
/// asks for (`None` while the spec does not resolve on its own, which it
/// always does once the cluster has ever acted, since the values its
/// templates supplied are then written into it).
pub struct Candidate<'a> {
    pub cluster: &'a EtcdCluster,
    pub owned: bool,
    pub identity: Option<ManagedIdentity>,
}

impl<'a> Candidate<'a> {
    pub fn new(cluster: &'a EtcdCluster, owned: bool) -> Self {
        Candidate {
            cluster,
            owned,
            identity: wanted_identity(cluster),
        }
    }

    fn paused(&self) -> bool {
        self.cluster.spec.paused == Some(true)
    }

    fn deleting(&self) -> bool {
        self.cluster.meta().deletion_timestamp.is_some()
    }

    fn has_finalizer(&self) -> bool {
        self.cluster.finalizers().iter().any(|f| f == FINALIZER)
    }
}

/// The identity the spec asks for: the kubeconfig Secret, the workload
/// namespace and TLS, as resolved from the spec alone.
pub fn wanted_identity(cluster: &EtcdCluster) -> Option<ManagedIdentity> {
    let location = KubeconfigLocation::of(cluster)?;
    let resolved = resolve_own_spec(&cluster.spec).ok()?.spec;
    Some(ManagedIdentity {
        kubeconfig_secret: format!("{}/{}", location.secret_name, location.key),
        workload_namespace: resolved.workload_namespace,
        tls: resolved.tls_enabled,
    })
}

/// One admission rule.
pub type Rule = fn(&Candidate) -> Option<Admission>;

/// The admission rules, most decisive first.
pub const RULES: &[(&str, Rule)] = &[
    ("owned", owned),
    ("deleting while paused", deleting_while_paused),
    ("deleting", deleting),
    ("identity", identity),
    ("paused", paused),
];

/// Admits `candidate`: the first rule that answers, else it proceeds.
pub fn admit(candidate: &Candidate) -> Admission {
    RULES
        .iter()
        .find_map(|(_, rule)| rule(candidate))
        .unwrap_or(Admission::Proceed {
            writes: true,
            add_finalizer: !candidate.has_finalizer(),
        })
}

/// Rule: another stage's (or shard's) cluster is neither read nor written.
fn owned(c: &Candidate) -> Option<Admission> {
    (!c.owned).then(|| {
        Admission::Stop(Outcome::Blocked(format!(
            "not owned by this controller: {}/{} is outside its namespaces or label selector",
            c.cluster.namespace().unwrap_or_default(),
            c.cluster.name_any()
        )))
    })
}

/// Rule: paused means no write anywhere, the cleanup of a deletion included.
fn deleting_while_paused(c: &Candidate) -> Option<Admission> {
    (c.deleting() && c.paused() && c.has_finalizer()).then(|| {
        Admission::Stop(Outcome::Paused(Some(
            "clean up the workload cluster and release the finalizer".into(),
        )))
    })
}

/// Rule: a deleted cluster is cleaned up (its PVCs kept) and let go.
fn deleting(c: &Candidate) -> Option<Admission> {
    c.deleting().then_some(Admission::Finalize)
}

/// Rule: the etcd this resource manages stays the one it started with
/// (`status.identity`); a spec that points elsewhere is refused before any
/// workload I/O.
fn identity(c: &Candidate) -> Option<Admission> {
    let recorded = c.cluster.status.as_ref()?.identity.as_ref();
    let message = identity_mismatch(recorded, c.identity.as_ref()?)?;
    Some(Admission::Refuse(Refusal {
        reason: "IdentityChanged",
        message,
    }))
}

/// Rule: a paused cluster is observed, planned and reported, and nothing
/// is written: not the finalizer, not the materialized spec, no step.
fn paused(c: &Candidate) -> Option<Admission> {
    c.paused().then_some(Admission::Proceed {
        writes: false,
        add_finalizer: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdfleet_api::{ClusterRef, EtcdClusterSpec, EtcdClusterStatus, EtcdConfig};

    fn cluster() -> EtcdCluster {
        let mut c = EtcdCluster::new(
            "shop",
            EtcdClusterSpec {
                cluster_ref: Some(ClusterRef { name: "w".into() }),
                config: EtcdConfig {
                    version: Some("3.5.1".into()),
                    replicas: Some(3),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("team-a".into());
        c
    }

    #[test]
    fn an_owned_cluster_proceeds_and_gets_its_finalizer_once() {
        let mut c = cluster();
        let proceed = |add_finalizer| Admission::Proceed {
            writes: true,
            add_finalizer,
        };
        assert_eq!(admit(&Candidate::new(&c, true)), proceed(true));
        c.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_eq!(admit(&Candidate::new(&c, true)), proceed(false));
        assert!(matches!(
            admit(&Candidate::new(&c, false)),
            Admission::Stop(Outcome::Blocked(why)) if why.contains("not owned")
        ));
    }

    #[test]
    fn deletion_finalizes_unless_paused() {
        let mut c = cluster();
        c.metadata.finalizers = Some(vec![FINALIZER.into()]);
        c.metadata.deletion_timestamp = Some(crate::etcdcluster::context::now());
        assert_eq!(admit(&Candidate::new(&c, true)), Admission::Finalize);
        c.spec.paused = Some(true);
        assert!(matches!(
            admit(&Candidate::new(&c, true)),
            Admission::Stop(Outcome::Paused(Some(_)))
        ));
    }

    #[test]
    fn a_spec_that_moves_the_recorded_identity_is_refused_and_paused_writes_nothing() {
        let mut c = cluster();
        let recorded = wanted_identity(&c).unwrap();
        c.status = Some(EtcdClusterStatus {
            identity: Some(recorded),
            ..Default::default()
        });
        c.spec.config.workload_namespace = Some("elsewhere".into());
        assert!(matches!(
            admit(&Candidate::new(&c, true)),
            Admission::Refuse(r) if r.reason == "IdentityChanged"
        ));
        c.spec.config.workload_namespace = None;
        c.spec.paused = Some(true);
        assert_eq!(
            admit(&Candidate::new(&c, true)),
            Admission::Proceed {
                writes: false,
                add_finalizer: false
            }
        );
    }
}
