//! `render`: a cluster resolved against the given templates, offline,
//! with where each field came from, and the workload objects the controller
//! would write when it creates the cluster.

use std::fmt;

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::template::{Resolution, resolve};

use super::manifests::{CliError, Manifests, cluster_id};
use crate::etcdcluster::resolve::render_inputs;
use crate::render::{self, RenderInputs, RenderProfile};

/// The resolved spec as a YAML-friendly value.
fn resolved_spec_value(r: &Resolution) -> serde_json::Value {
    let s = &r.spec;
    serde_json::json!({
        "version": s.version.to_string(),
        "replicas": s.replicas,
        "image": s.image,
        "workloadNamespace": s.workload_namespace,
        "storage": { "storageClassName": s.storage.class, "size": s.storage.size.0 },
        "resources": s.resources,
        "tls": { "enabled": s.tls_enabled },
        "podTemplate": s.pod,
        "etcd": {
            "heartbeatIntervalMillis": s.tuning.heartbeat_interval_millis,
            "electionTimeoutMillis": s.tuning.election_timeout_millis,
            "quotaBackendBytes": s.tuning.quota_backend_bytes,
            "autoCompactionRetention": s.tuning.auto_compaction_retention,
            "snapshotCount": s.tuning.snapshot_count,
        },
        "backup": s.backup,
    })
}

/// What `render` prints for one cluster.
#[derive(Debug, Clone)]
pub struct RenderReport {
    pub cluster: String,
    pub resolution: Resolution,
    pub inputs: RenderInputs,
    /// The workload objects the first reconciles write, in order.
    pub objects: Vec<serde_json::Value>,
}

/// Resolves a cluster against the given templates and renders the workload
/// objects the controller would write when it creates the cluster.
pub fn render_cluster(
    cluster: &EtcdCluster,
    manifests: &Manifests,
) -> Result<RenderReport, CliError> {
    let id = cluster_id(cluster);
    let (ct, t) = manifests
        .templates_for(cluster)
        .map_err(|error| CliError::Resolve {
            cluster: id.clone(),
            error,
        })?;
    let resolution = resolve(ct, t, &cluster.spec).map_err(|error| CliError::Resolve {
        cluster: id.clone(),
        error,
    })?;
    etcdfleet_api::version::decide(None, &resolution.spec.version.to_string()).map_err(
        |error| CliError::Version {
            cluster: id.clone(),
            error: Box::new(error),
        },
    )?;
    let inputs = render_inputs(cluster, &resolution);
    let names = inputs.names();
    let json = |v: serde_json::Result<serde_json::Value>| v.expect("Kubernetes objects serialize");
    // Bootstrap starts one member; the others join one at a time as learners.
    let objects = vec![
        json(serde_json::to_value(render::namespace(&inputs))),
        json(serde_json::to_value(render::peer_service(&inputs))),
        json(serde_json::to_value(render::client_service(&inputs))),
        json(serde_json::to_value(render::pdb(&inputs))),
        json(serde_json::to_value(render::members_configmap(
            &inputs,
            &render::initial_cluster(&names, inputs.tls, [0]),
            "new",
        ))),
        json(serde_json::to_value(render::statefulset(
            &inputs,
            &RenderProfile::default(),
            1,
        ))),
    ];
    Ok(RenderReport {
        cluster: id,
        resolution,
        inputs,
        objects,
    })
}

impl fmt::Display for RenderReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yaml =
            |v: &serde_json::Value| etcdfleet_api::yaml::to_string(v).map_err(|_| fmt::Error);
        writeln!(f, "# EtcdCluster {}", self.cluster)?;
        writeln!(f, "# resolved spec:")?;
        for line in yaml(&resolved_spec_value(&self.resolution))?.lines() {
            writeln!(f, "#   {line}")?;
        }
        writeln!(f, "# where each field came from:")?;
        let width = self
            .resolution
            .sources
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(0);
        for (path, source) in &self.resolution.sources {
            writeln!(f, "#   {path:width$}  {source}")?;
        }
        writeln!(
            f,
            "# workload objects (namespace {}); the StatefulSet starts with 1 member, \
             and the others join one at a time as learners up to {}{}:",
            self.inputs.workload_namespace,
            self.resolution.spec.replicas,
            if self.inputs.tls {
                "; TLS Secrets are issued from the cluster's CA and not shown"
            } else {
                ""
            }
        )?;
        for object in &self.objects {
            writeln!(f, "---")?;
            f.write_str(&yaml(object)?)?;
        }
        Ok(())
    }
}
