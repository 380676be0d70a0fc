//! Version changes done by hand on the controller's own pods: the floor the
//! operations bench measures the controller against. A person with kubectl
//! and etcdctl, on a cluster the controller created and then left alone,
//! follows etcd's upgrade and downgrade guides step by step: for a downgrade
//! `validate`, `enable` and the wait for every member's storage version;
//! then the StatefulSet's image and version flags edited to the target
//! release (its update strategy is `OnDelete`, so nothing restarts yet);
//! each follower's pod deleted and the member waited for on the target
//! release (polled every 50 ms); leadership moved to a restarted member; the
//! old leader's pod deleted and waited for last.
//!
//! Both sides run in the same world (the same pods, hosts, flags and
//! runtime), so the ratio is the controller's own cost. etcd's exit after
//! SIGTERM alone differs between worlds: its peer server waits up to a
//! second for connections in flight, which on a plain local cluster it did
//! at every restart (1.01 s) and in the pods at about half of them (20 ms
//! otherwise), so a floor on a local cluster counted a second per restart
//! against itself.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient, MemberStatus};
use etcdfleet_controllers::render::Names;
use etcdfleet_controllers::version_flags::version_flags;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, DeleteParams, PostParams};

use crate::etcd_harness::EtcdBinary;
use crate::fleet::Fleet;
use crate::scenario::{WORKLOAD_NS, etcd_of};
use crate::versions::minor_of;

/// How often the person's loop looks at etcd again.
const POLL: Duration = Duration::from_millis(50);
/// Longest wait for one member or one migration.
const WAIT: Duration = Duration::from_secs(60);

/// EtcdCluster `name` on `workload` (`members` members, running `from`)
/// as a person at a terminal reaches it: each etcdctl call opens its own
/// connection, so none is held to a member while its pod is deleted (as
/// the controller lets go of a member before restarting it).
pub struct ByHand {
    names: Names,
    from: String,
    endpoints: Vec<String>,
    config: EtcdConfig,
    statefulsets: Api<StatefulSet>,
    pods: Api<Pod>,
}

impl ByHand {
    pub async fn connect(
        fleet: &Fleet,
        workload: &str,
        name: &str,
        members: u32,
        from: &str,
    ) -> Result<ByHand> {
        let (endpoints, config) = etcd_of(fleet, workload, name, members).await?;
        let client = fleet.workload_client(workload);
        Ok(ByHand {
            names: Names::new(name, WORKLOAD_NS),
            from: from.to_string(),
            endpoints,
            config,
            statefulsets: Api::namespaced(client.clone(), WORKLOAD_NS),
            pods: Api::namespaced(client, WORKLOAD_NS),
        })
    }

    /// A rolling upgrade (or a patch change) to `to`.
    pub async fn upgrade(&self, to: &EtcdBinary) -> Result<()> {
        self.set_release(&to.release).await?;
        self.roll(&to.release).await
    }

    /// etcd's online downgrade to `to`: validate, enable, wait until every
    /// member's storage version is the target, then the roll.
    pub async fn downgrade(&self, to: &EtcdBinary) -> Result<()> {
        let (minor, _) = minor_of(&to.release)?;
        let target = format!("3.{minor}");
        let cluster = self.cluster().await?;
        cluster.validate_downgrade(&target).await?;
        cluster.enable_downgrade(&target).await?;
        drop(cluster);
        let storage = format!("{target}.0");
        self.wait_all("migrated", |s| s.storage_version == storage)
            .await?;
        self.upgrade(to).await
    }

    /// `kubectl edit statefulset`: the image tag and the version flags of
    /// `release` in place of those of the running release.
    async fn set_release(&self, release: &str) -> Result<()> {
        let name = self.names.statefulset();
        let mut sts = self.statefulsets.get(&name).await?;
        let container = sts
            .spec
            .template
            .spec
            .as_mut()
            .and_then(|p| p.containers.first_mut())
            .context("StatefulSet without a container")?;
        retag(container, &self.from, release)?;
        self.statefulsets
            .replace(&name, &PostParams::default(), &sts)
            .await?;
        Ok(())
    }

