//! Server-side apply as the API server does it, for the test API server.
//!
//! Pure: objects in, object (or conflicts) out. The test API server calls
//! [`apply`] for `application/apply-patch+yaml` requests and [`record_update`]
//! for every other write, so `metadata.managedFields` evolves as it would on a
//! real cluster and a field manager that stops applying a field loses it.
//!
//! Field sets are kept as a tree whose edges are fieldsV1 path elements:
//! `f:<name>` (object field), `k:{"name":"etcd"}` (item of an associative
//! list, by its keys), `v:<json>` (item of a set list). A node is *owned* when
//! the manager owns that field itself (a scalar, an atomic list, an empty
//! object, a list item); in fieldsV1 an owned node with children is written
//! with a `.` member.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// How a list merges and is owned, as `x-kubernetes-list-type` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole and owned as one field (the default for lists).
    Atomic,
    /// Scalars merged by value, each value owned on its own.
    Set,
    /// Objects merged by these key fields, each item and its fields owned.
    Map(Vec<String>),
}

/// The list types of one kind. `path` is the object field names from the
/// root; list items are transparent (`spec.template.spec.containers.env` is
/// `["spec","template","spec","containers","env"]`).
pub trait Schema: Send + Sync {
    fn list_type(&self, path: &[String]) -> ListType;
}

/// A field another manager owns with a different value than the one applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// The field as the API server prints it: `.spec.replicas`,
    /// `.spec.template.spec.containers[name="etcd"].image`.
    pub field: String,
}

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// Server-side apply of `applied` to the main resource by `manager`.
///
/// The manager owns exactly the fields of `applied` afterwards; the fields it
/// owned before and no longer applies are removed from the object unless
/// another manager still owns them. A field another manager owns with a
/// different value is a conflict unless `force` (then ownership moves). The
/// `status` of the object is not applied here (it belongs to the status
/// subresource, see [`apply_to`]).
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    schema: &dyn Schema,
    now: &str,
) -> Result<Value, Vec<Conflict>> {
    apply_to(live, applied, manager, None, force, schema, now)
}

/// [`apply`] to the main resource (`subresource: None`) or to a subresource
/// (`Some("status")`: only `status` is applied and owned).
pub fn apply_to(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    subresource: Option<&str>,
    force: bool,
    schema: &dyn Schema,
    now: &str,
) -> Result<Value, Vec<Conflict>> {
    let scope = Scope::of(subresource);
    let mut entries = live.map(read_entries).unwrap_or_default();
    let live_obj = live.cloned().unwrap_or_else(|| json!({}));
    let applied_set = object_set(applied, scope, schema);
    let own = entries
        .iter()
        .position(|e| e.is(manager, APPLY, subresource));

    // Conflicts: a field the applier sets to a value other than the live one
    // while another manager owns it.
    let mut conflicts: Vec<(usize, Vec<String>)> = Vec::new();
    for path in applied_set.members() {
        let Some(new) = get_at(applied, &path) else {
            continue;
        };
        if new.is_object() {
            // A list item or an empty object: its fields are compared one by one.
            continue;
        }
        match get_at(&live_obj, &path) {
            Some(old) if old != new => {}
            _ => continue,
        }
        for (i, entry) in entries.iter().enumerate() {
            if Some(i) != own && entry.fields.contains(&path) {
                conflicts.push((i, path.clone()));
            }
        }
    }
    if !conflicts.is_empty() {
        if !force {
            let mut out: Vec<Conflict> = conflicts
                .iter()
                .map(|(i, path)| Conflict {
                    manager: entries[*i].manager.clone(),
                    field: display_path(path),
                })
                .collect();
            out.dedup();
            return Err(out);
        }
        // Forced: the applier takes the fields over.
        for (i, path) in &conflicts {
            entries[*i].fields.disown(path);
        }
    }

    let previous = own.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let mut merged = live_obj;
    merge_scoped(&mut merged, applied, scope, schema);

    // Fields this manager stopped applying go, unless someone else holds them.
    for path in previous.members() {
        if applied_set.contains(&path) || applied_set.has_node(&path) {
            continue;
        }
        let held = entries
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != own && e.fields.has_node(&path));
        if held {
            continue;
        }
        remove_at(&mut merged, &path);
        prune_emptied(&mut merged, &path, |p| {
            applied_set.contains(p)
                || entries
                    .iter()
                    .enumerate()
                    .any(|(i, e)| Some(i) != own && e.fields.contains(p))
        });
    }

    let api_version = applied
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match own {
        Some(i) => {
            entries[i].fields = applied_set;
            entries[i].api_version = api_version;
            entries[i].time = now.to_string();
        }
        None => entries.push(Entry {
            manager: manager.to_string(),
            operation: APPLY.to_string(),
            subresource: subresource.map(str::to_string),
            api_version,
            time: now.to_string(),
            fields: applied_set,
        }),
    }
    write_entries(&mut merged, entries);
    Ok(merged)
}

