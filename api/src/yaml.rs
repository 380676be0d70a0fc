//! YAML in and out, one way for the whole project: configuration files,
//! the offline CLI's manifests, templates, generated CRDs.
//!
//! Reading is two steps, the way `kubectl` turns YAML into JSON before the
//! API server sees it:
//! 1. [serde-saphyr] parses the text into a JSON value. Syntax errors,
//!    duplicate keys (refused, as the API server's strict decoding refuses
//!    them), and anchors that expand past its node budget (a "billion
//!    laughs" document) fail here, naming line and column.
//! 2. serde_json turns the value into the typed object, with
//!    [`serde_path_to_error`] naming the field that failed
//!    (`leaderElection.leaseDurationSeconds: invalid type: ...`). A number
//!    where a string belongs is refused here, as the API server refuses it.
//!
//! Scalars are typed by YAML 1.2's core schema, as serde_yaml 0.9 typed
//! them (the reader before): `yes`, `on`, `y` are strings, not booleans.
//!
//! Writing uses serde-saphyr's serializer; strings YAML 1.1 would read as
//! booleans or numbers (`"yes"`, `"3.5"`) come out quoted, so `kubectl`
//! reads back what was written.
//!
//! [serde-saphyr]: https://github.com/bourumir-wyngs/serde-saphyr

mod json;

use json::JsonDocument;
use serde::{Serialize, de::DeserializeOwned};

/// Why a YAML text could not be read: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// Not YAML, or YAML the project refuses (duplicate keys, alias bombs).
    /// The message names line and column.
    #[error("{0}")]
    Syntax(String),
    /// YAML, but a field does not fit its type.
    #[error("{path}: {message}")]
    Field { path: String, message: String },
}

/// Why a value could not be written as YAML.
#[derive(Debug, thiserror::Error)]
#[error("writing YAML: {0}")]
pub struct WriteError(String);

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // One line per error: messages end up in conditions, events and logs.
        with_snippet: false,
        // YAML 1.2's core schema, as the project read YAML before (serde_yaml
        // 0.9): only true/false are booleans, so a key or value `y`, `on`
        // or `no` stays a string; `0755` and `1_000` stay strings.
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

fn syntax(e: serde_saphyr::Error) -> YamlError {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    // The crate's advice to its own callers is not the user's business.
    YamlError::Syntax(line.replace(", set DuplicateKeyPolicy in Options if acceptable", ""))
}

/// Reads one document as JSON (an empty document is `null`): integers
/// past 64 bits become floats, NaN and infinities `null`, map keys strings
/// (see [`json`]), so a schema, not the reader, refuses them by field.
pub fn value(text: &str) -> Result<serde_json::Value, YamlError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_saphyr::from_str_with_options(text, options())
        .map(|JsonDocument(v)| v)
        .map_err(syntax)
}

/// Reads one document as `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    from_value(value(text)?)
}

/// Reads one document given as bytes (UTF-8) as `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, YamlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| YamlError::Syntax(e.to_string()))?;
    from_str(text)
}

/// Turns a value read by [`value`] or [`documents`] into `T`, naming the
/// field that does not fit.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(value).map_err(|e| YamlError::Field {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

/// Reads a multi-document stream (`---` separated), one JSON value per
/// non-empty document, in order. A syntax error anywhere fails the stream:
/// nothing of a stream that is not YAML is used.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, YamlError> {
    let docs: Vec<JsonDocument> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(syntax)?;
    Ok(docs
        .into_iter()
        .map(|JsonDocument(v)| v)
        .filter(|d| !d.is_null())
        .collect())
}

/// Writes `value` as one YAML document.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, WriteError> {
    serde_saphyr::to_string(value).map_err(|e| WriteError(e.to_string()))
}

#[cfg(test)]
mod tests;
