//! One YAML document read as the API server reads a JSON body.

use std::fmt;

use serde::Deserialize;

/// One YAML document read as the API server reads a JSON body: integers
/// beyond 64 bits become floats (which the schema then refuses with the
/// field's path) instead of failing the whole stream; map keys are strings.
pub(super) struct JsonDocument(pub(super) serde_json::Value);

impl<'de> Deserialize<'de> for JsonDocument {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor).map(JsonDocument)
    }
}

struct JsonVisitor;

impl<'de> serde::de::Visitor<'de> for JsonVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i128<E>(self, v: i128) -> Result<Self::Value, E> {
        Ok((v as f64).into())
    }
    fn visit_u128<E>(self, v: u128) -> Result<Self::Value, E> {
        Ok((v as f64).into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // NaN and infinities have no JSON form: null, which no schema accepts.
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(JsonDocument(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(out.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some((JsonDocument(k), JsonDocument(v))) = map.next_entry()? {
            let key = match k {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            out.insert(key, v);
        }
        Ok(out.into())
    }
}
