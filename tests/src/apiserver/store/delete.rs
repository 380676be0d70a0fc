//! Deletion in the store: DELETE of one object with its preconditions
//! (UID, resourceVersion) and finalizers (marked, removed once the last one
//! goes), DELETE of a collection, a namespace emptied before it goes, and the
//! garbage collection of dependents (orphaned or deleted in the background)
//! once their owner is gone.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{ApiResult, Key, Query, Store, Target, conflict, now};

impl Store {
    /// DELETE of one object, with preconditions and finalizers.
    pub fn delete(
        &mut self,
        t: &Target,
        name: &str,
        options: &Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let kind = self.kinds[t.kind].clone();
        let old = self.get(t, name)?;
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str()
            && Some(uid) != old["metadata"]["uid"].as_str()
        {
            return Err(conflict(
                &kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = pre["resourceVersion"].as_str()
            && Some(rv) != old["metadata"]["resourceVersion"].as_str()
        {
            return Err(conflict(
                &kind,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                ),
            ));
        }
        if query.dry_run() {
            return Ok(old);
        }
        let policy = options["propagationPolicy"]
            .as_str()
            .or(query.get("propagationPolicy"))
            .unwrap_or(if options["orphanDependents"] == Value::Bool(true) {
                "Orphan"
            } else {
                "Background"
            })
            .to_string();
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers || kind.kind == "Namespace" {
            if old["metadata"]["deletionTimestamp"].is_string() {
                return Ok(old);
            }
            let mut marked = old.clone();
            marked["metadata"]["deletionTimestamp"] = now().into();
            marked["metadata"]["deletionGracePeriodSeconds"] = 0.into();
            if kind.kind == "Namespace" {
                marked["status"]["phase"] = "Terminating".into();
            }
            marked["metadata"]["resourceVersion"] = self.bump().into();
            self.objects.insert(self.key(t, name), marked.clone());
            self.emit(t.kind, "MODIFIED", marked.clone());
            if kind.kind == "Namespace" {
                self.empty_namespace(name);
                return Ok(self
                    .objects
                    .get(&self.key(t, name))
                    .cloned()
                    .unwrap_or(marked));
            }
            return Ok(marked);
        }
        let mut gone = old.clone();
        gone["metadata"]["resourceVersion"] = self.bump().into();
        self.remove(t.kind, &self.key(t, name), gone.clone(), &policy);
        Ok(gone)
    }

    /// Deletes every object in namespace `ns`, then the namespace once empty.
    fn empty_namespace(&mut self, ns: &str) {
        let keys: Vec<Key> = self
            .objects
            .keys()
            .filter(|(_, n, _)| n == ns)
            .cloned()
            .collect();
        for (kind, namespace, name) in keys {
            let t = Target {
                kind,
                namespace: Some(namespace),
                name: Some(name.clone()),
                subresource: None,
            };
            let empty = BTreeMap::new();
            let _ = self.delete(&t, &name, &json!({}), &Query(&empty));
        }
        self.finish_namespace(ns);
    }

    fn finish_namespace(&mut self, ns: &str) {
        if ns.is_empty() || self.objects.keys().any(|(_, n, _)| n == ns) {
            return;
        }
        let Some(ns_kind) = self
            .kinds
            .iter()
            .position(|k| k.group.is_empty() && k.resource == "namespaces")
        else {
            return;
        };
        let key = (ns_kind, String::new(), ns.to_string());
        if let Some(obj) = self.objects.get(&key)
            && obj["metadata"]["deletionTimestamp"].is_string()
        {
            let mut gone = obj.clone();
            gone["metadata"]["resourceVersion"] = self.bump().into();
            self.remove(ns_kind, &key, gone, "Background");
        }
    }

    /// Removes an object for good, then collects its dependents.
    pub(super) fn remove(&mut self, kind: usize, key: &Key, last: Value, policy: &str) {
        self.objects.remove(key);
        self.emit(kind, "DELETED", last.clone());
        let uid = last["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let dependents: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid.as_str()))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (dep_key, dep) in dependents {
            let mut updated = dep.clone();
            if let Some(refs) = updated["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"] != uid.as_str());
            }
            let owners_left = updated["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|r| !r.is_empty());
            let t = Target {
                kind: dep_key.0,
                namespace: (!dep_key.1.is_empty()).then(|| dep_key.1.clone()),
                name: Some(dep_key.2.clone()),
                subresource: None,
            };
            if policy == "Orphan" || owners_left {
                updated["metadata"]["resourceVersion"] = self.bump().into();
                self.objects.insert(dep_key.clone(), updated.clone());
                self.emit(dep_key.0, "MODIFIED", updated);
            } else {
                let empty = BTreeMap::new();
                let _ = self.delete(
                    &t,
                    &dep_key.2,
                    &json!({ "propagationPolicy": "Background" }),
                    &Query(&empty),
                );
            }
        }
        if !key.1.is_empty() {
            self.finish_namespace(&key.1.clone());
        }
    }

    pub fn delete_collection(
        &mut self,
        t: &Target,
        options: &Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let items = self.select(t, query)?;
        for item in &items {
            let name = item["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let tt = Target {
                namespace: item["metadata"]["namespace"].as_str().map(str::to_string),
                name: Some(name.clone()),
                ..t.clone()
            };
            self.delete(&tt, &name, options, query)?;
        }
        let kind = &self.kinds[t.kind];
        Ok(json!({
            "kind": format!("{}List", kind.kind), "apiVersion": kind.api_version(),
            "metadata": { "resourceVersion": self.rv.to_string() }, "items": items,
        }))
    }
}
