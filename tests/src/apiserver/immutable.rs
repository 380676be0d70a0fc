//! Immutable fields of the built-in kinds the controller writes, refused on
//! update with the API server's 422 messages.

use serde_json::Value;

/// One refused field: (field path, cause reason, message).
pub type Cause = (String, &'static str, String);

/// StatefulSet spec fields an update may change.
const STATEFULSET_MUTABLE: [&str; 6] = [
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

/// `1Gi` → bytes; `None` if not a quantity.
pub fn quantity_bytes(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => {
            let exp: i32 = suffix.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(exp)
        }
    };
    Some(n * mult)
}

fn without(spec: &Value, keys: &[&str]) -> Value {
    match spec {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The causes refusing the update of `old` to `new` of kind `kind` (core
/// group kinds by bare name, others as `StatefulSet`).
pub fn check_update(kind: &str, old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    match kind {
        "StatefulSet"
            if without(&old["spec"], &STATEFULSET_MUTABLE)
                != without(&new["spec"], &STATEFULSET_MUTABLE) =>
        {
            causes.push((
                    "spec".into(),
                    "FieldValueForbidden",
                    "Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden".into(),
                ));
        }
        "PersistentVolumeClaim" => {
            let size = |v: &Value| {
                v["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .and_then(quantity_bytes)
            };
            // Binding sets volumeName on a claim that had none.
            let unbound = old["spec"]["volumeName"].as_str().is_none_or(str::is_empty);
            let rest = |v: &Value| {
                let mut spec = v["spec"].clone();
                if let Some(req) = spec
                    .pointer_mut("/resources/requests")
                    .and_then(Value::as_object_mut)
                {
                    req.remove("storage");
                }
                if unbound && let Some(spec) = spec.as_object_mut() {
                    spec.remove("volumeName");
                }
                without(&spec, &["volumeAttributesClassName"])
            };
            if rest(old) != rest(new) {
                causes.push((
                    "spec".into(),
                    "FieldValueForbidden",
                    "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims".into(),
                ));
            } else if let (Some(before), Some(after)) = (size(old), size(new))
                && after < before
            {
                causes.push((
                    "spec.resources.requests.storage".into(),
                    "FieldValueForbidden",
                    "Forbidden: field can not be less than previous value".into(),
                ));
            }
        }
        "Service" => {
            let old_ip = old["spec"]["clusterIP"].as_str().unwrap_or_default();
            let new_ip = new["spec"]["clusterIP"].as_str().unwrap_or_default();
            if !old_ip.is_empty() && old_ip != new_ip {
                causes.push((
                    "spec.clusterIP".into(),
                    "FieldValueInvalid",
                    format!("Invalid value: \"{new_ip}\": field is immutable"),
                ));
            }
        }
        "Secret" | "ConfigMap" if old["immutable"] == Value::Bool(true) => {
            for field in ["data", "stringData", "binaryData"] {
                if old.get(field) != new.get(field) {
                    causes.push((
                        field.into(),
                        "FieldValueForbidden",
                        "Forbidden: field is immutable when `immutable` is set".into(),
                    ));
                }
            }
            if new["immutable"] != Value::Bool(true) {
                causes.push((
                    "immutable".into(),
                    "FieldValueForbidden",
                    "Forbidden: field is immutable when `immutable` is set".into(),
                ));
            }
        }
        _ => {}
    }
    for field in ["namespace", "uid", "creationTimestamp"] {
        let (before, after) = (&old["metadata"][field], &new["metadata"][field]);
        if !after.is_null() && before != after {
            causes.push((
                format!("metadata.{field}"),
                "FieldValueInvalid",
                format!("Invalid value: {after}: field is immutable"),
            ));
        }
    }
    causes
}
