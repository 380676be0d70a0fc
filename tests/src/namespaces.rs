//! Namespaces for the fake workload APIs.
//!
//! kube-fake-client treats every path of the form `/api/v1/namespaces/<x>…`
//! as namespaced, so it cannot serve Namespace objects at all. A real API
//! server can, and the controller creates its workload namespace, so the
//! test world serves them itself: a small in-memory store in front of the
//! fake API that answers get, list, create, replace and delete like an API
//! server would (AlreadyExists, NotFound, Conflict on a stale
//! resourceVersion). Every other request passes through untouched.
//! (Cluster-scoped custom resources are handled differently, by
//! `fleet::cluster_scoped_crds`, which keeps them in the fake API itself.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One cluster-scoped resource served from memory.
struct Kind {
    /// Path of the collection, e.g. `/api/v1/namespaces`.
    collection: &'static str,
    api_version: &'static str,
    kind: &'static str,
    items: BTreeMap<String, Value>,
}

/// The in-memory store of the cluster-scoped kinds of one fake API.
#[derive(Clone)]
pub struct ClusterScopedStore {
    kinds: Arc<Mutex<Vec<Kind>>>,
    resource_version: Arc<Mutex<u64>>,
}

/// Kinds served for every fake API here.
const SERVED: &[(&str, &str, &str)] = &[("/api/v1/namespaces", "v1", "Namespace")];

impl Default for ClusterScopedStore {
    fn default() -> Self {
        ClusterScopedStore {
            kinds: Arc::new(Mutex::new(
                SERVED
                    .iter()
                    .map(|(collection, api_version, kind)| Kind {
                        collection,
                        api_version,
                        kind,
                        items: BTreeMap::new(),
                    })
                    .collect(),
            )),
            resource_version: Arc::new(Mutex::new(1)),
        }
    }
}

fn response(code: u16, body: Value) -> http::Response<Body> {
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("static response")
}

fn status(code: u16, reason: &str, message: String) -> http::Response<Body> {
    response(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

impl ClusterScopedStore {
    fn next_version(&self) -> String {
        let mut rv = self.resource_version.lock().expect("store lock");
        *rv += 1;
        rv.to_string()
    }

    /// Answers the request if it is about a kind served here; `None` passes it on.
    pub fn handle(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Option<http::Response<Body>> {
        let path = parts.uri.path().trim_end_matches('/');
        let mut kinds = self.kinds.lock().expect("store lock");
        let (kind, name) = kinds.iter_mut().find_map(|k| {
            if path == k.collection {
                return Some((k, None));
            }
            let rest = path.strip_prefix(k.collection)?.strip_prefix('/')?;
            (!rest.is_empty() && !rest.contains('/')).then(|| (k, Some(rest.to_string())))
        })?;
        let plural = kind
            .collection
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let parsed = serde_json::from_slice::<Value>(body)
            .map_err(|e| format!("invalid {}: {e}", kind.kind));
        Some(match (parts.method.as_str(), name) {
            ("GET", Some(name)) => match kind.items.get(&name) {
                Some(obj) => response(200, obj.clone()),
                None => status(404, "NotFound", format!("{plural} \"{name}\" not found")),
            },
            ("GET", None) => response(
                200,
                json!({
                    "kind": format!("{}List", kind.kind), "apiVersion": kind.api_version,
                    "metadata": { "resourceVersion": self.resource_version.lock().expect("store lock").to_string() },
                    "items": kind.items.values().cloned().collect::<Vec<_>>(),
                }),
            ),
            ("POST", None) => {
                let mut obj = match parsed {
                    Ok(v) => v,
                    Err(e) => return Some(status(400, "BadRequest", e)),
                };
                let Some(name) = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                else {
                    return Some(status(
                        422,
                        "Invalid",
                        format!("{} needs metadata.name", kind.kind),
                    ));
                };
                if kind.items.contains_key(&name) {
                    return Some(status(
                        409,
                        "AlreadyExists",
                        format!("{plural} \"{name}\" already exists"),
                    ));
                }
                obj["apiVersion"] = kind.api_version.into();
                obj["kind"] = kind.kind.into();
                obj["metadata"]["uid"] = format!("{plural}-{name}-{}", self.next_version()).into();
                obj["metadata"]["resourceVersion"] = self.next_version().into();
                obj["metadata"]["generation"] = 1.into();
                obj["metadata"]["creationTimestamp"] = k8s_openapi::jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
                    .into();
                if kind.kind == "Namespace" {
                    obj["status"] = json!({ "phase": "Active" });
                }
                kind.items.insert(name, obj.clone());
                response(201, obj)
            }
            ("PUT", Some(name)) => {
                let mut obj = match parsed {
                    Ok(v) => v,
                    Err(e) => return Some(status(400, "BadRequest", e)),
                };
                let Some(old) = kind.items.get(&name).cloned() else {
                    return Some(status(
                        404,
                        "NotFound",
                        format!("{plural} \"{name}\" not found"),
                    ));
                };
                let sent_rv = obj.pointer("/metadata/resourceVersion").cloned();
                if sent_rv.is_some() && sent_rv != old.pointer("/metadata/resourceVersion").cloned()
                {
                    return Some(status(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {plural} \"{name}\": the object has been modified"
                        ),
                    ));
                }
                let mut generation = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                if obj.get("spec") != old.get("spec") {
                    generation += 1;
                }
                obj["apiVersion"] = kind.api_version.into();
                obj["kind"] = kind.kind.into();
                obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                obj["metadata"]["generation"] = generation.into();
                obj["metadata"]["resourceVersion"] = self.next_version().into();
                kind.items.insert(name, obj.clone());
                response(200, obj)
            }
            ("DELETE", Some(name)) => match kind.items.remove(&name) {
                Some(obj) => response(200, obj),
                None => status(404, "NotFound", format!("{plural} \"{name}\" not found")),
            },
            (method, _) => status(
                405,
                "MethodNotAllowed",
                format!("{method} on {plural} is not served by the test API"),
            ),
        })
    }

    /// A client that answers the served kinds from this store and passes
    /// everything else to `inner`.
    pub fn in_front_of(&self, inner: Client) -> Client {
        let store = self.clone();
        let service = tower::service_fn(move |request: http::Request<Body>| {
            let (inner, store) = (inner.clone(), store.clone());
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await?;
                if let Some(response) = store.handle(&parts, &bytes) {
                    return Ok(response);
                }
                inner
                    .send(http::Request::from_parts(parts, Body::from(bytes.to_vec())))
                    .await
            }
        });
        Client::new(service, "default")
    }
}