/// Records a non-apply write (create, update, patch) by `manager`: it takes
/// ownership of every field it added or changed, which no other manager keeps;
/// fields the write removed are owned by nobody afterwards. `new` gets the
/// resulting `metadata.managedFields` (those of `old`; what the client sent is
/// ignored).
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    schema: &dyn Schema,
    now: &str,
) {
    let scope = Scope::of(subresource);
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_set = object_set(new, scope, schema);
    let mut changed = FieldSet::default();
    for path in new_set.members() {
        let Some(value) = get_at(new, &path) else {
            continue;
        };
        let before = old.and_then(|o| get_at(o, &path));
        let is_change = if value.is_object() {
            before.is_none()
        } else {
            before != Some(value)
        };
        if is_change {
            changed.insert(&path);
        }
    }
    let changed_paths = changed.members();
    for entry in &mut entries {
        for path in &changed_paths {
            entry.fields.disown(path);
        }
        // Fields that no longer exist are owned by nobody.
        for path in entry.fields.members() {
            if get_at(new, &path).is_none() {
                entry.fields.disown(&path);
            }
        }
    }
    if !changed_paths.is_empty() {
        let api_version = new
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match entries
            .iter_mut()
            .find(|e| e.is(manager, UPDATE, subresource))
        {
            Some(entry) => {
                for path in &changed_paths {
                    entry.fields.insert(path);
                }
                entry.api_version = api_version;
                entry.time = now.to_string();
            }
            None => entries.push(Entry {
                manager: manager.to_string(),
                operation: UPDATE.to_string(),
                subresource: subresource.map(str::to_string),
                api_version,
                time: now.to_string(),
                fields: changed,
            }),
        }
    }
    write_entries(new, entries);
}

/// The 409 Status the API server answers an apply with conflicts.
pub fn conflict_status(kind: &str, name: &str, conflicts: &[Conflict]) -> Value {
    let n = conflicts.len();
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let parts: Vec<String> = by_manager
        .iter()
        .map(|(manager, fields)| {
            if fields.len() == 1 {
                format!("conflict with \"{manager}\": {}", fields[0])
            } else {
                let list: Vec<String> = fields.iter().map(|f| format!("- {f}")).collect();
                format!("conflicts with \"{manager}\":\n{}", list.join("\n"))
            }
        })
        .collect();
    let message = format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        parts.join("\n")
    );
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with \"{}\"", c.manager),
                "field": c.field,
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Conflict",
        "details": { "name": name, "kind": kind, "causes": causes },
        "code": 409,
    })
}

/// List types read from a CRD version's `openAPIV3Schema`
/// (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`).
pub fn schema_for_crd(crd_version_schema: &Value) -> Box<dyn Schema> {
    Box::new(CrdSchema {
        root: crd_version_schema.clone(),
    })
}

/// List types of the built-in kinds the controller writes, as their OpenAPI
/// declares them (containers by name, ports by containerPort and protocol...).
pub fn builtin_schema(group: &str, kind: &str) -> Box<dyn Schema> {
    let mut lists: BTreeMap<String, ListType> = BTreeMap::new();
    let map = |keys: &[&str]| ListType::Map(keys.iter().map(|k| k.to_string()).collect());
    let pod_spec = match (group, kind) {
        ("", "Pod") => Some("spec"),
        ("apps", "StatefulSet" | "Deployment" | "DaemonSet" | "ReplicaSet") => {
            Some("spec.template.spec")
        }
        ("batch", "Job") => Some("spec.template.spec"),
        ("batch", "CronJob") => Some("spec.jobTemplate.spec.template.spec"),
        _ => None,
    };
    if let Some(prefix) = pod_spec {
        for (field, keys) in [
            ("containers", &["name"][..]),
            ("initContainers", &["name"]),
            ("ephemeralContainers", &["name"]),
            ("volumes", &["name"]),
            ("imagePullSecrets", &["name"]),
            ("hostAliases", &["ip"]),
            (
                "topologySpreadConstraints",
                &["topologyKey", "whenUnsatisfiable"],
            ),
        ] {
            lists.insert(format!("{prefix}.{field}"), map(keys));
        }
        for container in ["containers", "initContainers", "ephemeralContainers"] {
            let c = format!("{prefix}.{container}");
            lists.insert(format!("{c}.ports"), map(&["containerPort", "protocol"]));
            lists.insert(format!("{c}.env"), map(&["name"]));
            lists.insert(format!("{c}.volumeMounts"), map(&["mountPath"]));
            lists.insert(format!("{c}.volumeDevices"), map(&["devicePath"]));
        }
        lists.insert("status.conditions".into(), map(&["type"]));
    }
    match (group, kind) {
        ("", "Service") => {
            lists.insert("spec.ports".into(), map(&["port", "protocol"]));
        }
        ("", "PersistentVolumeClaim") | ("policy", "PodDisruptionBudget") => {
            lists.insert("status.conditions".into(), map(&["type"]));
        }
        _ => {}
    }
    Box::new(BuiltinSchema { lists })
}

