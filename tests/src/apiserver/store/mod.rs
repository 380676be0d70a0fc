//! The object store of a test API server and the verbs on it: get, list,
//! create, update, patch (merge, JSON, strategic, apply), delete with
//! preconditions, finalizers and garbage collection, the status and scale
//! subresources, and the event history watches are served from. Deletion
//! (preconditions, finalizers, namespaces, garbage collection) is its own
//! room, `delete`.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};

use super::crd_validation as validation;
use super::immutable;
use super::kinds::Kind;
use super::patch::{self, PatchType};
use super::selectors::{FieldSelector, LabelSelector};
use crate::ssa;

mod delete;

/// An error answer: HTTP code and the Status body.
#[derive(Debug, Clone)]
pub struct ApiError(pub u16, pub Value);

pub type ApiResult<T> = Result<T, ApiError>;

pub fn status(code: u16, reason: &str, message: String, details: Value) -> ApiError {
    ApiError(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code,
        }),
    )
}

pub fn bad_request(message: String) -> ApiError {
    status(400, "BadRequest", message, json!({}))
}

fn details(kind: &Kind, name: &str) -> Value {
    json!({ "name": name, "group": kind.group, "kind": kind.resource })
}

pub fn not_found(kind: &Kind, name: &str) -> ApiError {
    status(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", kind.qualified_resource()),
        details(kind, name),
    )
}

fn conflict(kind: &Kind, name: &str, why: &str) -> ApiError {
    status(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.qualified_resource()
        ),
        details(kind, name),
    )
}

fn stale(kind: &Kind, name: &str) -> ApiError {
    conflict(
        kind,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// The API server's 422 for field causes `(field, reason, message)`.
pub fn invalid(kind: &Kind, name: &str, causes: &[(String, String, String)]) -> ApiError {
    let rendered: Vec<String> = causes
        .iter()
        .map(|(field, _, message)| format!("{field}: {message}"))
        .collect();
    let summary = if rendered.len() == 1 {
        rendered[0].clone()
    } else {
        format!("[{}]", rendered.join(", "))
    };
    status(
        422,
        "Invalid",
        format!("{} \"{name}\" is invalid: {summary}", kind.qualified_kind()),
        json!({
            "name": name, "group": kind.group, "kind": kind.kind,
            "causes": causes.iter().map(|(field, reason, message)| json!({
                "reason": reason, "message": message, "field": field,
            })).collect::<Vec<_>>(),
        }),
    )
}

/// Which object a request is about.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: usize,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// A change, as watches see it.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: usize,
    pub namespace: String,
    /// ADDED, MODIFIED, DELETED.
    pub kind_of_change: &'static str,
    pub object: Value,
}

type Key = (usize, String, String);

/// Everything one API server stores.
pub struct Store {
    pub kinds: Vec<Kind>,
    objects: BTreeMap<Key, Value>,
    rv: u64,
    pub history: VecDeque<Event>,
    pub history_limit: usize,
    /// The newest resourceVersion dropped from the history: a watch must
    /// start at or after it.
    pub compacted: u64,
    /// Notified on every change (watches wake up and read the history).
    pub changed: tokio::sync::watch::Sender<u64>,
    next_ip: u32,
    /// Off: updates are validated without transition rules (`oldSelf`), as
    /// by an API server still serving CRDs of a release that lacked them.
    pub transition_rules: bool,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn random_suffix(len: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = h.finish();
    (0..len)
        .map(|_| {
            let c = alphabet[(n % alphabet.len() as u64) as usize] as char;
            n /= alphabet.len() as u64;
            c
        })
        .collect()
}

/// The object without what the server itself changes on every write, to
/// tell a no-op write from a change.
fn comparable(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        if let Some(Value::Array(fields)) = meta.get_mut("managedFields") {
            for f in fields {
                if let Some(f) = f.as_object_mut() {
                    f.remove("time");
                }
            }
        }
    }
    out
}

/// Everything outside metadata and status: a change bumps `generation`.
fn generation_relevant(obj: &Value) -> Value {
    match obj {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !["metadata", "status", "apiVersion", "kind"].contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

pub struct Query<'a>(pub &'a BTreeMap<String, String>);

impl Query<'_> {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn dry_run(&self) -> bool {
        self.get("dryRun").is_some_and(|v| v == "All")
    }
    fn manager(&self, user: &str) -> String {
        self.get("fieldManager")
            .map(str::to_string)
            .unwrap_or_else(|| user.rsplit(':').next().unwrap_or(user).to_string())
    }
}

