//! Real Kubernetes control planes for the test world: kube-apiserver,
//! kube-controller-manager and kube-scheduler, built by the test command from
//! the `k8s.io/kubernetes` Go module (`hack/upstream/build.sh`, linked at
//! `.tools/kubernetes`), run as processes of the test.
//!
//! A [`ControlPlane`] is one cluster's API server with its controllers:
//!
//! - **kube-apiserver** serves HTTPS on a loopback port with a certificate of
//!   the plane's own CA, authenticates bearer tokens from a token file (an
//!   admin in `system:masters`, the users a test asks for) and ServiceAccount
//!   tokens (`--service-account-*`, so `TokenRequest` works), authorizes with
//!   RBAC only, runs the default admission plugins minus
//!   `TaintNodesByCondition` (its controller, node lifecycle, is not run, so
//!   new Nodes would stay tainted), and writes every request to an audit log
//!   ([`ControlPlane::audit`]) from which tests count reads and writes.
//!   Several planes share one storage etcd ([`StorageEtcd`]), each under its
//!   own `--etcd-prefix`.
//! - **kube-controller-manager** with the controllers the plane asks for
//!   ([`Controllers`]): a workload plane runs the StatefulSet controller, the
//!   garbage collector, the PV binder with the host-path provisioner behind a
//!   default StorageClass, PVC and PV protection, namespaces, disruption and
//!   service accounts.
//! - **kube-scheduler**, placing pods on the Nodes the process kubelet
//!   ([`crate::runtime`] in node mode) registers, or real kubelets
//!   ([`crate::real_node`], [`ControlPlane::start_with`]).
//!
//! Every process dies with the test ([`EtcdProcess`]: own process group,
//! `PR_SET_PDEATHSIG`); logs stay in the plane's directory, kept and printed
//! when the test panics.

mod audit;
pub mod conditions;
mod management;
mod nodes;
mod plane;
pub mod readiness;
pub mod readme;
mod real_world;
pub mod rollouts;
pub mod scenario;
pub mod world;

pub use audit::{AuditEvent, AuditLog};
pub use management::{CONTROLLER_USERNAME, RealManagement};
pub use plane::{
    ADMIN_USER, ControlPlane, Controllers, KubeBinaries, StorageEtcd, User, client_from_kubeconfig,
    require_kubernetes,
};
pub use real_world::RealWorldSpec;
pub use world::{KubeWorld, Nodes, WorkloadPlane, real_settings};
