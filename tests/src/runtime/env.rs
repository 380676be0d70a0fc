//! A container's environment, built as the kubelet builds it at each
//! start: `value` with `$(VAR)` expansion, `fieldRef` (the downward API,
//! which also fills the `downwardAPI` items of `projected` volumes),
//! `configMapKeyRef`, `secretKeyRef` and `envFrom`, read from the workload
//! API; in node mode the `kubernetes` Service's variables; and a `PATH` with
//! the image's own commands first. The ConfigMap and Secret reads here are
//! the volumes' too.

use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::ResourceExt;
use kube::api::Api;

use super::state::{Inner, Mode, Waiting};

/// Expands `$(VAR)` references like Kubernetes does for env values, command
/// and args: `$$` is an escaped `$`, an unknown variable or an unterminated
/// reference stays literal.
pub fn expand_k8s_vars(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.chars().next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(end) => {
                    let name = &after[1..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A `fieldRef` value, as kubelet resolves it.
pub(super) fn field_value(pod: &Pod, path: &str, ip: Ipv4Addr) -> Option<String> {
    let label_or_annotation = |prefix: &str, map: &BTreeMap<String, String>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.get(key).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(pod.name_any()),
        "metadata.namespace" => pod.namespace(),
        "metadata.uid" => pod.uid(),
        "status.podIP" => Some(ip.to_string()),
        "status.hostIP" => Some("127.0.0.1".into()),
        "spec.nodeName" => Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "localhost".into()),
        ),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        _ => label_or_annotation("metadata.labels['", pod.labels())
            .or_else(|| label_or_annotation("metadata.annotations['", pod.annotations())),
    }
}

