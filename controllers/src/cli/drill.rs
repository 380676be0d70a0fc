//! What `plan` says of a cluster's restore drills: for each
//! EtcdBackupSchedule naming it (given beside it, with status, as `kubectl
//! get etcdbackupschedules,etcdbackups -o yaml` prints them), the policy in
//! force and what its next drill waits for, decided as the controller
//! decides (`etcdfleet_api::drill`) from the schedule's backups given too.

use etcdfleet_api::backup::SCHEDULE_LABEL;
use etcdfleet_api::drill::{Drills, Next, next_drill, unsettled};
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use kube::ResourceExt;

use super::manifests::Manifests;
use crate::backup::drill::{candidate, last_drill};

/// One line per schedule of `cluster` in `m`.
pub fn drill_lines(cluster: &EtcdCluster, m: &Manifests) -> Vec<String> {
    let ns = cluster.namespace();
    let defaults = cluster
        .spec
        .config
        .backup
        .as_ref()
        .and_then(|b| b.drill.as_ref());
    let conditions = cluster
        .status
        .as_ref()
        .map(|s| &s.conditions[..])
        .unwrap_or(&[]);
    (m.schedules.iter())
        .filter(|s| s.namespace() == ns && s.spec.cluster_name == cluster.name_any())
        .map(|s| {
            let name = s.name_any();
            let policy = match Drills::resolve(s.spec.drill.as_ref(), defaults) {
                Ok(Some(p)) => p,
                Ok(None) => return format!("{name}: none (no drill policy)"),
                Err(e) => return format!("{name}: invalid drill policy: {e}"),
            };
            let backups: Vec<EtcdBackup> = (m.backups.iter())
                .filter(|b| b.namespace() == ns && b.labels().get(SCHEDULE_LABEL) == Some(&name))
                .cloned()
                .collect();
            let candidates: Vec<_> = backups.iter().filter_map(candidate).collect();
            let last = last_drill(&backups);
            let next = match next_drill(&policy, &candidates, last.as_ref()) {
                Next::Drill(b) => match unsettled(&cluster.name_any(), conditions) {
                    Some(why) => format!("{b} once settled ({why})"),
                    None => format!("{b} now"),
                },
                other => other.to_string(),
            };
            let last = match last {
                Some(d) => format!("{} {} ({})", d.backup, d.result, d.message),
                None => "none".to_string(),
            };
            format!("{name}: next {next}; last {last}")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "
apiVersion: etcdfleet.dev/v1beta1
kind: EtcdCluster
metadata: {name: shop, namespace: t}
spec:
  clusterRef: {name: w1}
  version: 3.6.5
  replicas: 3
status:
  conditions:
  - {type: Available, status: 'True', reason: QuorumHealthy, message: '', lastTransitionTime: '2026-11-28T00:00:00Z'}
---
apiVersion: etcdfleet.dev/v1beta1
kind: EtcdBackupSchedule
metadata: {name: nightly, namespace: t}
spec:
  clusterName: shop
  schedule: '0 2 * * *'
  drill: {everyNthBackup: 2}
";

    fn backup(name: &str, hour: u32, drilled: Option<&str>) -> String {
        let drill = drilled.map_or(String::new(), |r| {
            format!("\n  lastDrill: {{backup: {name}, result: {r}, message: ok, completedAt: '2026-11-2{hour}T03:00:00Z'}}")
        });
        format!(
            "---
apiVersion: etcdfleet.dev/v1beta1
kind: EtcdBackup
metadata: {{name: {name}, namespace: t, labels: {{etcdfleet.dev/backup-schedule: nightly}}}}
spec: {{clusterName: shop}}
status:
  phase: Succeeded
  completedAt: '2026-11-2{hour}T02:05:00Z'{drill}
"
        )
    }

    fn lines(yaml: &str) -> Vec<String> {
        let m = Manifests::parse(yaml, "test").expect("parses");
        assert!(m.invalid.is_empty(), "{:?}", m.invalid);
        drill_lines(&m.clusters[0], &m)
    }

    #[test]
    fn plan_says_which_backup_the_next_drill_takes_and_what_it_waits_for() {
        let never = format!("{CLUSTER}{}", backup("b1", 1, None));
        assert_eq!(lines(&never), ["nightly: next b1 now; last none"]);
        let drilled = format!(
            "{CLUSTER}{}{}",
            backup("b1", 1, Some("Passed")),
            backup("b2", 2, None)
        );
        assert_eq!(
            lines(&drilled),
            ["nightly: next after the next successful backup; last b1 Passed (ok)"]
        );
        let progressing = drilled.replace(
            "  - {type: Available",
            "  - {type: Progressing, status: 'True', reason: Rolling, message: '', \
             lastTransitionTime: '2026-11-28T00:00:00Z'}\n  - {type: Available",
        );
        let more = format!("{progressing}{}", backup("b3", 3, None));
        let said = lines(&more);
        assert!(
            said[0].starts_with("nightly: next b3 once settled (EtcdCluster shop is Progressing"),
            "{said:?}"
        );
    }
}
