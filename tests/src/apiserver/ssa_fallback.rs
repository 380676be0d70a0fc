//! A local stand-in for `crate::ssa` (the server-side apply engine another
//! branch writes), with the same interface, so the server applies with real
//! field ownership until that engine is merged: managed fields per manager,
//! removal of fields a manager stops applying, conflicts and `force`.
//! Field sets are kept as paths (`f:spec`, `f:replicas`; list items as
//! `k:{"name":"x"}` or `v:"x"`) and stored in `metadata.managedFields` as
//! FieldsV1.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// How a list merges.
pub enum ListType {
    Atomic,
    Set,
    Map(Vec<String>),
}

pub trait Schema: Send + Sync {
    /// `path`: field names from the object root to the list, no indices.
    fn list_type(&self, path: &[String]) -> ListType;
}

#[derive(Debug)]
pub struct Conflict {
    pub manager: String,
    /// e.g. `.spec.replicas`
    pub field: String,
}

type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Fields an object's identity consists of: never owned, never removed.
fn is_identity(path: &[String]) -> bool {
    matches!(
        path.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice(),
        ["f:apiVersion"]
            | ["f:kind"]
            | ["f:metadata"]
            | [
                "f:metadata",
                "f:name"
                    | "f:namespace"
                    | "f:managedFields"
                    | "f:resourceVersion"
                    | "f:uid"
                    | "f:generation"
                    | "f:creationTimestamp"
            ]
    )
}

fn names_of(path: &[String]) -> Vec<String> {
    path.iter()
        .filter_map(|s| s.strip_prefix("f:").map(str::to_string))
        .collect()
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k).cloned().unwrap_or(Value::Null));
    }
    format!("k:{}", Value::Object(m))
}

fn fields_of(
    value: &Value,
    path: &mut Path,
    names: &mut Vec<String>,
    schema: &dyn Schema,
    out: &mut FieldSet,
) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                path.push(format!("f:{k}"));
                names.push(k.clone());
                if !is_identity(path) {
                    fields_of(v, path, names, schema, out);
                }
                names.pop();
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match schema.list_type(names) {
            ListType::Map(keys) => {
                for item in items {
                    path.push(item_key(item, &keys));
                    let mut dot = path.clone();
                    dot.push(".".into());
                    out.insert(dot);
                    fields_of(item, path, names, schema, out);
                    path.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    let mut p = path.clone();
                    p.push(format!("v:{item}"));
                    out.insert(p);
                }
            }
            ListType::Atomic => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

fn field_set(obj: &Value, schema: &dyn Schema) -> FieldSet {
    let mut out = FieldSet::new();
    let mut clean = obj.clone();
    if let Some(meta) = clean.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(map) = clean.as_object_mut() {
        map.remove("status");
    }
    fields_of(&clean, &mut Vec::new(), &mut Vec::new(), schema, &mut out);
    out.into_iter().filter(|p| !p.is_empty()).collect()
}

fn status_field_set(obj: &Value, schema: &dyn Schema) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(status) = obj.get("status") {
        let mut path = vec!["f:status".to_string()];
        let mut names = vec!["status".to_string()];
        fields_of(status, &mut path, &mut names, schema, &mut out);
    }
    out
}

/// The value at a field path, if present.
fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        if seg == "." {
            return Some(cur);
        }
        if let Some(name) = seg.strip_prefix("f:") {
            cur = cur.get(name)?;
        } else if let Some(key) = seg.strip_prefix("k:") {
            let want: Map<String, Value> = serde_json::from_str(key).ok()?;
            cur = cur
                .as_array()?
                .iter()
                .find(|item| want.iter().all(|(k, v)| item.get(k) == Some(v)))?;
        } else if let Some(v) = seg.strip_prefix("v:") {
            let want: Value = serde_json::from_str(v).ok()?;
            return cur.as_array()?.iter().find(|i| **i == want);
        }
    }
    Some(cur)
}

/// Removes the field at `path` (a list item for `k:…/.` or `v:…`).
fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    if last == "." {
        if let Some((item, list_path)) = parent_path.split_last()
            && let Some(key) = item.strip_prefix("k:")
            && let Ok(want) = serde_json::from_str::<Map<String, Value>>(key)
            && let Some(Value::Array(items)) = value_at_mut(obj, list_path)
        {
            items.retain(|i| !want.iter().all(|(k, v)| i.get(k) == Some(v)));
        }
        return;
    }
    let Some(parent) = value_at_mut(obj, parent_path) else {
        return;
    };
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(map) = parent.as_object_mut() {
            map.remove(name);
        }
    } else if let Some(v) = last.strip_prefix("v:")
        && let Ok(want) = serde_json::from_str::<Value>(v)
        && let Some(items) = parent.as_array_mut()
    {
        items.retain(|i| *i != want);
    }
}