impl Inner {
    pub(super) async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        ip: Ipv4Addr,
    ) -> std::result::Result<Vec<(String, String)>, Waiting> {
        let ns = pod.namespace().unwrap_or_default();
        let config_error = |m: String| Waiting::new("CreateContainerConfigError", m);
        let mut env: Vec<(String, String)> = self.service_env();
        for from in container.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = &from.config_map_ref {
                match self.config_map(&ns, &r.name).await {
                    Ok(Some(cm)) => env.extend(
                        cm.data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (format!("{prefix}{k}"), v)),
                    ),
                    Ok(None) if r.optional == Some(true) => {}
                    Ok(None) => {
                        return Err(config_error(format!("configmap {:?} not found", r.name)));
                    }
                    Err(e) => return Err(config_error(e.to_string())),
                }
            }
            if let Some(r) = &from.secret_ref {
                match self.secret_data(&ns, &r.name).await {
                    Ok(Some(data)) => env.extend(data.into_iter().map(|(k, v)| {
                        (
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })),
                    Ok(None) if r.optional == Some(true) => {}
                    Ok(None) => return Err(config_error(format!("secret {:?} not found", r.name))),
                    Err(e) => return Err(config_error(e.to_string())),
                }
            }
        }
        for var in container.env.iter().flatten() {
            let value = if let Some(value) = &var.value {
                let defined = env.clone();
                Some(expand_k8s_vars(value, |n| {
                    defined
                        .iter()
                        .rev()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.clone())
                }))
            } else if let Some(from) = &var.value_from {
                if let Some(field) = &from.field_ref {
                    Some(field_value(pod, &field.field_path, ip).ok_or_else(|| {
                        config_error(format!("unsupported fieldRef {:?}", field.field_path))
                    })?)
                } else if let Some(r) = &from.config_map_key_ref {
                    let cm = self
                        .config_map(&ns, &r.name)
                        .await
                        .map_err(|e| config_error(e.to_string()))?;
                    match cm.and_then(|cm| cm.data.unwrap_or_default().get(&r.key).cloned()) {
                        Some(v) => Some(v),
                        None if r.optional == Some(true) => None,
                        None => {
                            return Err(config_error(format!(
                                "configmap {:?} key {:?} not found",
                                r.name, r.key
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let data = self
                        .secret_data(&ns, &r.name)
                        .await
                        .map_err(|e| config_error(e.to_string()))?;
                    match data.and_then(|d| d.get(&r.key).cloned()) {
                        Some(v) => Some(String::from_utf8_lossy(&v).into_owned()),
                        None if r.optional == Some(true) => None,
                        None => {
                            return Err(config_error(format!(
                                "secret {:?} key {:?} not found",
                                r.name, r.key
                            )));
                        }
                    }
                } else {
                    return Err(config_error(format!(
                        "unsupported valueFrom for {:?}",
                        var.name
                    )));
                }
            } else {
                Some(String::new())
            };
            if let Some(value) = value {
                env.push((var.name.clone(), value));
            }
        }
        Ok(env)
    }

    /// Node mode: the `kubernetes` Service's variables every container gets,
    /// so in-cluster clients find the API server. Its ClusterIP is not
    /// routable on this machine: they name the API server's own address, the
    /// endpoint the Service would route to.
    fn service_env(&self) -> Vec<(String, String)> {
        let Mode::Nodes(_) = self.mode else {
            return Vec::new();
        };
        let Some((host, port)) = self
            .server_url
            .strip_prefix("https://")
            .and_then(|a| a.rsplit_once(':'))
        else {
            return Vec::new();
        };
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.to_string()),
            ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ]
    }

    /// Puts the commands `image` provides first on `PATH` (unless the
    /// container sets `PATH` itself), as the image's own `PATH` would: a
    /// program that runs another tool of its image by name (the seeder
    /// running `etcdutl`) finds it. The directory holds symlinks to the
    /// mapped binaries.
    pub(super) fn with_image_path(
        &self,
        mut env: Vec<(String, String)>,
        image: &str,
        pod_dir: &Path,
        container: &str,
    ) -> std::result::Result<Vec<(String, String)>, Waiting> {
        if env.iter().any(|(k, _)| k == "PATH") {
            return Ok(env);
        }
        let io = |e: std::io::Error| Waiting::new("ContainerCreating", e.to_string());
        let dir = pod_dir.join("image-path").join(container);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io)?;
        }
        fs::create_dir_all(&dir).map_err(io)?;
        for (name, binary) in self.images.commands_of(image) {
            std::os::unix::fs::symlink(&binary, dir.join(name)).map_err(io)?;
        }
        let host_path = std::env::var("PATH").unwrap_or_default();
        env.push(("PATH".into(), format!("{}:{host_path}", dir.display())));
        Ok(env)
    }

    pub(super) async fn config_map(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, kube::Error> {
        Api::<ConfigMap>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
    }

    /// A Secret's data, with `stringData` folded in (the fake API does not
    /// merge it like a real API server does).
    pub(super) async fn secret_data(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
        let secret: Option<Secret> = Api::<Secret>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?;
        Ok(secret.map(|s| {
            let mut data: BTreeMap<String, Vec<u8>> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                data.insert(k, v.into_bytes());
            }
            data
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "POD_NAME" => Some("c-etcd-0".into()),
            "NS" => Some("team-a".into()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes() {
        assert_eq!(
            expand_k8s_vars("--name=$(POD_NAME)", vars),
            "--name=c-etcd-0"
        );
        assert_eq!(
            expand_k8s_vars("http://$(POD_NAME).peer.$(NS).svc:2380", vars),
            "http://c-etcd-0.peer.team-a.svc:2380"
        );
        assert_eq!(expand_k8s_vars("$$(POD_NAME)", vars), "$(POD_NAME)");
        assert_eq!(expand_k8s_vars("$(UNKNOWN)", vars), "$(UNKNOWN)");
        assert_eq!(expand_k8s_vars("$(POD_NAME", vars), "$(POD_NAME");
        assert_eq!(expand_k8s_vars("a$b $", vars), "a$b $");
        assert_eq!(expand_k8s_vars("$$$$", vars), "$$");
        assert_eq!(expand_k8s_vars("é$(NS)ü", vars), "éteam-aü");
    }
}
