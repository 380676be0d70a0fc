//! The API server's audit log, read back: what a test counts reads and writes
//! from (never the project's own request recorder on this tier).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// One audited request (`level: Metadata`, stage `ResponseStarted` or
/// `ResponseComplete`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub verb: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub user: AuditUser,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    #[serde(default)]
    pub stage: String,
    /// When the request arrived and when this stage was logged
    /// (RFC 3339 with microseconds, so they order as strings).
    #[serde(default)]
    pub request_received_timestamp: String,
    #[serde(default)]
    pub stage_timestamp: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// Verbs that change state (Kubernetes' request verbs).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    pub fn is_read(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "list" | "watch")
    }

    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// `resource[/subresource]` of the object, or the URI for non-resource requests.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if o.subresource.is_empty() => o.resource.clone(),
            Some(o) => format!("{}/{}", o.resource, o.subresource),
            None => self.request_uri.clone(),
        }
    }
}

impl std::fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} ({}) -> {}",
            self.user.username,
            self.verb,
            self.request_uri,
            self.resource(),
            self.code()
        )
    }
}

/// Every event of one audit log, in order.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    pub events: Vec<AuditEvent>,
}

impl AuditLog {
    pub fn read(path: &Path) -> Result<AuditLog> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading audit log {}", path.display()))?;
        let mut events = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: AuditEvent =
                serde_json::from_str(line).with_context(|| format!("audit line {line}"))?;
            // A long-running request (watch, tunnel) is logged when it
            // starts and again when it ends: count it once, from its start.
            if seen.insert(event.audit_id.clone()) {
                events.push(event);
            }
        }
        Ok(AuditLog { events })
    }

    /// Events of `user` only.
    pub fn by(&self, user: &str) -> Vec<&AuditEvent> {
        self.events
            .iter()
            .filter(|e| e.user.username == user)
            .collect()
    }

    /// Events of `user` after the first `skip` events of the whole log
    /// (take `len()` before an interval, then ask for what came after).
    pub fn by_since(&self, user: &str, skip: usize) -> Vec<&AuditEvent> {
        self.events
            .iter()
            .skip(skip)
            .filter(|e| e.user.username == user)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Requests refused by authorization (403), by anyone.
    pub fn forbidden(&self) -> Vec<&AuditEvent> {
        self.events.iter().filter(|e| e.code() == 403).collect()
    }
}
