//! etcd's online downgrade API (3.6 and later): `validate`, `enable` and
//! `cancel`, as `etcdctl downgrade` calls them (etcd.io docs v3.6
//! `downgrades/downgrade_3_6`). The target is a cluster version,
//! `MAJOR.MINOR` (etcd drops any patch).
//!
//! `enable` moves the cluster version down to the target at once; each
//! member then migrates its storage version to it (within etcd's
//! `monitorVersionInterval`, 4 s) and reports it in `Status`, after which
//! members may be replaced by the older binary one at a time. Once every
//! member runs the target minor, the leader ends the downgrade itself.
//! `cancel` before that raises the cluster version back to what the members
//! run.

use etcd_client::{Client, DowngradeOptions};

use super::call::Retry;
use super::client::{ClusterClient, Result};
use super::error::EtcdError;

/// What etcd answered to a downgrade call that it accepted: the cluster
/// version at the time (`3.6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DowngradeAnswer {
    pub cluster_version: String,
}

/// etcd's own words for a downgrade that is already enabled.
const IN_PROGRESS: &str = "downgrade job in progress";
/// etcd's own words for a cancel with no downgrade enabled.
const NONE_IN_FLIGHT: &str = "no inflight downgrade job";

fn message_of(e: &EtcdError) -> &str {
    match e {
        EtcdError::Rpc { message, .. } => message,
        _ => "",
    }
}

impl ClusterClient {
    async fn downgrade(&self, op: &'static str, options: DowngradeOptions) -> Result<String> {
        let call = |c: Client| {
            let options = options.clone();
            async move { c.maintenance_client().downgrade(options).await }
        };
        let resp = self.ask(op, None, Retry::LEADER, call).await?;
        Ok(resp.version().to_string())
    }

    /// `etcdctl downgrade validate <target>`: whether the cluster may go
    /// down to `target` now (one minor below its cluster version, no other
    /// downgrade enabled).
    pub async fn validate_downgrade(&self, target: &str) -> Result<DowngradeAnswer> {
        let cluster_version = self
            .downgrade(
                "downgrade validate",
                DowngradeOptions::Validate(target.to_string()),
            )
            .await?;
        Ok(DowngradeAnswer { cluster_version })
    }

    /// `etcdctl downgrade enable <target>` (etcd validates again). An answer
    /// lost after etcd enabled it makes the retry say "in progress": that is
    /// success, the status of every 3.6+ member names the target.
    pub async fn enable_downgrade(&self, target: &str) -> Result<DowngradeAnswer> {
        match self
            .downgrade(
                "downgrade enable",
                DowngradeOptions::Enable(target.to_string()),
            )
            .await
        {
            Ok(cluster_version) => Ok(DowngradeAnswer { cluster_version }),
            Err(e) if message_of(&e).contains(IN_PROGRESS) => Ok(DowngradeAnswer {
                cluster_version: String::new(),
            }),
            Err(e) => Err(e),
        }
    }

    /// `etcdctl downgrade cancel`; nothing enabled is not an error (the
    /// leader ends a finished downgrade by itself).
    pub async fn cancel_downgrade(&self) -> Result<()> {
        match self
            .downgrade("downgrade cancel", DowngradeOptions::Cancel)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if message_of(&e).contains(NONE_IN_FLIGHT) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
