//! `validate`: each object of the project's kinds checked as the API
//! server would (its CRD's schema and CEL rules), and the fields its schema
//! does not declare refused (the API server would drop them silently;
//! offline they are misspellings).

use etcdfleet_api::validation::validate_object;
use etcdfleet_api::{ClusterEtcdTemplate, EtcdCluster, EtcdFleetRollout, EtcdTemplate};
use kube::CustomResourceExt;

/// Checks one object of a project kind as the API server would (its CRD's
/// schema and CEL rules), and also refuses fields the schema does not declare:
/// the API server would silently drop them, offline they are misspellings.
/// Returns one message per offending field, each starting with its path.
pub fn validate_offline(kind: &str, object: &serde_json::Value) -> Result<(), Vec<String>> {
    let crd = match kind {
        "EtcdCluster" => EtcdCluster::crd(),
        "EtcdTemplate" => EtcdTemplate::crd(),
        "ClusterEtcdTemplate" => ClusterEtcdTemplate::crd(),
        "EtcdFleetRollout" => EtcdFleetRollout::crd(),
        "EtcdBackupSchedule" => etcdfleet_api::EtcdBackupSchedule::crd(),
        "EtcdBackup" => etcdfleet_api::EtcdBackup::crd(),
        other => return Err(vec![format!("kind: {other} is not an etcdfleet kind")]),
    };
    let crd = crate::crd::with_also_served(crd, etcdfleet_api::ALSO_SERVED);
    let mut errors: Vec<String> = match validate_object(&crd, object, None) {
        Ok(v) => v
            .unknown_fields
            .iter()
            .map(|f| format!("{f}: unknown field (not in the {kind} schema)"))
            .collect(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    errors.extend(schedule_error(object));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// What the CRD's rule cannot say of `spec.backup.schedule` (it checks five
/// fields only): whether the cron parser the controller runs accepts it.
fn schedule_error(object: &serde_json::Value) -> Option<String> {
    let schedule = object.pointer("/spec/backup/schedule")?.as_str()?;
    let error = etcdfleet_api::backup::parse_schedule(schedule).err()?;
    Some(format!(
        "spec.backup.schedule: Invalid value: \"{schedule}\": {error}"
    ))
}
