//! Every condition an EtcdCluster shows, as a person watching it with
//! `kubectl get -w` would see it: a watch on the management API server
//! records each (type, status, reason) the status passes through, so a test
//! can assert that `Degraded` never turned True during planned work.

use std::sync::{Arc, Mutex};

use anyhow::Result;
use etcdfleet_api::EtcdCluster;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;

use super::KubeWorld;
use super::scenario::NS;

/// One condition as it was seen: type, status, reason, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Records the conditions of one EtcdCluster until dropped.
pub struct ConditionRecorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConditionRecorder {
    /// Starts watching `name` in the suites' namespace (it may not exist yet).
    pub async fn start(world: &KubeWorld, name: &str) -> Result<ConditionRecorder> {
        let api: Api<EtcdCluster> = Api::namespaced(world.management.admin_client().await?, NS);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event {
                    record(&into, &c);
                }
            }
        });
        Ok(ConditionRecorder { seen, task })
    }

    /// Every distinct condition seen so far, in the order first seen.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("recorder lock").clone()
    }

    /// The conditions of `type_` that were ever `status`.
    pub fn seen_as(&self, type_: &str, status: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.type_ == type_ && s.status == status)
            .collect()
    }
}

impl Drop for ConditionRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn record(into: &Mutex<Vec<Seen>>, cluster: &EtcdCluster) {
    let mut seen = into.lock().expect("recorder lock");
    for c in cluster.status.iter().flat_map(|s| &s.conditions) {
        let s = Seen {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        };
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
}
