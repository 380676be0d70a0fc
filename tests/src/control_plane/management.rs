//! A real management cluster alone, for the fleet benchmark's
//! `fleet_real_api` run (`make bench-fleet`): kube-apiserver,
//! kube-controller-manager and kube-scheduler on their own storage etcd,
//! with the CRDs and the controller's RBAC applied as shipped
//! (`config/crd`, `config/rbac`, `config/rbac/all-namespaces`), no Nodes and
//! no workload planes: the fleet's 2,000 workload clusters stay the
//! in-memory API servers ([`crate::fleet::Fleet::with_real_management`]).

use anyhow::Result;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, Subject};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::world::{
    CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT, controller_token, create_namespace, install,
    service_account_token,
};
use super::{AuditLog, ControlPlane, Controllers, KubeBinaries, StorageEtcd};
use crate::etcd_harness::newest_built_etcd;

/// The controller's user name in the API server's audit log.
pub const CONTROLLER_USERNAME: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-controller";

/// A real management plane with the controller's RBAC installed.
pub struct RealManagement {
    pub binaries: KubeBinaries,
    pub plane: ControlPlane,
    _storage: StorageEtcd,
}

impl RealManagement {
    /// Starts the plane and installs the CRDs and the all-namespaces RBAC.
    pub async fn start(binaries: KubeBinaries) -> Result<RealManagement> {
        let storage = StorageEtcd::start(&newest_built_etcd()?.etcd).await?;
        let plane = ControlPlane::start(
            &binaries,
            &storage,
            "management",
            Controllers::Management,
            &[],
        )
        .await?;
        create_namespace(&plane.admin_client().await?, CONTROLLER_NAMESPACE).await?;
        install(&plane, &binaries, "config/rbac")?;
        install(&plane, &binaries, "config/rbac/all-namespaces")?;
        Ok(RealManagement {
            binaries,
            plane,
            _storage: storage,
        })
    }

    /// The admin's client (no RBAC; its calls are audited under the admin).
    pub async fn admin_client(&self) -> Result<Client> {
        self.plane.admin_client().await
    }

    /// A kubeconfig of the controller's ServiceAccount (`TokenRequest`) and
    /// its token.
    pub async fn controller_kubeconfig(&self) -> Result<(String, String)> {
        let token = controller_token(&self.plane).await?;
        Ok((self.plane.kubeconfig_with_token(&token), token))
    }

    /// Another identity with the shipped controller's rights: ServiceAccount
    /// `name`, added to every binding that names the shipped one. Replicas
    /// of a Deployment share one ServiceAccount; a test that must tell
    /// them apart in the audit log gives each its own. Returns its
    /// kubeconfig and the user name the audit log records.
    pub async fn controller_identity(&self, name: &str) -> Result<(String, String)> {
        let admin = self.admin_client().await?;
        let account: ServiceAccount = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": CONTROLLER_NAMESPACE }
        }))?;
        Api::<ServiceAccount>::namespaced(admin.clone(), CONTROLLER_NAMESPACE)
            .create(&PostParams::default(), &account)
            .await?;
        let subject =
            json!({ "kind": "ServiceAccount", "name": name, "namespace": CONTROLLER_NAMESPACE });
        let shipped = |subjects: &Option<Vec<Subject>>| {
            subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == CONTROLLER_SERVICE_ACCOUNT
                    && s.namespace.as_deref() == Some(CONTROLLER_NAMESPACE)
            })
        };
        let add = Patch::Json::<()>(serde_json::from_value(json!([
            { "op": "add", "path": "/subjects/-", "value": subject }
        ]))?);
        let cluster_bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        for b in cluster_bindings.list(&Default::default()).await? {
            if shipped(&b.subjects) {
                cluster_bindings
                    .patch(&b.name_any(), &PatchParams::default(), &add)
                    .await?;
            }
        }
        for b in Api::<RoleBinding>::all(admin.clone())
            .list(&Default::default())
            .await?
        {
            if shipped(&b.subjects) {
                let ns = b.namespace().unwrap_or_default();
                Api::<RoleBinding>::namespaced(admin.clone(), &ns)
                    .patch(&b.name_any(), &PatchParams::default(), &add)
                    .await?;
            }
        }
        let token = service_account_token(&self.plane, name).await?;
        Ok((
            self.plane.kubeconfig_with_token(&token),
            format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:{name}"),
        ))
    }

    /// Every request audited so far.
    pub fn audit(&self) -> Result<AuditLog> {
        self.plane.audit()
    }

    pub fn apiserver_pid(&self) -> u32 {
        self.plane.apiserver_pid()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audited_username_is_the_controllers_service_account() {
        assert_eq!(
            CONTROLLER_USERNAME,
            format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_SERVICE_ACCOUNT}")
        );
    }
}