    /// Followers first, each deleted and waited for on `release`; then
    /// leadership moved to the first of them; the old leader last.
    async fn roll(&self, release: &str) -> Result<()> {
        let (_, leader) = self.cluster().await?.leader().await?;
        let statuses = self.statuses().await?;
        let leader_ordinal = ordinal_of(&statuses, leader.member_id)?;
        let followers: Vec<u32> = (0..self.endpoints.len() as u32)
            .filter(|&o| o != leader_ordinal)
            .collect();
        for &o in &followers {
            self.restart(o, release).await?;
        }
        let first = followers.first().context("no follower")?;
        let to = statuses[*first as usize].member_id;
        self.cluster().await?.move_leader(to).await?;
        self.restart(leader_ordinal, release).await
    }

    /// `kubectl delete pod`, then `etcdctl endpoint health` and `status`
    /// until the member answers on `release`.
    async fn restart(&self, ordinal: u32, release: &str) -> Result<()> {
        let pod = self.names.pod(ordinal);
        self.pods.delete(&pod, &DeleteParams::default()).await?;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(member) = self.member(ordinal).await
                && let Ok(status) = member.status().await
                && status.version == release
                && member.check_health().await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{pod} not healthy on {release} within {WAIT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn member(&self, ordinal: u32) -> Result<MemberClient> {
        Ok(MemberClient::connect(&self.endpoints[ordinal as usize], &self.config).await?)
    }

    async fn cluster(&self) -> Result<ClusterClient> {
        Ok(ClusterClient::connect(&self.endpoints, &self.config).await?)
    }

    async fn statuses(&self) -> Result<Vec<MemberStatus>> {
        let mut seen = Vec::new();
        for ordinal in 0..self.endpoints.len() as u32 {
            seen.push(self.member(ordinal).await?.status().await?);
        }
        Ok(seen)
    }

    async fn wait_all(&self, what: &str, ok: impl Fn(&MemberStatus) -> bool) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            let seen = self.statuses().await?;
            if seen.iter().all(&ok) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("members not {what} within {WAIT:?}: {seen:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The ordinal whose member answered as `member_id`.
fn ordinal_of(statuses: &[MemberStatus], member_id: u64) -> Result<u32> {
    statuses
        .iter()
        .position(|s| s.member_id == member_id)
        .map(|o| o as u32)
        .with_context(|| format!("member {member_id:x} answers on no ordinal"))
}

/// The container's image tag moved from release `from` to `to`, and the
/// version flags of `from` replaced by those of `to`.
pub fn retag(container: &mut Container, from: &str, to: &str) -> Result<()> {
    let image = container.image.as_deref().unwrap_or_default();
    if !image.contains(from) {
        bail!("image {image} does not name {from}");
    }
    container.image = Some(image.replace(from, to));
    let old = version_flags(from);
    let args = container.args.get_or_insert_with(Vec::new);
    args.retain(|a| !old.contains(a));
    args.extend(version_flags(to));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retagged_container_names_the_new_release_and_its_flags_only() {
        let mut c = Container {
            image: Some("registry.k8s.io/etcd:v3.6.16".into()),
            args: Some(
                ["--name=x".to_string()]
                    .into_iter()
                    .chain(version_flags("3.6.16"))
                    .collect(),
            ),
            ..Container::default()
        };
        retag(&mut c, "3.6.16", "3.7.3").unwrap();
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/etcd:v3.7.3"));
        let args = c.args.unwrap();
        assert_eq!(args[0], "--name=x");
        assert_eq!(args[1..], version_flags("3.7.3")[..]);
        let mut other = Container {
            image: Some("etcd:v3.5.35".into()),
            ..Container::default()
        };
        assert!(retag(&mut other, "3.6.16", "3.7.3").is_err());
    }
}
