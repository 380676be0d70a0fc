//! Smoke test of the installed etcd binaries: a real single-member etcd of
//! each version starts, answers a put and a get through etcd-client, and
//! reports the version it was installed as. `make test` installs both; if one
//! is missing this fails (ETCDFLEET_REQUIRE_ETCD=1) or says SKIPPED.

use std::time::Duration;

use anyhow::{Result, ensure};
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};

async fn put_get(version: EtcdVersion, expected: &str) -> Result<()> {
    let Some(binary) = require_etcd(version) else {
        return Ok(());
    };
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(1, binary)).await?;
    let mut kv = cluster.cluster_client().await?.kv();
    tokio::time::timeout(Duration::from_secs(5), kv.put("smoke", expected, None)).await??;
    let got = tokio::time::timeout(Duration::from_secs(5), kv.get("smoke", None)).await??;
    ensure!(got.kvs().len() == 1 && got.kvs()[0].value_str()? == expected);
    let status = cluster.member_client(0).await?.status().await?;
    ensure!(
        status.version == expected,
        "runs {} (expected {expected})",
        status.version
    );
    Ok(())
}

#[tokio::test]
async fn etcd_3_4_from_debian_answers_put_and_get() -> Result<()> {
    put_get(EtcdVersion::V3_4, "3.4.23").await
}

#[tokio::test]
async fn etcd_3_5_from_pypi_answers_put_and_get() -> Result<()> {
    put_get(EtcdVersion::V3_5, "3.5.1").await
}
