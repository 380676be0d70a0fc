//! Reads that need every member to answer, each on its own (a serializable
//! read, answered by that member alone). `Available` counts a quorum, not
//! every member: right after a member restarts, or while the kubelet brings
//! back an evicted one, its endpoint refuses connections for a moment, or
//! names a pod that is not there yet. Each member is therefore waited for,
//! up to [`MEMBER_ANSWER_BOUND`], its endpoint looked up again on every try
//! (a pod made again may come back at another address), and the error
//! names the member that never answered and how it last failed.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use etcd_client::{GetOptions, GetResponse};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig};

/// How long one member is waited for.
pub const MEMBER_ANSWER_BOUND: Duration = Duration::from_secs(30);

/// `get(key, options)` as a serializable read answered by `member` alone,
/// at the endpoint `endpoint()` gives at each try, within `bound`.
pub async fn get_from_member<E, F>(
    member: &str,
    endpoint: E,
    config: &EtcdConfig,
    (key, options): (&str, GetOptions),
    bound: Duration,
) -> Result<GetResponse>
where
    E: Fn() -> F,
    F: Future<Output = Result<String>>,
{
    let deadline = Instant::now() + bound;
    let mut tries = 0;
    loop {
        tries += 1;
        let last = match try_get(&endpoint, config, key, options.clone()).await {
            Ok(resp) => return Ok(resp),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(anyhow!(
                "member {member} did not answer a serializable read of {key:?} within \
                 {bound:?} ({tries} tries); last: {last:#}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn try_get<E, F>(
    endpoint: &E,
    config: &EtcdConfig,
    key: &str,
    options: GetOptions,
) -> Result<GetResponse>
where
    E: Fn() -> F,
    F: Future<Output = Result<String>>,
{
    let at = endpoint().await?;
    let mut kv = ClusterClient::connect(std::slice::from_ref(&at), config)
        .await?
        .kv();
    let get = kv.get(key, Some(options.with_serializable()));
    let resp = tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .map_err(|_| anyhow!("{at}: no answer in 5 s"))?
        .map_err(|e| anyhow!("{at}: {e}"))?;
    Ok(resp)
}
