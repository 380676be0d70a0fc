//! What clients of a cluster see through an operation: how many of its
//! members are out of service at once, by their pods' `Ready` conditions
//! (a pod that runs but is not Ready serves nothing through the client
//! Service), sampled every [`PERIOD`] in the background for the whole
//! operation, independently of the controller's steps. Sampling starts
//! once every member is in service ([`ReadySampler::start`] waits for it):
//! the operation's samples are the operation's, not those of the start that
//! came before it (the controller counts a member ready once etcd answers
//! it healthy, which is before the kubelet's next readiness probe says so).
//!
//! A member is out of service when its pod is missing, being deleted, or
//! not `Ready`. The members counted are the cluster's size (ordinals below
//! `spec.replicas`): a spare that joins beside them (a move to another
//! StorageClass adds one) was never in service, and is not counted while
//! it starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// How often the pods are read.
pub const PERIOD: Duration = Duration::from_millis(100);

/// How long [`ReadySampler::start`] waits for every member to be in
/// service before the operation.
pub const IN_SERVICE_BOUND: Duration = Duration::from_secs(120);

/// Samples `name`'s members in `namespace` until [`ReadySampler::stop`].
pub struct ReadySampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Sampled>>,
}

/// What the samples showed.
#[derive(Debug, Default, Clone)]
pub struct Sampled {
    /// Samples taken.
    pub samples: usize,
    /// The most members out of service at once, each described (pod UID,
    /// deletion, `Ready` and when it last changed), with the sample's time.
    pub most: Vec<String>,
    pub most_at: Option<k8s_openapi::jiff::Timestamp>,
}

impl ReadySampler {
    /// Waits until the `members` members of cluster `name` are all in
    /// service (at most [`IN_SERVICE_BOUND`]; the error names those that
    /// are not), then samples them.
    pub async fn start(client: Client, namespace: &str, name: &str, members: u32) -> Result<Self> {
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let prefix = format!("{name}-etcd-");
        let deadline = std::time::Instant::now() + IN_SERVICE_BOUND;
        loop {
            let out = out_of_service(&pods, &prefix, members).await?;
            if out.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "members of {name} not in service {IN_SERVICE_BOUND:?} before the operation: {out:?}"
                );
            }
            tokio::time::sleep(PERIOD).await;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Sampled::default();
            let mut last: Vec<String> = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let out = out_of_service(&pods, &prefix, members).await?;
                seen.samples += 1;
                if out != last {
                    eprintln!(
                        "[{}] out of service: {out:?}",
                        k8s_openapi::jiff::Timestamp::now()
                    );
                    last = out.clone();
                }
                if out.len() > seen.most.len() {
                    seen.most = out;
                    seen.most_at = Some(k8s_openapi::jiff::Timestamp::now());
                }
                tokio::time::sleep(PERIOD).await;
            }
            Ok(seen)
        });
        Ok(ReadySampler { stop, task })
    }

    /// Stops sampling; what was seen.
    pub async fn stop(self) -> Result<Sampled> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// The members out of service now, described.
async fn out_of_service(pods: &Api<Pod>, prefix: &str, members: u32) -> Result<Vec<String>> {
    let list = pods.list(&ListParams::default()).await?;
    let by_ordinal: BTreeMap<u32, &Pod> = (list.items.iter())
        .filter_map(|p| Some((p.name_any().strip_prefix(prefix)?.parse().ok()?, p)))
        .collect();
    Ok((0..members)
        .filter_map(|o| match by_ordinal.get(&o) {
            None => Some(format!("{o}: no pod")),
            Some(p) if in_service(p) => None,
            Some(p) => Some(describe(o, p)),
        })
        .collect())
}

fn ready(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready")
}

fn in_service(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && ready(pod).is_some_and(|c| c.status == "True")
}

/// A member pod as a failure message needs it.
fn describe(ordinal: u32, pod: &Pod) -> String {
    let ready = ready(pod).map(|c| {
        (
            c.status.clone(),
            c.last_transition_time.as_ref().map(|t| t.0),
        )
    });
    let etcd = (pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()))
    .into_iter()
    .flatten()
    .find(|c| c.name == "etcd")
    .map(|c| (c.ready, c.restart_count));
    format!(
        "{ordinal}: uid {:?}, deleting {}, Ready {ready:?}, etcd (ready, restarts) {etcd:?}",
        pod.uid(),
        pod.metadata.deletion_timestamp.is_some()
    )
}
