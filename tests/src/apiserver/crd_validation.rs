//! CRD validation of the test API server: the project's validator
//! (`etcdfleet_api::validation`: the served version's openAPIV3Schema, every
//! CEL rule including transition rules, unknown fields pruned), called on
//! every create, update, patch and apply of a custom resource, main resource
//! and status alike.

use etcdfleet_api::validation::{self, FieldError};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use super::kinds::Kind;

/// Validates `obj` (and, for updates, its transition from `old`) against
/// the CRD; returns the object with unknown fields pruned.
pub fn validate(kind: &Kind, obj: &Value, old: Option<&Value>) -> Result<Value, Vec<FieldError>> {
    if let Some(prepared) = &kind.validator {
        return prepared.validate(obj, old).map(|v| v.object);
    }
    let Some(crd) = &kind.crd else {
        return Ok(obj.clone());
    };
    let crd: CustomResourceDefinition = serde_json::from_value(crd.clone()).map_err(|e| {
        vec![FieldError {
            field: String::new(),
            reason: "FieldValueInvalid".into(),
            message: format!("the served CRD does not parse: {e}"),
        }]
    })?;
    validation::validate_object(&crd, obj, old).map(|v| v.object)
}

/// The API server's 422 Status.
pub fn invalid_status(kind: &Kind, name: &str, errors: &[FieldError]) -> Value {
    validation::invalid_status(&kind.kind, &kind.group, name, errors)
}
