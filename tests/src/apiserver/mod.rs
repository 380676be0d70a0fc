//! An in-memory Kubernetes API server for the test world, stricter than
//! kube-fake-client where the controller depends on it: RBAC from the
//! shipped `config/rbac` manifests, server-side apply with field ownership,
//! CRD validation hooks, immutable fields of built-ins, resourceVersion and
//! delete preconditions, finalizers and garbage collection, the status and
//! scale subresources, and list + watch with a bounded event history (410
//! Gone for a compacted resourceVersion), so kube-runtime's reflectors and
//! `Controller` run against it.
//!
//! It is served two ways: in-process ([`ApiServer::client_as`], a
//! `kube::Client` whose requests carry a fixed identity) and over HTTPS on
//! `127.0.0.1:<random port>` with bearer tokens ([`ApiServer::kubeconfig`]).
//! Both go through the same handler, so both are authorized and recorded
//! the same way. Requests of the [`ADMIN`] identity (tests, the workload
//! runtime) bypass RBAC and are not recorded.

pub mod crd_validation;
pub mod immutable;
pub mod kinds;
pub mod patch;
pub mod rbac;
pub mod recorder;
pub mod selectors;
mod serve;
mod slow;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use kube::Client;
use serde_json::{Value, json};
use tokio::sync::mpsc::Sender;

use kinds::Kind;
use patch::PatchType;
use rbac::{Attributes, Rbac};
use recorder::{ApiOp, OpRecorder};
use store::{ApiError, Query, Store, Target, bad_request, status};

/// The identity that bypasses RBAC (tests and the workload runtime).
pub const ADMIN: &str = "system:admin";

/// The `cluster` of operations on the management API.
pub const MANAGEMENT: &str = "management";

/// The controller's ServiceAccount, as the shipped ClusterRoleBinding names it.
pub const CONTROLLER_USER: &str = "system:serviceaccount:etcdfleet-system:etcdfleet-controller";

/// The body of every response.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// Handles an upgrading request (`pods/<name>/portforward`), after RBAC.
pub type UpgradeHandler = Arc<
    dyn Fn(
            http::Request<hyper::body::Incoming>,
            String,
            String,
        ) -> BoxFuture<'static, http::Response<Full<Bytes>>>
        + Send
        + Sync,
>;

/// What another writer does just before a user's first write to a
/// resource: the race between a controller's read and its write, made
/// certain.
struct BeforeWrite {
    user: String,
    resource: String,
    run: BoxFuture<'static, ()>,
}

pub(crate) struct Inner {
    name: String,
    store: Mutex<Store>,
    rbac: Mutex<Rbac>,
    tokens: Mutex<BTreeMap<String, String>>,
    unavailable: Mutex<BTreeSet<String>>,
    /// Users whose writes are never answered (a server that hangs).
    hanging_writes: Mutex<BTreeSet<String>>,
    recorder: Mutex<Option<OpRecorder>>,
    /// Runs once before the first write of a user to a resource
    /// ([`ApiServer::before_first_write`]).
    before_write: Mutex<Option<BeforeWrite>>,
    portforward: Mutex<Option<UpgradeHandler>>,
    /// Every request RBAC refused (403), as `user: verb resource ...`.
    denied: Mutex<Vec<String>>,
}

/// One API server. Cheap to clone; the HTTPS listener stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
    serving: Arc<serve::Serving>,
}

pub(crate) fn body(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed_unsync()
}

fn json_response(code: u16, value: &Value) -> http::Response<ResponseBody> {
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body(value.to_string()))
        .expect("static response parts")
}

fn error_response(e: ApiError) -> http::Response<ResponseBody> {
    json_response(e.0, &e.1)
}

