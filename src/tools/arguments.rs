//! A tool's arguments checked against its input schema before its handler reads them (#45.6), so
//! a wrong call is answered with which argument is wrong and what is expected (`timeout_ms must be
//! an integer from 1 to 86400000; got the string "5000"`) instead of serde's text, as a tool error
//! the model can correct (SEP-1303). The schemas are the plain ones of [`super::schema::input`]:
//! one type per property, no references. On the way, `null` for an optional argument is taken as
//! leaving it out (strict-mode models send every argument), and a whole number written with a
//! fraction (`5000.0`) as that integer.

use serde_json::{Map, Value};

/// Checks `arguments` against `schema`, normalizing them as the module's doc says; the error names
/// the first argument that is wrong.
pub fn check(
    schema: &Map<String, Value>,
    arguments: &mut Map<String, Value>,
) -> Result<(), String> {
    object(schema, arguments, "")
}

fn object(
    schema: &Map<String, Value>,
    value: &mut Map<String, Value>,
    at: &str,
) -> Result<(), String> {
    let properties = schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    value.retain(|name, v| !v.is_null() || required.contains(&name.as_str()));
    for name in &required {
        if !value.contains_key(*name) {
            let expected = properties
                .and_then(|p| p.get(*name))
                .and_then(Value::as_object)
                .map(expectation)
                .unwrap_or_else(|| "a value".into());
            return Err(format!(
                "missing required argument `{}` ({expected})",
                path(at, name)
            ));
        }
    }
    let Some(properties) = properties else {
        return Ok(());
    };
    for (name, v) in value.iter_mut() {
        if let Some(property) = properties.get(name).and_then(Value::as_object) {
            one(property, v, &path(at, name))?;
        }
    }
    Ok(())
}

fn one(schema: &Map<String, Value>, value: &mut Value, at: &str) -> Result<(), String> {
    let wrong = |value: &Value| {
        Err(format!(
            "argument `{at}` must be {}; got {}",
            expectation(schema),
            shown(value)
        ))
    };
    match schema.get("type").and_then(Value::as_str) {
        Some("string") if !value.is_string() => wrong(value),
        Some("boolean") if !value.is_boolean() => wrong(value),
        Some("number") if !value.is_number() => wrong(value),
        Some("integer") => {
            if let Some(whole) = value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && !value.is_i64() && !value.is_u64())
                .filter(|f| f.abs() < 9.0e15)
            {
                *value = Value::from(whole as i64);
            }
            let Some(n) = value
                .as_i64()
                .map(i128::from)
                .or(value.as_u64().map(i128::from))
            else {
                return wrong(value);
            };
            let min = schema.get("minimum").and_then(Value::as_i64);
            let max = schema.get("maximum").and_then(Value::as_i64);
            if min.is_some_and(|m| n < i128::from(m)) || max.is_some_and(|m| n > i128::from(m)) {
                return wrong(value);
            }
            Ok(())
        }
        Some("array") => {
            let Value::Array(items) = value else {
                return wrong(value);
            };
            if let Some(item) = schema.get("items").and_then(Value::as_object) {
                for (i, v) in items.iter_mut().enumerate() {
                    one(item, v, &format!("{at}[{i}]"))?;
                }
            }
            Ok(())
        }
        Some("object") => match value {
            Value::Object(map) => object(schema, map, at),
            _ => wrong(value),
        },
        _ => Ok(()),
    }
}

fn path(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

/// What a schema expects, in words: `an integer from 1 to 86400000`, `a string`, `an array of
/// objects with path and content_base64`.
fn expectation(schema: &Map<String, Value>) -> String {
    let kind = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("value");
    match kind {
        "integer" | "number" => {
            let word = if kind == "integer" {
                "an integer"
            } else {
                "a number"
            };
            let min = schema.get("minimum").and_then(Value::as_i64);
            let max = schema.get("maximum").and_then(Value::as_i64);
            match (min, max) {
                (Some(min), Some(max)) => format!("{word} from {min} to {max}"),
                (Some(min), None) => format!("{word} of at least {min}"),
                (None, Some(max)) => format!("{word} of at most {max}"),
                (None, None) => word.to_string(),
            }
        }
        "array" => match schema.get("items").and_then(Value::as_object) {
            Some(item) => format!("an array of {}", plural(&expectation(item))),
            None => "an array".into(),
        },
        "object" => match schema.get("required").and_then(Value::as_array) {
            Some(required) if !required.is_empty() => {
                let names: Vec<&str> = required.iter().filter_map(Value::as_str).collect();
                format!("an object with {}", names.join(" and "))
            }
            _ => "an object".into(),
        },
        "string" => "a string".into(),
        "boolean" => "true or false".into(),
        other => format!("a {other}"),
    }
}

fn plural(expected: &str) -> String {
    let bare = expected
        .strip_prefix("an ")
        .or_else(|| expected.strip_prefix("a "))
        .unwrap_or(expected);
    match bare.split_once(' ') {
        Some((noun, rest)) => format!("{noun}s {rest}"),
        None => format!("{bare}s"),
    }
}

/// A value as the error shows it: its kind, and short values themselves.
fn shown(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() <= 40 => format!("the string {value}"),
        Value::String(s) => format!("a string of {} characters", s.chars().count()),
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Map<String, Value> {
        json!({"type": "object", "required": ["code"], "properties": {
            "code": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 86400000},
            "session_id": {"type": "string"},
            "files": {"type": "array", "items": {"type": "object",
                "required": ["path", "content_base64"], "properties": {
                    "path": {"type": "string"}, "content_base64": {"type": "string"}}}},
        }})
        .as_object()
        .unwrap()
        .clone()
    }

    fn checked(arguments: Value) -> Result<Value, String> {
        let mut map = arguments.as_object().unwrap().clone();
        check(&schema(), &mut map).map(|()| Value::Object(map))
    }

    #[test]
    fn a_wrong_argument_is_named_with_what_is_expected() {
        for (arguments, message) in [
            (
                json!({"code": "1", "timeout_ms": "5000"}),
                "argument `timeout_ms` must be an integer from 1 to 86400000; got the string \"5000\"",
            ),
            (
                json!({"code": "1", "timeout_ms": 0}),
                "argument `timeout_ms` must be an integer from 1 to 86400000; got the number 0",
            ),
            (json!({}), "missing required argument `code` (a string)"),
            (
                json!({"code": 5}),
                "argument `code` must be a string; got the number 5",
            ),
            (
                json!({"code": "1", "files": {"path": "a"}}),
                "argument `files` must be an array of objects with path and content_base64; got an object",
            ),
            (
                json!({"code": "1", "files": [{"path": "a"}]}),
                "missing required argument `files[0].content_base64` (a string)",
            ),
            (
                json!({"code": "1", "session_id": 7}),
                "argument `session_id` must be a string; got the number 7",
            ),
        ] {
            assert_eq!(checked(arguments).unwrap_err(), message);
        }
    }

    #[test]
    fn nulls_and_whole_numbers_are_normalized() {
        assert_eq!(
            checked(json!({"code": "1", "timeout_ms": null, "session_id": null, "x": 1})).unwrap(),
            json!({"code": "1", "x": 1})
        );
        assert_eq!(
            checked(json!({"code": "1", "timeout_ms": 5000.0})).unwrap(),
            json!({"code": "1", "timeout_ms": 5000})
        );
        assert!(
            checked(json!({"code": null})).is_err(),
            "a required null stays wrong"
        );
    }
}
