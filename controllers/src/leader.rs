//! Lease-based leader election (coordination.k8s.io/v1 `Lease`), so that of
//! several controller replicas exactly one reconciles.
//!
//! A candidate takes the Lease when it is free or expired, and the holder
//! renews it every renew interval (a third of the lease duration by default).
//! Expiry is judged the way client-go judges it: by the local time at which this replica last saw the
//! Lease *change*, never by comparing another replica's clock with ours.
//! Every write carries the resourceVersion it read, so two candidates racing
//! for an expired Lease cannot both win.
//!
//! The holder gives up leading when another identity holds the Lease, or when
//! no renewal succeeded within the renew deadline (two thirds of the duration
//! by default): it then stops reconciling and exits, well before any other replica may
//! consider the Lease expired. Kubernetes restarts it as a candidate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::config::LeaderElectionConfig;

/// One attempt to take or renew the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease now.
    Leading,
    /// Another replica holds a Lease that has not expired.
    HeldBy(String),
    /// The Lease changed between read and write; try again.
    Conflict,
}

/// Why a leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum LeaseLost {
    #[error("lease {lease} is now held by {holder}")]
    TakenOver { lease: String, holder: String },
    #[error("lease {lease} not renewed for {elapsed:?} (deadline {deadline:?}): {last_error}")]
    RenewDeadline {
        lease: String,
        elapsed: Duration,
        deadline: Duration,
        last_error: String,
    },
}

/// What this replica last saw of the Lease, and when (local clock).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    resource_version: Option<String>,
    holder: Option<String>,
    at: Instant,
}

/// Takes, renews and releases one Lease for one identity.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    renew_interval: Duration,
    renew_deadline: Duration,
    seen: Mutex<Option<Seen>>,
    observer: Option<AttemptObserver>,
}

/// Told the result of every attempt (`true`: the API answered, whoever
/// holds the Lease), e.g. for readiness.
pub type AttemptObserver = Arc<dyn Fn(bool) + Send + Sync>;

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl LeaderElector {
    pub fn new(client: Client, config: &LeaderElectionConfig, identity: String) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.lease_namespace),
            name: config.lease_name.clone(),
            identity,
            duration: config.lease_duration(),
            renew_interval: config.renew_interval(),
            renew_deadline: config.renew_deadline(),
            seen: Mutex::new(None),
            observer: None,
        }
    }

    /// Reports the outcome of every attempt to `observer`.
    pub fn with_observer(mut self, observer: AttemptObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The Lease's name.
    pub fn lease_name(&self) -> &str {
        &self.name
    }

    /// How long the Lease is valid without renewal.
    pub fn lease_duration(&self) -> Duration {
        self.duration
    }

    /// `POD_NAME` in a Deployment; otherwise the host name and process id.
    pub fn default_identity() -> String {
        crate::config::replica_identity()
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How often the holder renews (and a candidate retries).
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }

    /// How long the holder keeps leading without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// How long a holder that lost the Lease may go on before it exits:
    /// half the time between its renew deadline and the lease duration, so
    /// it is gone before any other replica may see the Lease expire (they
    /// count the duration from when they saw the last renewal, which is
    /// after it was made).
    pub fn exit_grace(&self) -> Duration {
        self.duration.saturating_sub(self.renew_deadline) / 2
    }

    fn spec_for_us(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let ours = previous.and_then(|s| s.holder_identity.as_deref()) == Some(&self.identity);
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: if ours {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now())
            },
            renew_time: Some(now()),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }
    }

    /// Whether the Lease as read has gone unrenewed for its duration, judged by
    /// when this replica first saw it in this state.
    fn expired(&self, lease: &Lease) -> bool {
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        if holder.as_deref().is_none_or(str::is_empty) {
            return true;
        }
        let duration = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(self.duration, |s| Duration::from_secs(s.max(1) as u64));
        let mut seen = self.seen.lock().expect("lease observation poisoned");
        let current = (lease.resource_version(), holder);
        match seen.as_ref() {
            Some(s) if (s.resource_version.clone(), s.holder.clone()) == current => {
                s.at.elapsed() >= duration
            }
            _ => {
                *seen = Some(Seen {
                    resource_version: current.0,
                    holder: current.1,
                    at: Instant::now(),
                });
                false
            }
        }
    }

    /// One attempt: create the Lease, renew it, or take it over once expired.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec_for_us(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        if holder != self.identity && !self.expired(&lease) {
            return Ok(Attempt::HeldBy(holder));
        }
        // Ours to renew, or free / expired to take. `replace` carries the
        // resourceVersion just read: a concurrent writer makes this a conflict.
        lease.spec = Some(self.spec_for_us(lease.spec.as_ref()));
        lease.metadata.managed_fields = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if holder != self.identity {
                    info!(lease = %self.name, previous = %holder, identity = %self.identity, "took over expired lease");
                }
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&self) {
        let mut last_holder = String::new();
        loop {
            match self.attempt_with_timeout().await {
                Ok(Attempt::Leading) => {
                    info!(lease = %self.name, identity = %self.identity, "acquired leadership");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if holder != last_holder {
                        info!(lease = %self.name, %holder, "lease held by another replica; waiting");
                        last_holder = holder;
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(e) => warn!(lease = %self.name, error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(self.renew_interval()).await;
        }
    }

    async fn attempt_with_timeout(&self) -> Result<Attempt, String> {
        self.attempt_within(self.renew_interval()).await
    }

    /// One attempt that gives up after `limit` (a hung call must not
    /// outlive the renew interval, nor a holder's renew deadline).
    async fn attempt_within(&self, limit: Duration) -> Result<Attempt, String> {
        let result = match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("lease request timed out".to_string()),
        };
        if let Some(observer) = &self.observer {
            observer(result.is_ok());
        }
        result
    }

    /// Renews the held Lease until leadership is lost; returns why.
    pub async fn hold(&self) -> LeaseLost {
        let mut last_renewal = Instant::now();
        let mut last_error = String::new();
        loop {
            tokio::time::sleep(self.renew_interval()).await;
            // No attempt may end after the renew deadline: the holder must
            // know it lost the Lease by then (see `exit_grace`).
            let left = self.renew_deadline().saturating_sub(last_renewal.elapsed());
            let attempt = if left.is_zero() {
                Err("the renew deadline passed before the attempt".to_string())
            } else {
                self.attempt_within(left.min(self.renew_interval())).await
            };
            match attempt {
                Ok(Attempt::Leading) => last_renewal = Instant::now(),
                Ok(Attempt::HeldBy(holder)) => {
                    return LeaseLost::TakenOver {
                        lease: self.name.clone(),
                        holder,
                    };
                }
                Ok(Attempt::Conflict) => last_error = "conflicting write to the lease".into(),
                Err(e) => {
                    warn!(lease = %self.name, error = %e, "lease renewal failed");
                    last_error = e;
                }
            }
            let elapsed = last_renewal.elapsed();
            if elapsed >= self.renew_deadline() {
                return LeaseLost::RenewDeadline {
                    lease: self.name.clone(),
                    elapsed,
                    deadline: self.renew_deadline(),
                    last_error,
                };
            }
        }
    }

    /// Gives the Lease up on a clean shutdown so another replica takes over
    /// at once instead of after the lease duration. Best effort.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(now());
        lease.metadata.managed_fields = None;
        if let Err(e) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            warn!(lease = %self.name, error = %e, "could not release the lease");
        }
    }
}