fn query_map(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The RBAC verb of a request.
fn rbac_verb(method: &http::Method, t: &Target, watch: bool) -> &'static str {
    match (method.as_str(), t.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

impl Inner {
    /// Maps a path onto a served kind: `/api/v1/...`, `/apis/<g>/<v>/...`.
    fn target(&self, path: &str) -> Option<Target> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segments.first() {
            Some(&"api") => ("", segments.get(1..)?),
            Some(&"apis") => (*segments.get(1)?, segments.get(2..)?),
            _ => return None,
        };
        let version = *rest.first()?;
        let rest = &rest[1..];
        let (namespace, resource, name, sub) = if rest.first() == Some(&"namespaces")
            && rest.len() >= 3
            && !(rest.len() == 3 && group.is_empty() && ["status", "finalize"].contains(&rest[2]))
        {
            (Some(rest[1]), rest[2], rest.get(3), rest.get(4))
        } else {
            (None, *rest.first()?, rest.get(1), rest.get(2))
        };
        let store = self.store.lock().expect("store lock");
        let kind = store
            .kinds
            .iter()
            .position(|k| k.serves(group, version, resource))?;
        Some(Target {
            kind,
            namespace: namespace.map(str::to_string),
            name: name.map(|s| s.to_string()),
            subresource: sub.map(|s| s.to_string()),
        })
    }

    fn kind(&self, t: &Target) -> Kind {
        self.store.lock().expect("store lock").kinds[t.kind].clone()
    }

    fn record(&self, user: &str, parts: &http::request::Parts, bytes: &[u8], rejected: bool) {
        if user == ADMIN {
            return;
        }
        if let Some(recorder) = self.recorder.lock().expect("recorder lock").as_ref() {
            recorder.push(ApiOp::from_request(&self.name, parts, bytes, rejected));
        }
    }

    /// The hook for `user`'s write to `path`, taken (it runs once).
    fn take_before_write(&self, user: &str, path: &str) -> Option<BoxFuture<'static, ()>> {
        let mut hook = self.before_write.lock().expect("lock");
        let matches = hook.as_ref().is_some_and(|h| {
            h.user == user && path.split('/').any(|segment| segment == h.resource)
        });
        matches.then(|| hook.take().map(|h| h.run)).flatten()
    }

    fn unavailable_for(&self, user: &str) -> bool {
        self.unavailable.lock().expect("lock").contains(user)
    }

    /// Authentication aside, the whole request path: record, outage,
    /// routing, RBAC, the verb.
    pub(crate) async fn handle(
        self: &Arc<Self>,
        user: &str,
        parts: &http::request::Parts,
        bytes: Bytes,
    ) -> http::Response<ResponseBody> {
        let rejected = self.unavailable_for(user);
        self.record(user, parts, &bytes, rejected);
        if parts.method != http::Method::GET
            && let Some(run) = self.take_before_write(user, parts.uri.path())
        {
            run.await;
        }
        if parts.method != http::Method::GET
            && self.hanging_writes.lock().expect("lock").contains(user)
        {
            return std::future::pending().await;
        }
        if rejected {
            return error_response(status(
                503,
                "ServiceUnavailable",
                format!(
                    "the server is currently unable to handle the request (injected outage of {})",
                    self.name
                ),
                json!({}),
            ));
        }
        let path = parts.uri.path();
        if ["/version", "/healthz", "/readyz", "/livez"].contains(&path) {
            return json_response(
                200,
                &json!({ "major": "1", "minor": "32", "gitVersion": "v1.32.0-etcdfleet-test" }),
            );
        }
        let Some(t) = self.target(path) else {
            return error_response(status(
                404,
                "NotFound",
                "the server could not find the requested resource".into(),
                json!({}),
            ));
        };
        let query = query_map(parts.uri.query());
        let watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
        let kind = self.kind(&t);
        if let Err(e) = self.authorize(user, &parts.method, &t, &kind, watch) {
            return error_response(e);
        }
        if kind.namespaced != t.namespace.is_some() && t.name.is_some() {
            return error_response(status(
                404,
                "NotFound",
                "the server could not find the requested resource".into(),
                json!({}),
            ));
        }
        if watch {
            return self.watch(&t, &query);
        }
        match self.dispatch(user, parts, &t, &query, &bytes) {
            Ok((code, value)) => json_response(code, &value),
            Err(e) => error_response(e),
        }
    }

    fn authorize(
        &self,
        user: &str,
        method: &http::Method,
        t: &Target,
        kind: &Kind,
        watch: bool,
    ) -> Result<(), ApiError> {
        if user == ADMIN {
            return Ok(());
        }
        let attrs = Attributes {
            user: user.to_string(),
            verb: rbac_verb(method, t, watch).into(),
            group: kind.group.clone(),
            resource: kind.resource.clone(),
            subresource: t.subresource.clone(),
            // As kube-apiserver's request info: a request for one
            // namespace (`/api/v1/namespaces/<ns>`) is in that namespace,
            // so a Role there can grant it.
            namespace: match (
                &t.namespace,
                kind.group.is_empty() && kind.resource == "namespaces",
            ) {
                (None, true) => t.name.clone(),
                (ns, _) => ns.clone(),
            },
            name: t.name.clone(),
        };
        if self.rbac.lock().expect("rbac lock").allows(&attrs) {
            Ok(())
        } else {
            Err(self.deny(&attrs))
        }
    }

    /// The 403 for `attrs`, remembered for [`ApiServer::denied`].
    pub(crate) fn deny(&self, attrs: &Attributes) -> ApiError {
        let status = rbac::forbidden(attrs);
        let message = status["message"].as_str().unwrap_or_default().to_string();
        self.denied.lock().expect("denied lock").push(message);
        ApiError(403, status)
    }

    fn dispatch(
        &self,
        user: &str,
        parts: &http::request::Parts,
        t: &Target,
        query: &BTreeMap<String, String>,
        bytes: &[u8],
    ) -> Result<(u16, Value), ApiError> {
        let q = Query(query);
        let parse = |bytes: &[u8]| -> Result<Value, ApiError> {
            if bytes.is_empty() {
                return Ok(json!({}));
            }
            serde_json::from_slice(bytes)
                .or_else(|_| etcdfleet_api::yaml::from_slice(bytes))
                .map_err(|e| bad_request(format!("the request body is not valid: {e}")))
        };
        let asked = std::time::Instant::now();
        let mut store = self.store.lock().expect("store lock");
        let _held = slow::SlowRequest::new(parts, asked);
        let name = t.name.clone();
        match (parts.method.as_str(), name) {
            ("GET", Some(name)) => Ok((200, store.get_sub(t, &name)?)),
            ("GET", None) => Ok((200, store.list(t, &q)?)),
            ("POST", None) => Ok((201, store.create(t, user, parse(bytes)?, &q)?)),
            ("PUT", Some(name)) => Ok((200, store.update(t, &name, user, parse(bytes)?, &q)?)),
            ("PATCH", Some(name)) => {
                let ct = parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let kind_of_patch = PatchType::from_content_type(ct).ok_or_else(|| {
                    status(
                        415,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
                        json!({}),
                    )
                })?;
                let created = kind_of_patch == PatchType::Apply && store.get(t, &name).is_err();
                let out = store.patch(t, &name, user, kind_of_patch, parse(bytes)?, &q)?;
                Ok((if created { 201 } else { 200 }, out))
            }
            ("DELETE", Some(name)) => Ok((200, store.delete(t, &name, &parse(bytes)?, &q)?)),
            ("DELETE", None) => Ok((200, store.delete_collection(t, &parse(bytes)?, &q)?)),
            (method, _) => Err(status(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
                json!({}),
            )),
        }
    }

    /// A watch: events after the requested resourceVersion (or the current
    /// objects as ADDED when none is given), then live changes; an ERROR
    /// event with 410 Gone when the version is compacted, as the API server
    /// answers; BOOKMARKs when asked for; ends after `timeoutSeconds`.
    fn watch(
        self: &Arc<Self>,
        t: &Target,
        query: &BTreeMap<String, String>,
    ) -> http::Response<ResponseBody> {
        let q = Query(query);
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let requested = q
            .get("resourceVersion")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let start = match self.watch_start(t, &q, requested) {
            Ok(start) => start,
            Err(answer) => return *answer,
        };
        let live = LiveWatch {
            inner: self.clone(),
            target: t.clone(),
            kind: start.kind,
            labels: selectors::LabelSelector::parse(q.get("labelSelector").unwrap_or_default())
                .unwrap_or_default(),
            fields: selectors::FieldSelector::parse(q.get("fieldSelector").unwrap_or_default())
                .unwrap_or_default(),
            bookmarks,
            seen: start.rv,
            changed: start.changed,
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
        tokio::spawn(live.send(start.initial, timeout, tx));
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(http_body::Frame::data(b)), rx))
        });
        http::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::StreamBody::new(stream).boxed_unsync())
            .expect("static response parts")
    }

    /// What a watch starts from, read under one store lock: the current
    /// objects (no version asked for) or the events after `requested`. A
    /// compacted version, or a list the store refuses, is the whole answer.
    fn watch_start(
        &self,
        t: &Target,
        q: &Query,
        requested: u64,
    ) -> Result<WatchStart, Box<http::Response<ResponseBody>>> {
        let store = self.store.lock().expect("store lock");
        let kind = store.kinds[t.kind].clone();
        let initial: Vec<Value> = if requested == 0 {
            match store.select(t, q) {
                Ok(items) => items
                    .into_iter()
                    .map(|o| json!({ "type": "ADDED", "object": o }))
                    .collect(),
                Err(e) => return Err(Box::new(error_response(e))),
            }
        } else {
            match store.events_since(t, requested) {
                Some(events) => events
                    .into_iter()
                    .map(|e| json!({ "type": e.kind_of_change, "object": e.object }))
                    .collect(),
                None => vec![json!({ "type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {requested} ({})", store.compacted + 1),
                    "reason": "Expired", "code": 410,
                }})],
            }
        };
        let gone = initial.iter().any(|e| e["type"] == "ERROR");
        let rv = if requested == 0 {
            store.resource_version()
        } else {
            store.resource_version().max(requested)
        };
        if gone {
            let lines: String = initial.iter().map(|e| format!("{e}\n")).collect();
            return Err(Box::new(
                http::Response::builder()
                    .status(200)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(body(lines))
                    .expect("static response parts"),
            ));
        }
        Ok(WatchStart {
            initial,
            rv,
            changed: store.changed.subscribe(),
            kind,
        })
    }
}

