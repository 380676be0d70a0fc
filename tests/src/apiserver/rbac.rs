//! RBAC as the API server's authorizer applies it, from Role, ClusterRole,
//! RoleBinding and ClusterRoleBinding manifests (the shipped `config/rbac`).

use serde_json::{Value, json};

/// What a request asks to do, in RBAC terms.
#[derive(Debug, Clone)]
pub struct Attributes {
    pub user: String,
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

impl Rule {
    fn parse(v: &Value) -> Rule {
        Rule {
            verbs: strings(&v["verbs"]),
            groups: strings(&v["apiGroups"]),
            resources: strings(&v["resources"]),
            names: strings(&v["resourceNames"]),
        }
    }

    fn allows(&self, a: &Attributes) -> bool {
        let any = |list: &[String], want: &str| list.iter().any(|x| x == "*" || x == want);
        let resource = match &a.subresource {
            Some(sub) => format!("{}/{sub}", a.resource),
            None => a.resource.clone(),
        };
        any(&self.verbs, &a.verb)
            && any(&self.groups, &a.group)
            && any(&self.resources, &resource)
            && (self.names.is_empty() || a.name.as_ref().is_some_and(|n| self.names.contains(n)))
    }
}

#[derive(Debug, Clone)]
struct Role {
    kind: String,
    name: String,
    namespace: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Binding {
    /// Namespace of a RoleBinding; `None` for a ClusterRoleBinding.
    namespace: Option<String>,
    role_kind: String,
    role_name: String,
    users: Vec<String>,
}

/// The RBAC objects of one API server.
#[derive(Debug, Clone, Default)]
pub struct Rbac {
    roles: Vec<Role>,
    bindings: Vec<Binding>,
}

impl Rbac {
    /// Adds every RBAC object among `docs`; other documents are ignored.
    pub fn add_documents(&mut self, docs: &[Value]) {
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let namespace = doc["metadata"]["namespace"].as_str().map(str::to_string);
            match kind {
                "Role" | "ClusterRole" => self.roles.push(Role {
                    kind: kind.into(),
                    name,
                    namespace: (kind == "Role").then_some(namespace).flatten(),
                    rules: doc["rules"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(Rule::parse)
                        .collect(),
                }),
                "RoleBinding" | "ClusterRoleBinding" => self.bindings.push(Binding {
                    namespace: (kind == "RoleBinding").then_some(namespace).flatten(),
                    role_kind: doc["roleRef"]["kind"].as_str().unwrap_or_default().into(),
                    role_name: doc["roleRef"]["name"].as_str().unwrap_or_default().into(),
                    users: doc["subjects"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| match s["kind"].as_str()? {
                            "ServiceAccount" => Some(format!(
                                "system:serviceaccount:{}:{}",
                                s["namespace"].as_str()?,
                                s["name"].as_str()?
                            )),
                            "User" => Some(s["name"].as_str()?.to_string()),
                            _ => None,
                        })
                        .collect(),
                }),
                _ => {}
            }
        }
    }

    /// Whether some binding of `a.user` grants the request.
    pub fn allows(&self, a: &Attributes) -> bool {
        self.bindings
            .iter()
            .filter(|b| b.users.contains(&a.user))
            // A RoleBinding grants only in its own namespace.
            .filter(|b| b.namespace.is_none() || b.namespace == a.namespace)
            .flat_map(|b| {
                self.roles.iter().filter(move |r| {
                    r.kind == b.role_kind
                        && r.name == b.role_name
                        && (r.kind == "ClusterRole" || r.namespace == b.namespace)
                })
            })
            .any(|r| r.rules.iter().any(|rule| rule.allows(a)))
    }
}

/// The API server's 403 Status for a denied request.
pub fn forbidden(a: &Attributes) -> Value {
    let resource = match &a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.clone(),
    };
    let qualified = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let subject = match &a.name {
        Some(name) => format!("{qualified} \"{name}\" is forbidden"),
        None => format!("{qualified} is forbidden"),
    };
    let scope = match &a.namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".to_string(),
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!(
            "{subject}: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\"{scope}",
            a.user, a.verb, a.group
        ),
        "reason": "Forbidden",
        "details": { "name": a.name.clone().unwrap_or_default(), "group": a.group, "kind": a.resource },
        "code": 403,
    })
}