fn value_at_mut<'a>(obj: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = obj;
    for seg in path {
        if let Some(name) = seg.strip_prefix("f:") {
            cur = cur.get_mut(name)?;
        } else if let Some(key) = seg.strip_prefix("k:") {
            let want: Map<String, Value> = serde_json::from_str(key).ok()?;
            cur = cur
                .as_array_mut()?
                .iter_mut()
                .find(|item| want.iter().all(|(k, v)| item.get(k) == Some(v)))?;
        }
    }
    Some(cur)
}

/// Merges an applied configuration into the live object.
fn merge_applied(live: &mut Value, applied: &Value, names: &mut Vec<String>, schema: &dyn Schema) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, v) in a {
                names.push(k.clone());
                match l.get_mut(k) {
                    Some(existing) => merge_applied(existing, v, names, schema),
                    None => {
                        l.insert(k.clone(), v.clone());
                    }
                }
                names.pop();
            }
        }
        (Value::Array(l), Value::Array(a)) => match schema.list_type(names) {
            ListType::Map(keys) => {
                for item in a {
                    let key = item_key(item, &keys);
                    match l.iter_mut().find(|i| item_key(i, &keys) == key) {
                        Some(existing) => merge_applied(existing, item, names, schema),
                        None => l.push(item.clone()),
                    }
                }
            }
            ListType::Set => {
                for item in a {
                    if !l.contains(item) {
                        l.push(item.clone());
                    }
                }
            }
            ListType::Atomic => *l = a.clone(),
        },
        (l, a) => *l = a.clone(),
    }
}

fn encode(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            cur = cur
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("field set nodes are objects");
        }
    }
    Value::Object(root)
}

fn decode(v: &Value, path: &mut Path, out: &mut FieldSet) {
    let Some(map) = v.as_object() else {
        return;
    };
    if map.is_empty() && !path.is_empty() {
        out.insert(path.clone());
    }
    for (k, child) in map {
        path.push(k.clone());
        decode(child, path, out);
        path.pop();
    }
}

struct Entry {
    manager: String,
    operation: String,
    subresource: Option<String>,
    api_version: String,
    time: String,
    fields: FieldSet,
}

fn entries(obj: Option<&Value>) -> Vec<Entry> {
    obj.and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            let mut fields = FieldSet::new();
            decode(&e["fieldsV1"], &mut Vec::new(), &mut fields);
            Entry {
                manager: e["manager"].as_str().unwrap_or_default().into(),
                operation: e["operation"].as_str().unwrap_or_default().into(),
                subresource: e["subresource"].as_str().map(str::to_string),
                api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
                time: e["time"].as_str().unwrap_or_default().into(),
                fields,
            }
        })
        .collect()
}

fn store_entries(obj: &mut Value, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": encode(&e.fields),
            });
            if let Some(sub) = e.subresource {
                v["subresource"] = sub.into();
            }
            v
        })
        .collect();
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]["managedFields"] = Value::Array(list);
}

/// `.spec.containers[name="etcd"].image`
fn render_field(path: &[String]) -> String {
    let mut out = String::new();
    for seg in path {
        if let Some(name) = seg.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = seg.strip_prefix("k:") {
            let inner: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let terms: Vec<String> = inner.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", terms.join(",")));
        } else if let Some(v) = seg.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        }
    }
    out
}

/// Server-side apply of `applied` by `manager` onto `live` (None = create).
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    schema: &dyn Schema,
    now: &str,
) -> Result<Value, Vec<Conflict>> {
    let new_set = field_set(applied, schema);
    let mut managed = entries(live);
    let mut conflicts = Vec::new();
    if let Some(live) = live {
        for entry in &mut managed {
            if entry.manager == manager && entry.operation == "Apply" {
                continue;
            }
            let clashing: Vec<Path> = entry
                .fields
                .intersection(&new_set)
                .filter(|p| value_at(live, p) != value_at(applied, p))
                .cloned()
                .collect();
            if force {
                for p in &clashing {
                    entry.fields.remove(p);
                }
            } else {
                conflicts.extend(clashing.iter().map(|p| Conflict {
                    manager: entry.manager.clone(),
                    field: render_field(p),
                }));
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    let previous: FieldSet = managed
        .iter()
        .filter(|e| e.manager == manager && e.operation == "Apply")
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let owned_by_others: FieldSet = managed
        .iter()
        .filter(|e| !(e.manager == manager && e.operation == "Apply"))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    // Fields this manager applied before and no longer applies are removed,
    // unless another manager owns them too. Deepest first.
    let mut removed: Vec<&Path> = previous
        .iter()
        .filter(|p| !new_set.contains(*p) && !owned_by_others.contains(*p))
        .collect();
    removed.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in removed {
        remove_at(&mut merged, path);
    }
    let mut applied_clean = applied.clone();
    if let Some(meta) = applied_clean
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        meta.remove("managedFields");
    }
    merge_applied(&mut merged, &applied_clean, &mut Vec::new(), schema);
    managed.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    managed.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        subresource: None,
        api_version: applied["apiVersion"].as_str().unwrap_or_default().into(),
        time: now.into(),
        fields: new_set,
    });
    store_entries(&mut merged, managed);
    Ok(merged)
}

