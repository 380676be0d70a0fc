//! The request recorder: every API call of a non-admin identity, as the
//! server saw it ([`ApiOp`]: verb, resource, namespace, name, query, body,
//! token), in one log shared by the servers of a fleet ([`OpRecorder`]), so
//! tests assert exactly which calls a reconcile made.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// One API call, as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiOp {
    /// `"management"` or the workload cluster's name.
    pub cluster: String,
    /// get, list, watch, create, replace, patch, delete, delete_collection,
    /// or `<verb>_<subresource>` (get_status, patch_status, replace_status,
    /// patch_scale, ...).
    pub verb: String,
    /// API group, empty for the core group.
    pub group: String,
    pub version: String,
    /// Plural resource name (`secrets`, `statefulsets`, `etcdclusters`).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The raw query string (label/field selectors, fieldManager, dryRun, ...).
    pub query: Option<String>,
    /// For patches: `merge`, `json`, `strategic` or `apply`.
    pub patch_type: Option<String>,
    /// The request body (create/replace/patch objects, delete options with
    /// their preconditions), if any.
    pub body: Option<Value>,
    /// Refused by an injected outage (never reached the fake API).
    pub rejected: bool,
    /// The request's bearer token, if any: tells apart processes that share
    /// one identity (replicas of the controller).
    pub token: Option<String>,
}

impl ApiOp {
    pub fn is_read(&self) -> bool {
        ["get", "list", "watch"]
            .iter()
            .any(|v| self.verb == *v || self.verb.starts_with(&format!("{v}_")))
    }

    pub fn is_write(&self) -> bool {
        !self.is_read()
    }

    /// The value of a query parameter, e.g. `fieldManager`.
    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query.as_deref()?.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == key).then(|| v.to_string())
        })
    }

    pub(crate) fn from_request(
        cluster: &str,
        parts: &http::request::Parts,
        body: &[u8],
        rejected: bool,
    ) -> ApiOp {
        let segments: Vec<&str> = parts
            .uri
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (group, rest) = match segments.first() {
            Some(&"api") => ("", &segments[1..]),
            Some(&"apis") if segments.len() > 1 => (segments[1], &segments[2..]),
            _ => ("", &segments[..0]),
        };
        let version = rest.first().copied().unwrap_or_default();
        let rest = rest.get(1..).unwrap_or_default();
        let (namespace, resource, name, subresource) = if rest.len() >= 3 && rest[0] == "namespaces"
        {
            (
                Some(rest[1]),
                rest[2],
                rest.get(3).copied(),
                rest.get(4).copied(),
            )
        } else {
            (
                None,
                rest.first().copied().unwrap_or_default(),
                rest.get(1).copied(),
                rest.get(2).copied(),
            )
        };
        let query = parts.uri.query().map(str::to_string);
        let watch = query
            .as_deref()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let base = match (parts.method.as_str(), name.is_some()) {
            ("GET", true) => "get",
            ("GET", false) if watch => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "replace",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "delete_collection",
            (other, _) => other,
        };
        let verb = match subresource {
            Some(sub) => format!("{base}_{sub}"),
            None => base.to_string(),
        };
        let patch_type = (parts.method == http::Method::PATCH).then(|| {
            let ct = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            match ct {
                "application/apply-patch+yaml" => "apply",
                "application/json-patch+json" => "json",
                "application/strategic-merge-patch+json" => "strategic",
                _ => "merge",
            }
            .to_string()
        });
        ApiOp {
            cluster: cluster.to_string(),
            verb,
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            query,
            patch_type,
            body: (!body.is_empty()).then(|| {
                serde_json::from_slice(body)
                    .unwrap_or_else(|_| json!(String::from_utf8_lossy(body)))
            }),
            rejected,
            token: parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string),
        }
    }
}

impl std::fmt::Display for ApiOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} {}", self.cluster, self.verb, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " -n {ns}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        Ok(())
    }
}

/// Shared log of [`ApiOp`]s.
#[derive(Debug, Clone, Default)]
pub struct OpRecorder {
    ops: Arc<Mutex<Vec<ApiOp>>>,
}

impl OpRecorder {
    pub(crate) fn push(&self, op: ApiOp) {
        self.ops.lock().expect("lock").push(op);
    }

    pub fn ops(&self) -> Vec<ApiOp> {
        self.ops.lock().expect("lock").clone()
    }

    pub fn clear(&self) {
        self.ops.lock().expect("lock").clear();
    }
}
