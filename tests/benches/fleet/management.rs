//! The bench's management cluster: the in-memory API server (whose request
//! recorder counts the controller's calls) or a real kube-apiserver (whose
//! audit log does), behind one interface.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::control_plane::{
    AuditEvent, CONTROLLER_USERNAME, RealManagement, client_from_kubeconfig, require_kubernetes,
};
use etcdfleet_tests::fleet::{ApiOp, Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::scenario::NS;

pub enum Management {
    InMemory,
    Real(Box<RealManagement>),
}

/// Where counting starts: the audit log's length then (0 in memory, where
/// the recorder is cleared instead).
#[derive(Debug, Clone, Copy)]
pub struct Mark(usize);

impl Management {
    /// A real management cluster when `real` (the real tier's builds).
    pub async fn start(real: bool) -> Result<Management> {
        if !real {
            return Ok(Management::InMemory);
        }
        let binaries = require_kubernetes()
            .context("the real management API needs the Kubernetes build (make tools)")?;
        let started = std::time::Instant::now();
        let management = RealManagement::start(binaries).await?;
        eprintln!(
            "fleet: real management API server up, CRDs and RBAC installed in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(Management::Real(Box::new(management)))
    }

    /// The fleet of `names` workload clusters on this management cluster.
    pub async fn fleet(&self, names: &[&str], images: ImageTable) -> Result<Fleet> {
        match self {
            Management::InMemory => {
                Fleet::with_images(ApiServer::management().await?, NS, names, images).await
            }
            Management::Real(m) => {
                let (kubeconfig, _) = m.controller_kubeconfig().await?;
                let controller = client_from_kubeconfig(&kubeconfig).await?;
                Fleet::with_real_management(m.admin_client().await?, controller, NS, names, images)
                    .await
            }
        }
    }

    /// The controller's kubeconfig and its bearer token.
    pub async fn controller_kubeconfig(&self, fleet: &Fleet) -> Result<(String, String)> {
        match self {
            Management::InMemory => {
                let token = fleet.management_api().issue_token(CONTROLLER_USER);
                Ok((fleet.management_api().kubeconfig(&token), token))
            }
            Management::Real(m) => m.controller_kubeconfig().await,
        }
    }

    /// Starts counting: clears the recorder and notes the audit log's length.
    pub fn mark(&self, fleet: &Fleet) -> Result<Mark> {
        fleet.clear_ops();
        Ok(Mark(match self {
            Management::InMemory => 0,
            Management::Real(m) => m.audit()?.len(),
        }))
    }

    /// The calls made with one of `tokens` since `mark`: the recorder's,
    /// and on a real management cluster the controller's audited calls
    /// (which carry `management_token`, the controller's token there).
    pub fn calls_since(
        &self,
        fleet: &Fleet,
        mark: Mark,
        tokens: &BTreeSet<String>,
        management_token: &str,
    ) -> Result<Vec<ApiOp>> {
        let mut ops: Vec<ApiOp> = fleet
            .ops()
            .into_iter()
            .filter(|op| op.token.as_ref().is_some_and(|t| tokens.contains(t)))
            .collect();
        if let Management::Real(m) = self {
            let audit = m.audit()?;
            ops.extend(
                audit
                    .by_since(CONTROLLER_USERNAME, mark.0)
                    .into_iter()
                    .map(|e| audited_op(e, management_token)),
            );
        }
        Ok(ops)
    }

    /// The kube-apiserver's process, on a real management cluster.
    pub fn apiserver_pid(&self) -> Option<i32> {
        match self {
            Management::InMemory => None,
            Management::Real(m) => Some(m.apiserver_pid() as i32),
        }
    }
}

/// An audited request as the recorder would have recorded it (its verb
/// names: `replace` for update, `<verb>_<subresource>`).
fn audited_op(e: &AuditEvent, token: &str) -> ApiOp {
    let object = e.object_ref.clone().unwrap_or_default();
    let base = match e.verb.as_str() {
        "update" => "replace",
        "deletecollection" => "delete_collection",
        other => other,
    };
    let verb = if object.subresource.is_empty() {
        base.to_string()
    } else {
        format!("{base}_{}", object.subresource)
    };
    ApiOp {
        cluster: MANAGEMENT.to_string(),
        verb,
        group: object.api_group.clone(),
        version: String::new(),
        resource: object.resource.clone(),
        namespace: (!object.namespace.is_empty()).then(|| object.namespace.clone()),
        name: (!object.name.is_empty()).then(|| object.name.clone()),
        query: e.request_uri.split_once('?').map(|(_, q)| q.to_string()),
        patch_type: None,
        body: None,
        rejected: e.code() >= 400,
        token: Some(token.to_string()),
    }
}