/// Records ownership for a non-apply write by `manager`.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    schema: &dyn Schema,
    now: &str,
) {
    let set_of = |v: &Value| {
        if subresource == Some("status") {
            status_field_set(v, schema)
        } else {
            field_set(v, schema)
        }
    };
    let new_set = set_of(new);
    let changed: FieldSet = new_set
        .iter()
        .filter(|p| old.is_none_or(|o| value_at(o, p) != value_at(new, p)))
        .cloned()
        .collect();
    let mut managed = entries(old);
    for entry in &mut managed {
        entry
            .fields
            .retain(|p| !changed.contains(p) && value_at(new, p).is_some());
    }
    if !changed.is_empty() {
        match managed.iter_mut().find(|e| {
            e.manager == manager
                && e.operation == "Update"
                && e.subresource.as_deref() == subresource
        }) {
            Some(entry) => {
                entry.fields.extend(changed);
                entry.time = now.into();
            }
            None => managed.push(Entry {
                manager: manager.into(),
                operation: "Update".into(),
                subresource: subresource.map(str::to_string),
                api_version: new["apiVersion"].as_str().unwrap_or_default().into(),
                time: now.into(),
                fields: changed,
            }),
        }
    }
    store_entries(new, managed);
}

/// The API server's 409 Status for apply conflicts.
pub fn conflict_status(kind: &str, name: &str, conflicts: &[Conflict]) -> Value {
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| format!("conflict with \"{}\": {}", c.manager, c.field))
        .collect();
    let plural = if conflicts.len() == 1 { "" } else { "s" };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("Apply failed with {} conflict{plural}: {}", conflicts.len(), lines.join("\n")),
        "reason": "Conflict",
        "details": {
            "name": name, "kind": kind,
            "causes": conflicts.iter().map(|c| json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with \"{}\"", c.manager),
                "field": c.field,
            })).collect::<Vec<_>>(),
        },
        "code": 409,
    })
}

struct CrdSchema(Value);

impl Schema for CrdSchema {
    fn list_type(&self, path: &[String]) -> ListType {
        let mut node = &self.0;
        for name in path {
            if node.get("items").is_some() {
                node = &node["items"];
            }
            node = match node.pointer(&format!("/properties/{name}")) {
                Some(n) => n,
                None => return ListType::Atomic,
            };
        }
        match node["x-kubernetes-list-type"].as_str() {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map(
                node["x-kubernetes-list-map-keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect(),
            ),
            _ => ListType::Atomic,
        }
    }
}

/// List types from `x-kubernetes-list-type` of a CRD version's schema
/// (`openAPIV3Schema`).
pub fn schema_for_crd(crd_version_schema: &Value) -> Box<dyn Schema> {
    Box::new(CrdSchema(crd_version_schema.clone()))
}

struct Builtin;

impl Schema for Builtin {
    fn list_type(&self, path: &[String]) -> ListType {
        if path.last().is_some_and(|l| l == "finalizers") {
            return ListType::Set;
        }
        match super::patch::merge_key(path) {
            Some(key) => ListType::Map(vec![key.to_string()]),
            None => ListType::Atomic,
        }
    }
}

/// Known keyed lists of built-in kinds.
pub fn builtin_schema(_group: &str, _kind: &str) -> Box<dyn Schema> {
    Box::new(Builtin)
}

/// The names of the fields on a path, for schema lookups (exposed for tests).
pub fn field_names(path: &[String]) -> Vec<String> {
    names_of(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_apply_that_omits_a_field_removes_it() {
        let schema = Builtin;
        let first = apply(
            None,
            &json!({"spec": {"a": 1, "b": 2}}),
            "m",
            false,
            &schema,
            "t",
        )
        .unwrap();
        let second = apply(
            Some(&first),
            &json!({"spec": {"a": 1}}),
            "m",
            false,
            &schema,
            "t",
        )
        .unwrap();
        assert_eq!(second["spec"], json!({"a": 1}));
    }

    #[test]
    fn another_manager_conflicts_unless_forced() {
        let schema = Builtin;
        let first = apply(None, &json!({"spec": {"a": 1}}), "m", false, &schema, "t").unwrap();
        let clash = apply(
            Some(&first),
            &json!({"spec": {"a": 2}}),
            "other",
            false,
            &schema,
            "t",
        );
        assert_eq!(
            clash.err().map(|c| c[0].field.clone()),
            Some(".spec.a".into())
        );
        let forced = apply(
            Some(&first),
            &json!({"spec": {"a": 2}}),
            "other",
            true,
            &schema,
            "t",
        )
        .unwrap();
        assert_eq!(forced["spec"]["a"], 2);
    }
}