impl Store {
    pub fn new(kinds: Vec<Kind>) -> Store {
        Store {
            kinds,
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            history_limit: 10_000,
            compacted: 0,
            changed: tokio::sync::watch::channel(1).0,
            next_ip: 10,
            transition_rules: true,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn key(&self, t: &Target, name: &str) -> Key {
        (
            t.kind,
            t.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    fn schema(&self, kind: &Kind) -> Box<dyn ssa::Schema> {
        match &kind.crd {
            Some(crd) => {
                let version = crd["spec"]["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"] == kind.version.as_str())
                    .map(|v| v["schema"]["openAPIV3Schema"].clone())
                    .unwrap_or_default();
                ssa::schema_for_crd(&version)
            }
            None => ssa::builtin_schema(&kind.group, &kind.kind),
        }
    }

    fn emit(&mut self, kind: usize, kind_of_change: &'static str, object: Value) {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.history.push_back(Event {
            rv: self.rv,
            kind,
            namespace,
            kind_of_change,
            object,
        });
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
        self.changed.send_replace(self.rv);
    }

    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    pub fn get(&self, t: &Target, name: &str) -> ApiResult<Value> {
        let kind = &self.kinds[t.kind];
        self.objects
            .get(&self.key(t, name))
            .cloned()
            .ok_or_else(|| not_found(kind, name))
    }

    /// Objects of the target's kind (and namespace) matching the query's selectors.
    pub fn select(&self, t: &Target, query: &Query) -> ApiResult<Vec<Value>> {
        let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
            .map_err(bad_request)?;
        let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default())
            .map_err(bad_request)?;
        Ok(self
            .objects
            .iter()
            .filter(|((k, ns, _), _)| {
                *k == t.kind && t.namespace.as_ref().is_none_or(|want| want == ns)
            })
            .map(|(_, v)| v)
            .filter(|o| labels.matches(o) && fields.matches(o))
            .cloned()
            .collect())
    }

    pub fn list(&self, t: &Target, query: &Query) -> ApiResult<Value> {
        let kind = &self.kinds[t.kind];
        Ok(json!({
            "kind": format!("{}List", kind.kind),
            "apiVersion": kind.api_version(),
            "metadata": { "resourceVersion": self.rv.to_string() },
            "items": self.select(t, query)?,
        }))
    }

