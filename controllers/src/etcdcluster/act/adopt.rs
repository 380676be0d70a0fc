//! The steps of a takeover of a running etcd that no other step takes:
//! making the existing CA this cluster's, and removing an old member from
//! the membership. Its pod, StatefulSet and volume belong to their owner and
//! are never touched; the controller only lets go of its connection to it.

use kube::ResourceExt;

use super::super::context::{Error, Result};
use super::super::observe::adopt::{join_spec, read_join_ca};
use super::members::etcd_client;
use super::pki::create_pki_with;
use super::target::Target;

/// Creates the PKI Secret with the existing cluster's CA (read again from
/// the join credentials) and the controller's identity issued from it.
pub(super) async fn import_ca(on: &Target<'_>) -> Result<()> {
    let join = join_spec(on.cluster)
        .ok_or_else(|| Error::Invalid("the cluster no longer adopts an etcd".into()))?;
    let ns = on.cluster.namespace().unwrap_or_default();
    let ca = read_join_ca(&on.ctx.management, &ns, join)
        .await?
        .map_err(Error::Invalid)?;
    create_pki_with(on.cluster, on.ctx, on.names(), &ca).await
}

/// Removes old member `member_id` (its removal was recorded in status
/// before this runs).
pub(super) async fn retire_member(on: &Target<'_>, member_id: u64) -> Result<()> {
    let etcd = etcd_client(on.observed).await?;
    let leaving = (on.observed.health.as_ref())
        .and_then(|h| h.member(member_id))
        .and_then(|m| m.member.client_urls.first().cloned());
    etcd.remove_member(member_id).await?;
    // Its etcd stops once it learns it was removed; a pooled connection to
    // it would only time out.
    if let Some(url) = leaving
        && let Err(e) = etcd.disconnect(&url).await
    {
        tracing::debug!(error = %e, member = %url, "could not close the connection to a retired member");
    }
    Ok(())
}
