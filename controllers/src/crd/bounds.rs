//! A bound on every string, list and map of the CRD schemas: each field a
//! tenant writes is input from an adversary on a shared management
//! cluster, so none is unbounded. A bound a type sets itself (a `maxLength`,
//! a `maxItems`, an `enum`) stands; every other one comes from the rules
//! below, by the field's name. They are generous for every value the
//! project or a platform writes, and small enough that the API server's
//! CEL cost estimates and the controller's own reads stay bounded.
//!
//! Strings (a list's items and a map's values go by the list's or map's
//! name):
//! - 253, a DNS subdomain: `name`, `*Name`, `namespace`, `*Namespace`,
//!   `kubeconfigSecret`;
//! - 317, a label key with its prefix: `key` (also a Secret's data key,
//!   at most 253);
//! - 63, a label value: the values of `labels`, `nodeSelector`,
//!   `matchLabels`;
//! - 2,048: URLs (`endpoint`, `*Endpoint`, `*Urls`);
//! - 32,768: `message`, `evidence` (as `metav1.Condition`'s message);
//! - 64: `sha256`, versions (`version`, `*Version`, `from`, `to`) and
//!   times (`*Time`, `*At`, `*Since`, and every `date-time`);
//! - 4,096: the values of `annotations`;
//! - 1,024 otherwise (an S3 object key's own limit).
//!
//! Lists: 10,000 for a rollout's `clusters`, `waves` and `exclude`, and
//! the `namespaces` it selects from; 256 for `materializedFields` and
//! `notCarried`; 32 for `conditions`; 64 otherwise. Maps: 64 entries.

use serde_json::{Map, Value};

/// Bounds every string, list and map of `schema` (an OpenAPI v3 schema as
/// JSON) that has none, by the rules of this module.
pub fn bound(schema: &mut Value) {
    bound_node(schema, "");
}

fn bound_node(node: &mut Value, name: &str) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    match object.get("type").and_then(Value::as_str) {
        Some("string") if !object.contains_key("enum") => {
            let format = object.get("format").and_then(Value::as_str);
            let max = string_bound(name, format);
            object.entry("maxLength").or_insert(max.into());
        }
        Some("array") => {
            object.entry("maxItems").or_insert(list_bound(name).into());
            if let Some(items) = object.get_mut("items") {
                bound_node(items, name);
            }
        }
        Some("object") => bound_object(object, name),
        _ => {}
    }
}

fn bound_object(object: &mut Map<String, Value>, name: &str) {
    if let Some(values) = object
        .get_mut("additionalProperties")
        .filter(|v| v.is_object())
    {
        bound_node(values, &format!("{name}{{}}"));
        object.entry("maxProperties").or_insert(MAP_BOUND.into());
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for (field, schema) in properties.iter_mut() {
            bound_node(schema, field);
        }
    }
}

/// Entries of a map.
pub const MAP_BOUND: u64 = 64;

/// The `maxLength` of a string field `name` (a map's values: `name{}`).
pub fn string_bound(name: &str, format: Option<&str>) -> u64 {
    let map_value = name.strip_suffix("{}");
    match map_value {
        Some("labels" | "nodeSelector" | "matchLabels") => return 63,
        Some("annotations") => return 4096,
        Some(_) => return 1024,
        None => {}
    }
    let ends = |suffix: &str| name.ends_with(suffix);
    if format == Some("date-time") || ends("Time") || ends("At") || ends("Since") {
        return 64;
    }
    match name {
        "name" | "namespace" | "kubeconfigSecret" => 253,
        "key" => 317,
        "message" | "evidence" => 32768,
        "sha256" | "version" | "from" | "to" => 64,
        "endpoint" => 2048,
        _ if ends("Name") || ends("Namespace") => 253,
        _ if ends("Endpoint") || ends("Urls") => 2048,
        _ if ends("Version") => 64,
        _ => 1024,
    }
}

/// The `maxItems` of a list field `name`.
pub fn list_bound(name: &str) -> u64 {
    match name {
        "clusters" | "waves" | "exclude" | "namespaces" => 10_000,
        "materializedFields" | "notCarried" => 256,
        "conditions" => 32,
        _ => 64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_list_and_map_gets_a_bound_and_a_types_own_stands() {
        let mut schema = serde_json::json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "clusterName": {"type": "string"},
                        "phase": {"type": "string", "enum": ["A", "B"]},
                        "sha256": {"type": "string", "maxLength": 64},
                        "version": {"type": "string", "maxLength": 255},
                        "members": {"type": "array", "maxItems": 7, "items": {"type": "string"}},
                        "clientUrls": {"type": "array", "items": {"type": "string"}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "objectKey": {"type": "string"},
                        "startedTime": {"type": "string", "format": "date-time"}
                    }
                }
            }
        });
        bound(&mut schema);
        let spec = &schema["properties"]["spec"]["properties"];
        assert_eq!(spec["clusterName"]["maxLength"], 253);
        assert!(
            spec["phase"].get("maxLength").is_none(),
            "an enum bounds itself"
        );
        assert_eq!(
            spec["version"]["maxLength"], 255,
            "a type's own bound stands"
        );
        assert_eq!(spec["members"]["maxItems"], 7);
        assert_eq!(spec["members"]["items"]["maxLength"], 1024);
        assert_eq!(spec["clientUrls"]["maxItems"], 64);
        assert_eq!(spec["clientUrls"]["items"]["maxLength"], 2048);
        assert_eq!(spec["labels"]["maxProperties"], 64);
        assert_eq!(spec["labels"]["additionalProperties"]["maxLength"], 63);
        assert_eq!(spec["objectKey"]["maxLength"], 1024);
        assert_eq!(spec["startedTime"]["maxLength"], 64);
    }
}
