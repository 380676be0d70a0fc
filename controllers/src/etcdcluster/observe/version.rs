//! What the version rules (`plan::version`) read beyond the rest of the
//! observation: the change of minor the policy accepted, the cluster's
//! backup destination and the snapshot recorded for the change, and member
//! pods whose etcd runs with the v2 store enabled. Read only.

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::version::VersionChange;
use k8s_openapi::api::core::v1::Pod;

use super::super::plan::observation::VersionObservation;

/// Whether etcd's command line or environment enables the v2 store
/// (`--enable-v2`, `ETCD_ENABLE_V2=true`): what etcd's 3.6 upgrade guide
/// asks to check with `etcdutl check v2store` before upgrading.
pub fn v2_store_enabled(args: &[String], env: &[(String, String)]) -> bool {
    let flag = args.iter().any(|a| {
        let a = a.trim_start_matches('-');
        a == "enable-v2" || a.strip_prefix("enable-v2=").is_some_and(|v| v != "false")
    });
    flag || env
        .iter()
        .any(|(k, v)| k == "ETCD_ENABLE_V2" && v.eq_ignore_ascii_case("true"))
}

/// The version rules' view of `cluster`: the accepted change and what the
/// member pods run with. Read only.
pub fn observe(
    cluster: &EtcdCluster,
    change: Option<&VersionChange>,
    pods: &[&Pod],
) -> VersionObservation {
    let minor_change = change
        .and_then(VersionChange::crosses_minor)
        .map(|(from, to)| (from.clone(), to.clone()));
    let destination = cluster
        .spec
        .config
        .backup
        .as_ref()
        .and_then(|b| b.destination.as_ref());
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.version_change_snapshot.as_ref());
    let snapshot_taken = match (&minor_change, recorded) {
        (Some((from, to)), Some(r)) => r.from == from.to_string() && r.to == to.to_string(),
        _ => false,
    };
    let v2_enabled = pods
        .iter()
        .filter(|pod| {
            let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
                return false;
            };
            let env: Vec<(String, String)> = c
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect();
            v2_store_enabled(c.args.as_deref().unwrap_or_default(), &env)
        })
        .filter_map(|pod| pod.metadata.name.clone())
        .collect();
    VersionObservation {
        minor_change,
        backup_destination: destination.map(describe_destination),
        snapshot_taken,
        v2_enabled,
    }
}

/// `s3://bucket/prefix` or the directory, for messages.
pub fn describe_destination(d: &etcdfleet_api::ObjectStoreDestination) -> String {
    let prefix = d.prefix.as_deref().unwrap_or_default();
    match (&d.bucket, &d.path) {
        (Some(bucket), _) => format!("s3://{bucket}/{prefix}"),
        (None, Some(path)) => format!("{path}/{prefix}"),
        (None, None) => "an incomplete destination".to_string(),
    }
    .trim_end_matches('/')
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_v2_store_counts_as_enabled_only_when_a_flag_or_env_says_so() {
        let env = |v: &str| vec![("ETCD_ENABLE_V2".to_string(), v.to_string())];
        assert!(!v2_store_enabled(&strings(&["--name=a"]), &[]));
        assert!(v2_store_enabled(&strings(&["--enable-v2"]), &[]));
        assert!(v2_store_enabled(&strings(&["--enable-v2=true"]), &[]));
        assert!(!v2_store_enabled(&strings(&["--enable-v2=false"]), &[]));
        assert!(v2_store_enabled(&[], &env("true")));
        assert!(!v2_store_enabled(&[], &env("false")));
    }

    #[test]
    fn destinations_read_as_a_person_writes_them() {
        let d = etcdfleet_api::ObjectStoreDestination {
            bucket: Some("backups".into()),
            prefix: Some("prod".into()),
            ..Default::default()
        };
        assert_eq!(describe_destination(&d), "s3://backups/prod");
        let d = etcdfleet_api::ObjectStoreDestination {
            path: Some("/srv/snapshots".into()),
            ..Default::default()
        };
        assert_eq!(describe_destination(&d), "/srv/snapshots");
    }
}
