//! Namespaces for the fake workload APIs.
//!
//! kube-fake-client parses `/api/v1/namespaces/<name>` as the start of a
//! namespaced path, so it cannot serve Namespace objects at all. A real API
//! server can, and the controller creates its workload namespace, so the test
//! world serves `namespaces` itself: a small in-memory store in front of the
//! fake API answering get, list, create and delete like an API server would
//! (AlreadyExists, NotFound). Everything else passes through untouched.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::client::Body;
use serde_json::{Value, json};

/// The in-memory Namespace store of one fake API.
#[derive(Clone, Default)]
pub struct NamespaceStore {
    items: Arc<Mutex<BTreeMap<String, Value>>>,
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

impl NamespaceStore {
    /// Answers the request if it is about Namespaces; `None` passes it on.
    pub fn handle(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Option<http::Response<Body>> {
        let segments: Vec<&str> = parts
            .uri
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let name = match segments.as_slice() {
            ["api", "v1", "namespaces"] => None,
            ["api", "v1", "namespaces", name] => Some(name.to_string()),
            _ => return None,
        };
        let mut items = self.items.lock().expect("namespace store lock");
        Some(match (parts.method.as_str(), name) {
            ("GET", Some(name)) => match items.get(&name) {
                Some(ns) => response(200, ns.clone()),
                None => status(404, "NotFound", format!("namespaces \"{name}\" not found")),
            },
            ("GET", None) => response(
                200,
                json!({
                    "kind": "NamespaceList", "apiVersion": "v1",
                    "metadata": { "resourceVersion": "1" },
                    "items": items.values().cloned().collect::<Vec<_>>(),
                }),
            ),
            ("POST", None) => {
                let mut ns: Value = match serde_json::from_slice(body) {
                    Ok(v) => v,
                    Err(e) => {
                        return Some(status(400, "BadRequest", format!("invalid Namespace: {e}")));
                    }
                };
                let Some(name) = ns
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                else {
                    return Some(status(
                        422,
                        "Invalid",
                        "Namespace needs metadata.name".into(),
                    ));
                };
                if items.contains_key(&name) {
                    return Some(status(
                        409,
                        "AlreadyExists",
                        format!("namespaces \"{name}\" already exists"),
                    ));
                }
                ns["apiVersion"] = "v1".into();
                ns["kind"] = "Namespace".into();
                ns["metadata"]["uid"] = format!("ns-{name}").into();
                ns["metadata"]["resourceVersion"] = "1".into();
                ns["status"] = json!({ "phase": "Active" });
                items.insert(name, ns.clone());
                response(201, ns)
            }
            ("DELETE", Some(name)) => match items.remove(&name) {
                Some(ns) => response(200, ns),
                None => status(404, "NotFound", format!("namespaces \"{name}\" not found")),
            },
            (method, _) => status(
                405,
                "MethodNotAllowed",
                format!("{method} on namespaces is not served here"),
            ),
        })
    }

    /// Names of the namespaces that exist.
    pub fn names(&self) -> Vec<String> {
        self.items
            .lock()
            .expect("namespace store lock")
            .keys()
            .cloned()
            .collect()
    }
}