/// Lists of `metadata`, the same in every kind.
fn metadata_list_type(path: &[String]) -> Option<ListType> {
    match path {
        [m, f] if m == "metadata" && f == "finalizers" => Some(ListType::Set),
        [m, f] if m == "metadata" && f == "ownerReferences" => {
            Some(ListType::Map(vec!["uid".into()]))
        }
        [m, ..] if m == "metadata" => Some(ListType::Atomic),
        _ => None,
    }
}

struct BuiltinSchema {
    lists: BTreeMap<String, ListType>,
}

impl Schema for BuiltinSchema {
    fn list_type(&self, path: &[String]) -> ListType {
        if let Some(t) = metadata_list_type(path) {
            return t;
        }
        self.lists
            .get(&path.join("."))
            .cloned()
            .unwrap_or(ListType::Atomic)
    }
}

struct CrdSchema {
    root: Value,
}

impl Schema for CrdSchema {
    fn list_type(&self, path: &[String]) -> ListType {
        if let Some(t) = metadata_list_type(path) {
            return t;
        }
        let mut node = &self.root;
        for name in path {
            // List items are transparent in the path.
            while let Some(items) = node.get("items") {
                node = items;
            }
            node = match node.get("properties").and_then(|p| p.get(name)) {
                Some(n) => n,
                None => match node.get("additionalProperties") {
                    Some(n) if n.is_object() => n,
                    _ => return ListType::Atomic,
                },
            };
        }
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map(
                node.get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|keys| {
                        keys.iter()
                            .filter_map(|k| k.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            _ => ListType::Atomic,
        }
    }
}

/// Which part of the object a write manages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Everything but `status`.
    Main,
    /// `status` only.
    Status,
}

impl Scope {
    fn of(subresource: Option<&str>) -> Scope {
        match subresource {
            Some("status") => Scope::Status,
            _ => Scope::Main,
        }
    }

    /// Whether a top-level field of the object is managed in this scope.
    /// `apiVersion` and `kind` identify the object and are owned by nobody.
    fn manages(self, field: &str) -> bool {
        match self {
            Scope::Main => !matches!(field, "apiVersion" | "kind" | "status"),
            Scope::Status => field == "status",
        }
    }
}

/// The metadata fields that have owners; the rest (name, uid,
/// resourceVersion, managedFields...) is the server's.
const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// A managedFields entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    subresource: Option<String>,
    api_version: String,
    time: String,
    fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let text = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    list.iter()
        .map(|e| Entry {
            manager: text(e, "manager").unwrap_or_default(),
            operation: text(e, "operation").unwrap_or_else(|| UPDATE.into()),
            subresource: text(e, "subresource").filter(|s| !s.is_empty()),
            api_version: text(e, "apiVersion").unwrap_or_default(),
            time: text(e, "time").unwrap_or_default(),
            fields: e
                .get("fieldsV1")
                .map(FieldSet::from_fields_v1)
                .unwrap_or_default(),
        })
        .collect()
}

fn write_entries(obj: &mut Value, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), e.manager.into());
            m.insert("operation".into(), e.operation.into());
            m.insert("apiVersion".into(), e.api_version.into());
            m.insert("time".into(), e.time.into());
            m.insert("fieldsType".into(), "FieldsV1".into());
            m.insert("fieldsV1".into(), e.fields.to_fields_v1());
            if let Some(s) = e.subresource {
                m.insert("subresource".into(), s.into());
            }
            Value::Object(m)
        })
        .collect();
    if !obj.is_object() {
        *obj = json!({});
    }
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// A set of field paths, as a tree of fieldsV1 path elements.
#[derive(Debug, Clone, Default, PartialEq)]
struct FieldSet {
    owned: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    fn from_fields_v1(v: &Value) -> FieldSet {
        let mut set = FieldSet::default();
        let Some(map) = v.as_object() else {
            return set;
        };
        if map.is_empty() {
            set.owned = true;
        }
        for (k, child) in map {
            if k == "." {
                set.owned = true;
            } else {
                set.children
                    .insert(k.clone(), FieldSet::from_fields_v1(child));
            }
        }
        set
    }

    fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.owned && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, child) in &self.children {
            m.insert(k.clone(), child.to_fields_v1());
        }
        Value::Object(m)
    }

    fn is_empty(&self) -> bool {
        !self.owned && self.children.is_empty()
    }

    /// Every owned path.
    fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.owned {
            out.push(prefix.clone());
        }
        for (k, child) in &self.children {
            prefix.push(k.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    fn node(&self, path: &[String]) -> Option<&FieldSet> {
        let mut node = self;
        for el in path {
            node = node.children.get(el)?;
        }
        Some(node)
    }

    fn contains(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| n.owned)
    }

    /// Whether the path or anything below it is owned.
    fn has_node(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| !n.is_empty())
    }

    fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for el in path {
            node = node.children.entry(el.clone()).or_default();
        }
        node.owned = true;
    }

    /// Drops ownership of the path itself (not of what is below it).
    fn disown(&mut self, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            self.owned = false;
            return;
        };
        if let Some(child) = self.children.get_mut(first) {
            child.disown(rest);
            if child.is_empty() {
                self.children.remove(first);
            }
        }
    }
}

/// The fields `obj` sets, in the given scope.
fn object_set(obj: &Value, scope: Scope, schema: &dyn Schema) -> FieldSet {
    let mut set = FieldSet::default();
    let Some(map) = obj.as_object() else {
        return set;
    };
    for (k, v) in map {
        if !scope.manages(k) || v.is_null() {
            continue;
        }
        if k == "metadata" {
            let Some(meta) = v.as_object() else { continue };
            for (mk, mv) in meta {
                if OWNED_METADATA.contains(&mk.as_str()) && !mv.is_null() {
                    let mut names = vec![k.clone(), mk.clone()];
                    let node = set
                        .children
                        .entry(format!("f:{k}"))
                        .or_default()
                        .children
                        .entry(format!("f:{mk}"))
                        .or_default();
                    value_set(mv, &mut names, schema, node);
                }
            }
            continue;
        }
        let mut names = vec![k.clone()];
        value_set(
            v,
            &mut names,
            schema,
            set.children.entry(format!("f:{k}")).or_default(),
        );
    }
    set
}

fn value_set(v: &Value, names: &mut Vec<String>, schema: &dyn Schema, node: &mut FieldSet) {
    match v {
        Value::Object(map) => {
            let mut any = false;
            for (k, child) in map {
                if child.is_null() {
                    continue;
                }
                any = true;
                names.push(k.clone());
                value_set(
                    child,
                    names,
                    schema,
                    node.children.entry(format!("f:{k}")).or_default(),
                );
                names.pop();
            }
            if !any {
                node.owned = true;
            }
        }
        Value::Array(items) => match schema.list_type(names) {
            ListType::Atomic => node.owned = true,
            _ if items.is_empty() => node.owned = true,
            ListType::Set => {
                for item in items {
                    node.children.entry(set_element(item)).or_default().owned = true;
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    let child = node.children.entry(key_element(item, &keys)).or_default();
                    child.owned = true;
                    value_set(item, names, schema, child);
                    // An item with no fields but its keys is still owned as an item.
                    child.owned = true;
                }
            }
        },
        _ => node.owned = true,
    }
}

fn set_element(item: &Value) -> String {
    format!("v:{item}")
}

/// `k:{"name":"etcd"}`: the item's key fields, sorted by name.
fn key_element(item: &Value, keys: &[String]) -> String {
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    let parts: Vec<String> = sorted
        .into_iter()
        .filter_map(|k| {
            item.get(k)
                .map(|v| format!("{}:{v}", Value::String(k.clone())))
        })
        .collect();
    format!("k:{{{}}}", parts.join(","))
}

/// Whether a list item matches a `k:` or `v:` path element.
fn item_matches(item: &Value, element: &str) -> bool {
    if let Some(keys) = element.strip_prefix("k:") {
        let Ok(Value::Object(keys)) = serde_json::from_str::<Value>(keys) else {
            return false;
        };
        keys.iter().all(|(k, v)| item.get(k) == Some(v))
    } else if let Some(value) = element.strip_prefix("v:") {
        serde_json::from_str::<Value>(value).is_ok_and(|v| &v == item)
    } else {
        false
    }
}

