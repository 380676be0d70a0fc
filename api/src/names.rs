//! The names a tenant writes that the controller puts into a request path:
//! an object's name (`clusterRef.name`, `kubeconfigSecretRef.name`,
//! `templateRef.name`, `baseTemplate`, `clusterName`, `backupName`,
//! `credentialsSecretName`) and a Secret's data key. Each is checked at
//! admission (the CEL rules below, on the field) and again by the
//! controller before any request ([`reference_problem`]), so that no value
//! stored before a rule existed reaches a path either.

/// An object name: a DNS subdomain (RFC 1123), as Kubernetes names
/// Secrets, templates and the etcdfleet kinds; its length is the field's
/// `maxLength` (253, `controllers/src/crd/bounds.rs`).
pub const DNS_SUBDOMAIN_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

/// A Secret's data key, as Kubernetes allows it.
pub const SECRET_KEY_RULE: &str = "self.matches('^[-._a-zA-Z0-9]+$')";

/// Why `name`, the value of `field`, may not go into a request path, if it
/// may not: it is not a DNS subdomain of at most 253 characters.
pub fn reference_problem(field: &str, name: &str) -> Option<String> {
    let problem = crate::validation::dns_subdomain_problem(name)?;
    Some(format!(
        "{field} {:?} is not an object name: {problem}",
        shown(name)
    ))
}

/// Why `key`, a Secret's data key, may not be read, if it may not.
pub fn secret_key_problem(field: &str, key: &str) -> Option<String> {
    let fine = !key.is_empty()
        && key.len() <= 253
        && (key.bytes()).all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    (!fine).then(|| {
        format!(
            "{field} {:?} is not a Secret key (at most 253 letters, digits, '-', '.' and '_')",
            shown(key)
        )
    })
}

/// At most 64 characters of a tenant's value, for a message.
fn shown(value: &str) -> String {
    match value.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_could_leave_its_path_is_refused_and_a_name_passes() {
        assert_eq!(reference_problem("clusterName", "shop"), None);
        assert_eq!(reference_problem("clusterName", "shop.team-a"), None);
        for bad in [
            "",
            "../secrets/x",
            "a/b",
            "Shop",
            "-a",
            "a-",
            &"a".repeat(254),
        ] {
            let problem = reference_problem("clusterName", bad).expect(bad);
            assert!(problem.starts_with("clusterName "), "{problem}");
            assert!(problem.len() < 600, "a long value is shown cut: {problem}");
        }
        assert_eq!(secret_key_problem("key", "value"), None);
        assert_eq!(secret_key_problem("key", "admin.conf"), None);
        assert!(secret_key_problem("key", "../x").is_some());
        assert!(secret_key_problem("key", "").is_some());
    }
}