/// Where a watch starts: its first events, the resourceVersion they bring
/// it to, and the store's change signal.
struct WatchStart {
    initial: Vec<Value>,
    rv: u64,
    changed: tokio::sync::watch::Receiver<u64>,
    kind: Kind,
}

/// The live half of a watch: the store's events after `seen` that match its
/// selectors, and bookmarks when asked for.
struct LiveWatch {
    inner: Arc<Inner>,
    target: Target,
    kind: Kind,
    labels: selectors::LabelSelector,
    fields: selectors::FieldSelector,
    bookmarks: bool,
    seen: u64,
    changed: tokio::sync::watch::Receiver<u64>,
}

impl LiveWatch {
    /// Sends `initial`, then every change, until `timeout` passes or the
    /// client goes; a version compacted meanwhile ends it with 410 Gone.
    async fn send(mut self, initial: Vec<Value>, timeout: Duration, tx: Sender<Bytes>) {
        let deadline = tokio::time::Instant::now() + timeout;
        // The objects this watch has shown as matching its selectors: one
        // that stops matching is sent as DELETED, one that starts as ADDED,
        // as the API server's watch cache does.
        let mut members = BTreeSet::new();
        for e in initial {
            let Some(line) = self.filtered(&mut members, &e["type"], &e["object"]) else {
                continue;
            };
            if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
                r = self.changed.changed() => if r.is_err() { return },
                _ = tick.tick() => {
                    if self.bookmarks {
                        let line = json!({ "type": "BOOKMARK", "object": {
                            "kind": self.kind.kind, "apiVersion": self.kind.api_version(),
                            "metadata": { "resourceVersion": self.seen.to_string() },
                        }});
                        if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
            }
            let events = {
                let store = self.inner.store.lock().expect("store lock");
                store.events_since(&self.target, self.seen)
            };
            let Some(events) = events else {
                let line = json!({ "type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {}", self.seen), "reason": "Expired", "code": 410,
                }});
                let _ = tx.send(Bytes::from(format!("{line}\n"))).await;
                return;
            };
            for e in events {
                self.seen = e.rv;
                let change = Value::from(e.kind_of_change);
                let Some(line) = self.filtered(&mut members, &change, &e.object) else {
                    continue;
                };
                if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() {
                    return;
                }
            }
        }
    }

    /// The event this watch sends for a change of `object`, if any (see
    /// `members` in [`Self::send`]).
    fn filtered(
        &self,
        members: &mut BTreeSet<String>,
        change: &Value,
        object: &Value,
    ) -> Option<Value> {
        let key = format!(
            "{}/{}",
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        let matches = self.labels.matches(object) && self.fields.matches(object);
        let change = match (matches, change.as_str(), members.contains(&key)) {
            (true, Some("DELETED"), _) => {
                members.remove(&key);
                "DELETED"
            }
            (true, Some(change), known) => {
                members.insert(key);
                if known { change } else { "ADDED" }
            }
            (false, Some("DELETED"), _) | (false, _, false) => {
                members.remove(&key);
                return None;
            }
            (false, _, true) => {
                members.remove(&key);
                "DELETED"
            }
            (true, None, _) => return None,
        };
        Some(json!({ "type": change, "object": object }))
    }
}