fn get_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut node = v;
    for el in path {
        node = match el.strip_prefix("f:") {
            Some(name) => node.as_object()?.get(name)?,
            None => node.as_array()?.iter().find(|i| item_matches(i, el))?,
        };
    }
    Some(node)
}

fn get_at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut node = v;
    for el in path {
        node = match el.strip_prefix("f:") {
            Some(name) => node.as_object_mut()?.get_mut(name)?,
            None => node
                .as_array_mut()?
                .iter_mut()
                .find(|i| item_matches(i, el))?,
        };
    }
    Some(node)
}

fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let Some(parent) = get_at_mut(v, parent) else {
        return;
    };
    match last.strip_prefix("f:") {
        Some(name) => {
            if let Some(map) = parent.as_object_mut() {
                map.remove(name);
            }
        }
        None => {
            if let Some(items) = parent.as_array_mut() {
                items.retain(|i| !item_matches(i, last));
            }
        }
    }
}

/// Removes the objects and lists a removal left empty, below the top level,
/// unless a manager owns them as they are.
fn prune_emptied(v: &mut Value, removed: &[String], owned: impl Fn(&[String]) -> bool) {
    for len in (2..removed.len()).rev() {
        let ancestor = &removed[..len];
        let empty = match get_at(v, ancestor) {
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        if !empty || owned(ancestor) {
            return;
        }
        remove_at(v, ancestor);
    }
}

/// Displays a path as the API server does in conflicts.
fn display_path(path: &[String]) -> String {
    let mut out = String::new();
    for el in path {
        if let Some(name) = el.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(keys) = el.strip_prefix("k:") {
            let parts: Vec<String> = match serde_json::from_str::<Value>(keys) {
                Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                _ => vec![keys.to_string()],
            };
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(value) = el.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        }
    }
    out
}

/// Merges the managed part of `applied` into `live`.
fn merge_scoped(live: &mut Value, applied: &Value, scope: Scope, schema: &dyn Schema) {
    let Some(applied) = applied.as_object() else {
        return;
    };
    if !live.is_object() {
        *live = json!({});
    }
    let Some(target) = live.as_object_mut() else {
        return;
    };
    for (k, v) in applied {
        if v.is_null() {
            continue;
        }
        if k == "metadata" {
            let Some(meta) = v.as_object() else { continue };
            let live_meta = target.entry("metadata").or_insert_with(|| json!({}));
            if !live_meta.is_object() {
                *live_meta = json!({});
            }
            let Some(live_meta) = live_meta.as_object_mut() else {
                continue;
            };
            for (mk, mv) in meta {
                if mv.is_null() || mk == "managedFields" {
                    continue;
                }
                if OWNED_METADATA.contains(&mk.as_str()) {
                    let mut names = vec![k.clone(), mk.clone()];
                    merge_value(
                        live_meta.entry(mk.clone()).or_insert(Value::Null),
                        mv,
                        &mut names,
                        schema,
                    );
                } else if !live_meta.contains_key(mk) {
                    // name / namespace of a created object.
                    live_meta.insert(mk.clone(), mv.clone());
                }
            }
        } else if matches!(k.as_str(), "apiVersion" | "kind") {
            target.insert(k.clone(), v.clone());
        } else if scope.manages(k) {
            let mut names = vec![k.clone()];
            merge_value(
                target.entry(k.clone()).or_insert(Value::Null),
                v,
                &mut names,
                schema,
            );
        }
    }
}

fn merge_value(live: &mut Value, applied: &Value, names: &mut Vec<String>, schema: &dyn Schema) {
    match applied {
        Value::Object(map) => {
            if !live.is_object() {
                *live = json!({});
            }
            let Some(target) = live.as_object_mut() else {
                return;
            };
            for (k, v) in map {
                if v.is_null() {
                    continue;
                }
                names.push(k.clone());
                merge_value(
                    target.entry(k.clone()).or_insert(Value::Null),
                    v,
                    names,
                    schema,
                );
                names.pop();
            }
        }
        Value::Array(items) => {
            let list_type = schema.list_type(names);
            let Some(existing) = live
                .as_array_mut()
                .filter(|_| list_type != ListType::Atomic)
            else {
                *live = strip_nulls(applied);
                return;
            };
            match list_type {
                ListType::Atomic => {}
                ListType::Set => {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(strip_nulls(item));
                        }
                    }
                }
                ListType::Map(keys) => {
                    for item in items {
                        let element = key_element(item, &keys);
                        match existing.iter_mut().find(|i| item_matches(i, &element)) {
                            Some(target) => merge_value(target, item, names, schema),
                            None => existing.push(strip_nulls(item)),
                        }
                    }
                }
            }
        }
        other => *live = other.clone(),
    }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests;