    fn namespace_check(&self, t: &Target) -> ApiResult<()> {
        let Some(ns) = &t.namespace else {
            return Ok(());
        };
        let ns_kind = self
            .kinds
            .iter()
            .position(|k| k.group.is_empty() && k.resource == "namespaces");
        let Some(ns_kind) = ns_kind else {
            return Ok(());
        };
        match self.objects.get(&(ns_kind, String::new(), ns.clone())) {
            None => Err(status(
                404,
                "NotFound",
                format!("namespaces \"{ns}\" not found"),
                json!({ "name": ns, "kind": "namespaces" }),
            )),
            Some(obj) if obj["metadata"]["deletionTimestamp"].is_string() => Err(status(
                403,
                "Forbidden",
                format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
                json!({ "name": ns, "kind": "namespaces" }),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Validation of a custom resource (schema, CEL, transition rules),
    /// returning the object with unknown fields pruned.
    fn validate(
        &self,
        kind: &Kind,
        name: &str,
        obj: Value,
        old: Option<&Value>,
    ) -> ApiResult<Value> {
        if kind.crd.is_none() {
            return Ok(obj);
        }
        let old = if self.transition_rules { old } else { None };
        validation::validate(kind, &obj, old)
            .map_err(|errors| ApiError(422, validation::invalid_status(kind, name, &errors)))
    }

    pub fn create(
        &mut self,
        t: &Target,
        user: &str,
        body: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let kind = self.kinds[t.kind].clone();
        let mut obj = body;
        if !obj.is_object() {
            return Err(bad_request("the request body is not an object".into()));
        }
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
            && t.namespace.as_deref() != Some(body_ns)
            && kind.namespaced
        {
            return Err(bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let name = match obj["metadata"]["name"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match obj["metadata"]["generateName"].as_str() {
                Some(prefix) => format!("{prefix}{}", random_suffix(5)),
                None => {
                    return Err(invalid(
                        &kind,
                        "",
                        &[(
                            "metadata.name".into(),
                            "FieldValueRequired".into(),
                            "Required value: name or generateName is required".into(),
                        )],
                    ));
                }
            },
        };
        self.namespace_check(t)?;
        let key = self.key(t, &name);
        if self.objects.contains_key(&key) {
            return Err(status(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.qualified_resource()),
                details(&kind, &name),
            ));
        }
        obj["apiVersion"] = kind.api_version().into();
        obj["kind"] = kind.kind.clone().into();
        obj["metadata"]["name"] = name.clone().into();
        match &t.namespace {
            Some(ns) if kind.namespaced => obj["metadata"]["namespace"] = ns.clone().into(),
            _ => {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("namespace");
                }
            }
        }
        if kind.status
            && !matches!(
                kind.kind.as_str(),
                "Namespace" | "Pod" | "PersistentVolumeClaim"
            )
            && let Some(m) = obj.as_object_mut()
        {
            // The status subresource owns status: a create does not set it.
            m.remove("status");
        }
        match kind.kind.as_str() {
            "Namespace" => obj["status"] = json!({ "phase": "Active" }),
            "Service" if kind.group.is_empty() => {
                let ip = obj["spec"]["clusterIP"].as_str().unwrap_or_default();
                if ip.is_empty() {
                    self.next_ip += 1;
                    let ip = format!("10.96.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1);
                    obj["spec"]["clusterIP"] = ip.clone().into();
                    obj["spec"]["clusterIPs"] = json!([ip]);
                }
            }
            "Pod" if obj["status"]["phase"].is_null() => {
                obj["status"]["phase"] = "Pending".into();
            }
            _ => {}
        }
        let mut obj = self.validate(&kind, &name, obj, None)?;
        let ts = now();
        if query.0.get("__apply").is_none() {
            let schema = self.schema(&kind);
            ssa::record_update(
                None,
                &mut obj,
                &query.manager(user),
                None,
                schema.as_ref(),
                &ts,
            );
        }
        let meta = &mut obj["metadata"];
        if let Some(m) = meta.as_object_mut() {
            m.remove("deletionTimestamp");
        }
        meta["uid"] = uuid_like().into();
        meta["creationTimestamp"] = ts.into();
        meta["generation"] = 1.into();
        if query.dry_run() {
            return Ok(obj);
        }
        obj["metadata"]["resourceVersion"] = self.bump().into();
        self.objects.insert(key, obj.clone());
        self.emit(t.kind, "ADDED", obj.clone());
        Ok(obj)
    }

    #[allow(clippy::too_many_arguments)] // one write's whole context; a struct would only rename it
    /// Stores `new` over `old` (after every check a write passes), or
    /// deletes it when it is being deleted and its last finalizer went.
    fn commit(
        &mut self,
        t: &Target,
        name: &str,
        old: &Value,
        new: Value,
        user: &str,
        query: &Query,
        applied: bool,
    ) -> ApiResult<Value> {
        let kind = self.kinds[t.kind].clone();
        let sub = t.subresource.as_deref();
        let mut new = respect_status_subresource(&kind, sub, old, new);
        if let Some(body_name) = new["metadata"]["name"].as_str()
            && body_name != name
        {
            return Err(bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let causes = immutable::check_update(&kind.kind, old, &new);
        if !causes.is_empty() {
            let causes: Vec<(String, String, String)> = causes
                .into_iter()
                .map(|(f, r, m)| (f, r.to_string(), m))
                .collect();
            return Err(invalid(&kind, name, &causes));
        }
        new["apiVersion"] = kind.api_version().into();
        new["kind"] = kind.kind.clone().into();
        keep_server_metadata(old, &mut new);
        check_no_new_finalizers(&kind, name, old, &new)?;
        let mut new = self.validate(&kind, name, new, Some(old))?;
        let ts = now();
        if !applied {
            let schema = self.schema(&kind);
            ssa::record_update(
                Some(old),
                &mut new,
                &query.manager(user),
                sub,
                schema.as_ref(),
                &ts,
            );
        }
        if generation_relevant(&new) != generation_relevant(old) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            new["metadata"]["generation"] = g.into();
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if comparable(&new) == comparable(old) {
            // A no-op write changes nothing, not even the resourceVersion.
            return Ok(old.clone());
        }
        if query.dry_run() {
            return Ok(new);
        }
        let finalizers_gone = new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
        if new["metadata"]["deletionTimestamp"].is_string() && finalizers_gone {
            new["metadata"]["resourceVersion"] = self.bump().into();
            self.remove(t.kind, &self.key(t, name), new.clone(), "Background");
            return Ok(new);
        }
        new["metadata"]["resourceVersion"] = self.bump().into();
        self.objects.insert(self.key(t, name), new.clone());
        self.emit(t.kind, "MODIFIED", new.clone());
        Ok(new)
    }

    fn check_rv(&self, t: &Target, name: &str, old: &Value, sent: Option<&Value>) -> ApiResult<()> {
        match sent.and_then(Value::as_str) {
            Some(rv)
                if !rv.is_empty() && Some(rv) != old["metadata"]["resourceVersion"].as_str() =>
            {
                Err(stale(&self.kinds[t.kind], name))
            }
            _ => Ok(()),
        }
    }

    fn scale_of(&self, kind: &Kind, obj: &Value) -> ApiResult<Value> {
        let paths = kind
            .scale
            .as_ref()
            .ok_or_else(|| not_found(kind, obj["metadata"]["name"].as_str().unwrap_or_default()))?;
        let selector = match &paths.label_selector {
            Some(p) => obj.pointer(p).cloned().unwrap_or(Value::Null),
            None => obj
                .pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                        .into()
                })
                .unwrap_or(Value::Null),
        };
        let meta = &obj["metadata"];
        Ok(json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": { "replicas": obj.pointer(&paths.spec_replicas).cloned().unwrap_or(json!(0)) },
            "status": {
                "replicas": obj.pointer(&paths.status_replicas).cloned().unwrap_or(json!(0)),
                "selector": selector,
            },
        }))
    }

    /// GET of an object or its subresource.
    pub fn get_sub(&self, t: &Target, name: &str) -> ApiResult<Value> {
        let obj = self.get(t, name)?;
        match t.subresource.as_deref() {
            Some("scale") => self.scale_of(&self.kinds[t.kind], &obj),
            _ => Ok(obj),
        }
    }

    /// Writes a new scale's `spec.replicas` into the object.
    fn with_scale(&self, t: &Target, old: &Value, scale: &Value) -> ApiResult<Value> {
        let kind = &self.kinds[t.kind];
        let paths = kind.scale.as_ref().ok_or_else(|| not_found(kind, ""))?;
        let replicas = scale["spec"]["replicas"].clone();
        let mut new = old.clone();
        let mut cur = &mut new;
        let segments: Vec<&str> = paths
            .spec_replicas
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        for seg in &segments {
            if !cur.is_object() {
                *cur = json!({});
            }
            cur = &mut cur[*seg];
        }
        *cur = replicas;
        Ok(new)
    }

    pub fn update(
        &mut self,
        t: &Target,
        name: &str,
        user: &str,
        body: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let old = self.get(t, name)?;
        self.check_rv(t, name, &old, body.pointer("/metadata/resourceVersion"))?;
        let new = match t.subresource.as_deref() {
            Some("scale") => self.with_scale(t, &old, &body)?,
            _ => body,
        };
        let stored = self.commit(t, name, &old, new, user, query, false)?;
        self.answer_for(t, stored)
    }

    fn answer_for(&self, t: &Target, obj: Value) -> ApiResult<Value> {
        match t.subresource.as_deref() {
            Some("scale") => self.scale_of(&self.kinds[t.kind], &obj),
            _ => Ok(obj),
        }
    }

    pub fn patch(
        &mut self,
        t: &Target,
        name: &str,
        user: &str,
        kind_of_patch: PatchType,
        body: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let kind = self.kinds[t.kind].clone();
        if kind_of_patch == PatchType::Apply {
            return self.apply(t, name, user, body, query);
        }
        let old = self.get(t, name)?;
        if kind_of_patch != PatchType::Json {
            self.check_rv(t, name, &old, body.pointer("/metadata/resourceVersion"))?;
        }
        let new = match t.subresource.as_deref() {
            Some("scale") => {
                let scale = self.scale_of(&kind, &old)?;
                let patched =
                    patch::apply_patch(&scale, kind_of_patch, &body).map_err(bad_request)?;
                self.with_scale(t, &old, &patched)?
            }
            _ => patch::apply_patch(&old, kind_of_patch, &body)
                .map_err(|e| status(422, "Invalid", e, json!({})))?,
        };
        let stored = self.commit(t, name, &old, new, user, query, false)?;
        self.answer_for(t, stored)
    }

    fn apply(
        &mut self,
        t: &Target,
        name: &str,
        user: &str,
        body: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let kind = self.kinds[t.kind].clone();
        let Some(manager) = query.get("fieldManager") else {
            return Err(bad_request(
                "PATCH, application/apply-patch+yaml requires fieldManager to be set".into(),
            ));
        };
        let force = query.get("force").is_some_and(|v| v == "true");
        let mut applied = body;
        if !applied["metadata"].is_object() {
            applied["metadata"] = json!({});
        }
        applied["metadata"]["name"] = name.into();
        if t.subresource.is_none()
            && kind.status
            && let Some(m) = applied.as_object_mut()
        {
            m.remove("status");
        }
        let schema = self.schema(&kind);
        let old = self.objects.get(&self.key(t, name)).cloned();
        let ts = now();
        let merged = ssa::apply(old.as_ref(), &applied, manager, force, schema.as_ref(), &ts)
            .map_err(|conflicts| {
                ApiError(409, ssa::conflict_status(&kind.kind, name, &conflicts))
            })?;
        match old {
            None => {
                let mut q = query.0.clone();
                q.insert("__apply".into(), String::new());
                self.create(t, user, merged, &Query(&q))
            }
            Some(old) => {
                self.check_rv(t, name, &old, applied.pointer("/metadata/resourceVersion"))?;
                self.commit(t, name, &old, merged, user, query, true)
            }
        }
    }

    /// Events after `rv` for a watch of `t`, or `None` if `rv` is compacted.
    pub fn events_since(&self, t: &Target, rv: u64) -> Option<Vec<Event>> {
        if rv < self.compacted {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|e| {
                    e.rv > rv
                        && e.kind == t.kind
                        && t.namespace.as_ref().is_none_or(|ns| *ns == e.namespace)
                })
                .cloned()
                .collect(),
        )
    }
}

/// The status subresource owns `status`: a write to it changes only
/// status (the rest stays as stored); a write to an object of a kind with
/// the subresource keeps the stored status.
fn respect_status_subresource(
    kind: &Kind,
    sub: Option<&str>,
    old: &Value,
    mut new: Value,
) -> Value {
    match sub {
        Some("status") => {
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        _ if kind.status => match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        },
        _ => {}
    }
    new
}

/// The metadata the server owns stays as stored, whatever a write sends.
fn keep_server_metadata(old: &Value, new: &mut Value) {
    for field in [
        "uid",
        "creationTimestamp",
        "namespace",
        "name",
        "deletionTimestamp",
        "generation",
    ] {
        match old["metadata"].get(field) {
            Some(v) => new["metadata"][field] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
}

/// Finalizers may only be removed from an object being deleted.
fn check_no_new_finalizers(kind: &Kind, name: &str, old: &Value, new: &Value) -> ApiResult<()> {
    if !old["metadata"]["deletionTimestamp"].is_string() {
        return Ok(());
    }
    let before: Vec<Value> = old["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let after: Vec<Value> = new["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if after.iter().any(|f| !before.contains(f)) {
        return Err(invalid(
            kind,
            name,
            &[(
                "metadata.finalizers".into(),
                "FieldValueForbidden".into(),
                "Forbidden: no new finalizers can be added if the object is being deleted".into(),
            )],
        ));
    }
    Ok(())
}

fn uuid_like() -> String {
    let a = random_suffix(8);
    let b = random_suffix(12);
    format!("{a}-{}-{}-{}-{b}", &a[..4], &b[..4], &a[4..])
}