fn base64(bytes: &[u8]) -> String {
    // k8s-openapi's ByteString serializes as base64: no extra crate needed.
    match serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())) {
        Ok(Value::String(s)) => s,
        _ => unreachable!("ByteString serializes to a string"),
    }
}

fn unauthorized() -> http::Response<ResponseBody> {
    error_response(status(
        401,
        "Unauthorized",
        "Unauthorized".into(),
        json!({}),
    ))
}

/// `pods/<name>/portforward` of namespace `<ns>`, if the path is one.
fn portforward_target(path: &str) -> Option<(String, String)> {
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match s.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", pod, "portforward"] => {
            Some((ns.to_string(), pod.to_string()))
        }
        _ => None,
    }
}

/// A request that came over HTTPS: its bearer token names the user;
/// `pods/<name>/portforward` is authorized here and handed to the upgrade
/// handler, everything else is read whole and goes to [`Inner::handle`].
async fn serve_https_request(
    inner: Arc<Inner>,
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<ResponseBody> {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let user = token.and_then(|t| inner.tokens.lock().expect("tokens lock").get(&t).cloned());
    let Some(user) = user else {
        return unauthorized();
    };
    if let Some((ns, pod)) = portforward_target(request.uri().path()) {
        let attrs = Attributes {
            user: user.clone(),
            verb: "create".into(),
            group: String::new(),
            resource: "pods".into(),
            subresource: Some("portforward".into()),
            namespace: Some(ns.clone()),
            name: Some(pod.clone()),
        };
        if user != ADMIN && !inner.rbac.lock().expect("rbac lock").allows(&attrs) {
            return error_response(inner.deny(&attrs));
        }
        let handler = inner.portforward.lock().expect("lock").clone();
        return match handler {
            Some(handler) => handler(request, ns, pod).await.map(|b| b.boxed_unsync()),
            None => error_response(status(
                501,
                "NotImplemented",
                "port-forward is not served by this test API server (no handler set)".into(),
                json!({}),
            )),
        };
    }
    let (parts, incoming) = request.into_parts();
    let bytes = match incoming.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return http::Response::builder()
                .status(400)
                .body(body(Bytes::from(e.to_string())))
                .expect("static response parts");
        }
    };
    inner.handle(&user, &parts, bytes).await
}

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

