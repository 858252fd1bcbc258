//! The arguments of an upstream call, checked in Rust before anything leaves the process (the
//! Python side checks first, but the sandbox can skip it): a JSON object of bounded size, every
//! required property present, no property the schema closes out (`additionalProperties: false`),
//! and each property of the JSON type its schema names. Deeper rules are the upstream's to apply.

use serde_json::{Map, Value};

/// Largest arguments object one call may send, in bytes of JSON.
pub const MAX_ARGUMENT_BYTES: usize = 256 * 1024;

/// `text` parsed and checked against `schema`; the error names the argument.
pub fn arguments(schema: &Map<String, Value>, text: &str) -> Result<Map<String, Value>, String> {
    if text.len() > MAX_ARGUMENT_BYTES {
        return Err(format!(
            "the arguments are {} bytes of JSON, over the limit of {MAX_ARGUMENT_BYTES}",
            text.len()
        ));
    }
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(text) else {
        return Err("the arguments must be a JSON object of keyword arguments".into());
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !args.contains_key(name) {
                return Err(format!("missing required argument `{name}`"));
            }
        }
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (name, value) in &args {
        match properties.and_then(|p| p.get(name)) {
            None if closed => return Err(format!("unexpected argument `{name}`")),
            None => {}
            Some(property) => {
                if let Some(expected) = property.get("type")
                    && !type_matches(expected, value)
                {
                    return Err(format!(
                        "argument `{name}` must be {}; got {}",
                        type_text(expected),
                        kind(value)
                    ));
                }
            }
        }
    }
    Ok(args)
}

fn type_matches(expected: &Value, value: &Value) -> bool {
    match expected {
        Value::String(t) => one_type(t, value),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .any(|t| one_type(t, value)),
        _ => true,
    }
}

fn one_type(t: &str, value: &Value) -> bool {
    match t {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => true,
    }
}

fn type_text(expected: &Value) -> String {
    match expected {
        Value::String(t) => format!("of type {t}"),
        Value::Array(ts) => format!(
            "one of the types {}",
            ts.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "valid".into(),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Map<String, Value> {
        json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": ["string", "null"]}},
               "required": ["a"], "additionalProperties": false})
        .as_object()
        .unwrap()
        .clone()
    }

    #[test]
    fn checks_required_types_and_closed_objects() {
        assert!(arguments(&schema(), r#"{"a": 1, "b": null}"#).is_ok());
        assert!(
            arguments(&schema(), r#"{"b": "x"}"#)
                .unwrap_err()
                .contains("`a`")
        );
        assert!(
            arguments(&schema(), r#"{"a": "1"}"#)
                .unwrap_err()
                .contains("number")
        );
        assert!(
            arguments(&schema(), r#"{"a": 1, "_meta": {}}"#)
                .unwrap_err()
                .contains("_meta")
        );
        assert!(arguments(&schema(), "[1]").is_err());
        assert!(arguments(&schema(), "NaN").is_err());
        let big = format!(r#"{{"a": 1, "b": "{}"}}"#, "x".repeat(MAX_ARGUMENT_BYTES));
        assert!(arguments(&schema(), &big).unwrap_err().contains("limit"));
    }
}
