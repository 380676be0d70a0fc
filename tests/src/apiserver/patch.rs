//! The patch types an API server accepts, other than apply: JSON merge patch
//! (RFC 7386), JSON patch (RFC 6902) and an approximation of strategic merge
//! patch (merge keys for the lists of built-ins the project writes).

use serde_json::Value;

/// Which patch a request carries, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a merge, JSON or strategic merge patch to `target`.
pub fn apply_patch(target: &Value, kind: PatchType, patch: &Value) -> Result<Value, String> {
    let mut out = target.clone();
    match kind {
        PatchType::Merge => json_patch::merge(&mut out, patch),
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| format!("invalid JSON patch: {e}"))?;
            json_patch::patch(&mut out, &ops).map_err(|e| e.to_string())?;
        }
        PatchType::Strategic => strategic_merge(&mut out, patch, &mut Vec::new()),
        PatchType::Apply => return Err("apply is not a plain patch".into()),
    }
    Ok(out)
}

/// The merge key of a list of a built-in kind, by the list's field path
/// (the names, without indices), or `None` for an atomic list.
pub fn merge_key(path: &[String]) -> Option<&'static str> {
    let last = path.last()?.as_str();
    let parent = path.len().checked_sub(2).map(|i| path[i].as_str());
    Some(match last {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "hostAliases" => match last {
            "hostAliases" => "ip",
            _ => "name",
        },
        "ports" if matches!(parent, Some("containers" | "initContainers")) => "containerPort",
        "ports" => "port",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

fn strategic_merge(target: &mut Value, patch: &Value, path: &mut Vec<String>) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(target_map) = target else {
        return;
    };
    for (key, value) in patch_map {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        path.push(key.clone());
        match (target_map.get_mut(key), value) {
            (Some(existing @ Value::Object(_)), Value::Object(_)) => {
                strategic_merge(existing, value, path)
            }
            (Some(Value::Array(existing)), Value::Array(items)) => {
                if let Some(merge_key) = merge_key(path) {
                    merge_keyed_list(existing, items, merge_key, path);
                } else if key == "finalizers" {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(item.clone());
                        }
                    }
                } else {
                    *existing = items.clone();
                }
            }
            _ => {
                let mut fresh = Value::Null;
                strategic_merge_new(&mut fresh, value);
                target_map.insert(key.clone(), fresh);
            }
        }
        path.pop();
    }
}

/// A value new to the target, with patch directives dropped.
fn strategic_merge_new(target: &mut Value, patch: &Value) {
    *target = match patch {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| {
                    let mut out = Value::Null;
                    strategic_merge_new(&mut out, v);
                    (k.clone(), out)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                .map(|i| {
                    let mut out = Value::Null;
                    strategic_merge_new(&mut out, i);
                    out
                })
                .collect(),
        ),
        other => other.clone(),
    };
}

fn merge_keyed_list(existing: &mut Vec<Value>, items: &[Value], key: &str, path: &mut Vec<String>) {
    for item in items {
        let Some(id) = item.get(key) else {
            existing.push(item.clone());
            continue;
        };
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match existing.iter().position(|e| e.get(key) == Some(id)) {
            Some(i) if delete => {
                existing.remove(i);
            }
            Some(i) => strategic_merge(&mut existing[i], item, path),
            None if delete => {}
            None => {
                let mut fresh = Value::Null;
                strategic_merge_new(&mut fresh, item);
                existing.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_keeps_containers_not_named_in_the_patch() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let out = apply_patch(
            &pod,
            PatchType::Strategic,
            &json!({"spec": {"containers": [{"name": "b", "image": "z"}]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "z"}]}})
        );
    }
}