impl ApiServer {
    /// An API server named `name` (the `cluster` of its recorded operations)
    /// serving the built-in kinds, every CRD of the shipped `config/crd/`,
    /// with the RBAC of the YAML files of `rbac_dirs`, listening on HTTPS.
    pub async fn start(name: &str, rbac_dirs: &[&Path]) -> Result<ApiServer> {
        // Two rustls providers are in the test build (ring through kube,
        // aws-lc through a dev-dependency): clients need one chosen.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let mut all = kinds::builtins();
        for crd in kinds::load_crds(&kinds::config_dir().join("crd"))? {
            all.extend(kinds::from_crd(&crd));
        }
        let mut rbac = Rbac::default();
        // Namespaces the RBAC bundles create (the workload RBAC ships the
        // etcd namespace its Role lives in), as `kubectl apply -k` would.
        let mut bundled_namespaces = Vec::new();
        for dir in rbac_dirs {
            let docs = kinds::yaml_documents(dir)?;
            bundled_namespaces.extend(
                docs.iter()
                    .filter(|d| d["kind"] == "Namespace")
                    .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string)),
            );
            rbac.add_documents(&docs);
        }
        let mut store = Store::new(all);
        // The namespaces every cluster starts with.
        let ns_kind = store
            .kinds
            .iter()
            .position(|k| k.group.is_empty() && k.resource == "namespaces")
            .expect("namespaces are a built-in kind");
        let defaults = ["default", "kube-system", "kube-public", "kube-node-lease"];
        for ns in defaults
            .iter()
            .copied()
            .chain(bundled_namespaces.iter().map(String::as_str))
        {
            let t = Target {
                kind: ns_kind,
                namespace: None,
                name: None,
                subresource: None,
            };
            let empty = BTreeMap::new();
            store
                .create(
                    &t,
                    ADMIN,
                    json!({ "metadata": { "name": ns } }),
                    &Query(&empty),
                )
                .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {}", e.1))?;
        }
        let inner = Arc::new(Inner {
            name: name.to_string(),
            store: Mutex::new(store),
            rbac: Mutex::new(rbac),
            tokens: Mutex::new(BTreeMap::new()),
            unavailable: Mutex::new(BTreeSet::new()),
            hanging_writes: Mutex::new(BTreeSet::new()),
            before_write: Mutex::new(None),
            recorder: Mutex::new(None),
            portforward: Mutex::new(None),
            denied: Mutex::new(Vec::new()),
        });
        let serving = serve::Serving::start({
            let inner = inner.clone();
            move |request| serve_https_request(inner.clone(), request)
        })
        .await?;
        Ok(ApiServer {
            inner,
            serving: Arc::new(serving),
        })
    }

    /// A management API server with the shipped RBAC of the all-namespaces
    /// mode: what every install gets (`config/rbac`: ServiceAccount, Lease
    /// Role, ClusterEtcdTemplate reader) plus `config/rbac/all-namespaces`.
    /// The namespaced mode (`config/rbac/namespace`, one Role per watched
    /// namespace) grants the same rules (tests/tests/deploy.rs checks that).
    pub async fn management() -> Result<ApiServer> {
        let rbac = kinds::config_dir().join("rbac");
        Self::start(MANAGEMENT, &[&rbac, &rbac.join("all-namespaces")]).await
    }

    /// A workload cluster's API server: the shipped `config/workload-rbac`.
    pub async fn workload(name: &str) -> Result<ApiServer> {
        Self::start(name, &[&kinds::config_dir().join("workload-rbac")]).await
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Adds RBAC objects (Role, ClusterRole, bindings) from YAML text.
    pub fn add_rbac_yaml(&self, text: &str) -> Result<()> {
        let docs = etcdfleet_api::yaml::documents(text)?;
        self.inner
            .rbac
            .lock()
            .expect("rbac lock")
            .add_documents(&docs);
        Ok(())
    }

    /// A client whose every request carries identity `user`.
    pub fn client_as(&self, user: &str) -> Client {
        let inner = self.inner.clone();
        let user = user.to_string();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (inner, user) = (inner.clone(), user.clone());
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                Ok::<_, Infallible>(inner.handle(&user, &parts, bytes).await)
            }
        });
        Client::new(service, "default")
    }

    /// The admin client: no RBAC, not recorded.
    pub fn admin_client(&self) -> Client {
        self.client_as(ADMIN)
    }

    /// A new bearer token for `user`, for HTTPS requests.
    pub fn issue_token(&self, user: &str) -> String {
        let token = random_token();
        self.inner
            .tokens
            .lock()
            .expect("tokens lock")
            .insert(token.clone(), user.to_string());
        token
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.serving.url.clone()
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> String {
        self.serving.ca_pem.clone()
    }

    /// A kubeconfig for this server: inline CA data and the bearer token.
    pub fn kubeconfig(&self, user_token: &str) -> String {
        let name = &self.inner.name;
        let ca = base64(self.serving.ca_pem.as_bytes());
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: {name}-user
  user:
    token: {user_token}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}-user
current-context: {name}
",
            url = self.serving.url
        )
    }

    /// Records every request of a non-admin identity into `recorder`.
    pub fn set_recorder(&self, recorder: OpRecorder) {
        *self.inner.recorder.lock().expect("recorder lock") = Some(recorder);
    }

    /// Runs `run` once, just before the first write (any verb but GET) of
    /// `user` to `resource` (e.g. `statefulsets`) is served: another writer
    /// acting between a controller's read and its write.
    pub fn before_first_write(&self, user: &str, resource: &str, run: BoxFuture<'static, ()>) {
        *self.inner.before_write.lock().expect("lock") = Some(BeforeWrite {
            user: user.into(),
            resource: resource.into(),
            run,
        });
    }

    /// Makes every request of `user` answer 503 (recorded as rejected).
    pub fn set_unavailable(&self, user: &str, unavailable: bool) {
        let mut set = self.inner.unavailable.lock().expect("lock");
        if unavailable {
            set.insert(user.to_string());
        } else {
            set.remove(user);
        }
    }

    /// Makes every write of `user` hang: the request is read and recorded,
    /// and never answered (its reads are served as usual).
    pub fn set_hanging_writes(&self, user: &str, hanging: bool) {
        let mut set = self.inner.hanging_writes.lock().expect("lock");
        if hanging {
            set.insert(user.to_string());
        } else {
            set.remove(user);
        }
    }

    /// Serves CRDs as an older release did, without their transition rules
    /// (`enabled: false`): how tests reach the controller's own defence
    /// against edits that today's CRDs refuse (identity, storage).
    pub fn set_crd_transition_rules(&self, enabled: bool) {
        self.inner
            .store
            .lock()
            .expect("store lock")
            .transition_rules = enabled;
    }

    /// The messages of every request RBAC refused so far (403), in order.
    pub fn denied(&self) -> Vec<String> {
        self.inner.denied.lock().expect("denied lock").clone()
    }

    /// Serves `pods/<name>/portforward` upgrades with `handler`.
    pub fn set_portforward_handler(&self, handler: UpgradeHandler) {
        *self.inner.portforward.lock().expect("lock") = Some(handler);
    }

    /// How many changes watches can resume across; older resourceVersions
    /// answer 410 Gone.
    pub fn set_watch_history_limit(&self, limit: usize) {
        let mut store = self.inner.store.lock().expect("store lock");
        store.history_limit = limit.max(1);
        while store.history.len() > store.history_limit {
            if let Some(e) = store.history.pop_front() {
                store.compacted = e.rv;
            }
        }
    }

    /// The current resourceVersion of the whole store.
    pub fn resource_version(&self) -> u64 {
        self.inner
            .store
            .lock()
            .expect("store lock")
            .resource_version()
    }
}
