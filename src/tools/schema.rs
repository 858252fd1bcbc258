//! Tool schemas in the subset every client's dialect reads (#45.5). schemars writes JSON Schema
//! 2020-12 as Rust sees a type: `"format": "uint64"` (which the TypeScript SDKs' validator warns
//! about), `"default": null` and `["string", "null"]` for an `Option` (single-type dialects such as
//! Gemini's function declarations take one type), and `$ref`s into `$defs` (which openai-agents'
//! strict conversion refuses). [`input`] makes an input schema plain: references inlined, one type
//! per property, no null defaults, only standard formats. [`output`] only drops non-standard formats:
//! an output schema validates the result, so its nullable types stay.

use serde_json::{Map, Value};

/// The `format` values JSON Schema 2020-12 defines; any other (schemars' `uint64`, `int32`,
/// `double`, …) is dropped.
const STANDARD_FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// How deep references are inlined; a schema nested deeper (a recursive type) keeps its `$ref`s.
const MAX_DEPTH: usize = 16;

/// An input schema every client reads alike (see the module's doc).
pub fn input(schema: &Map<String, Value>) -> Map<String, Value> {
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut plain = Value::Object(schema.clone());
    inline(&mut plain, &defs, 0);
    simplify(&mut plain);
    let mut plain = match plain {
        Value::Object(map) => map,
        _ => schema.clone(),
    };
    if !mentions_ref(&Value::Object(plain.clone())) {
        plain.remove("$defs");
    }
    plain
}

/// An output schema without non-standard formats.
pub fn output(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut value = Value::Object(schema.clone());
    drop_formats(&mut value);
    match value {
        Value::Object(map) => map,
        _ => schema.clone(),
    }
}

/// Replaces each `{"$ref": "#/$defs/X", ...}` by X's schema (the sibling keys kept over it).
fn inline(value: &mut Value, defs: &Map<String, Value>, depth: usize) {
    match value {
        Value::Object(map) => {
            if depth < MAX_DEPTH
                && let Some(target) = map
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.strip_prefix("#/$defs/"))
                    .and_then(|name| defs.get(name))
                    .and_then(Value::as_object)
            {
                let mut merged = target.clone();
                map.remove("$ref");
                for (key, v) in std::mem::take(map) {
                    merged.insert(key, v);
                }
                *map = merged;
                inline(value, defs, depth + 1);
                return;
            }
            for (key, child) in map.iter_mut() {
                if key != "$defs" {
                    inline(child, defs, depth);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| inline(i, defs, depth)),
        _ => {}
    }
}

/// One type per schema (`[T, "null"]` becomes T), no `"default": null`, only standard formats.
fn simplify(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get("type") {
                let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if non_null.len() == 1 {
                    map.insert("type".into(), non_null[0].clone());
                }
            }
            if map.get("default").is_some_and(Value::is_null) {
                map.remove("default");
            }
            drop_format(map);
            map.values_mut().for_each(simplify);
        }
        Value::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

fn drop_formats(value: &mut Value) {
    match value {
        Value::Object(map) => {
            drop_format(map);
            map.values_mut().for_each(drop_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_formats),
        _ => {}
    }
}

fn drop_format(map: &mut Map<String, Value>) {
    // (A property named "format" is a schema under "properties", not a string: left alone.)
    if let Some(Value::String(format)) = map.get("format")
        && !STANDARD_FORMATS.contains(&format.as_str())
    {
        map.remove("format");
    }
}

fn mentions_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| (k == "$ref") || (k != "$defs" && mentions_ref(v))),
        Value::Array(items) => items.iter().any(mentions_ref),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn input_schemas_are_plain() {
        let schema = object(json!({
            "$defs": {"File": {"type": "object", "properties": {
                "path": {"type": "string"}}, "required": ["path"]}},
            "type": "object",
            "properties": {
                "files": {"type": "array", "items": {"$ref": "#/$defs/File"}, "default": []},
                "timeout_ms": {"type": "integer", "format": "uint64", "minimum": 1},
                "when": {"type": "string", "format": "date-time"},
                "session_id": {"type": ["string", "null"], "default": null},
                "format": {"type": "string"},
            }
        }));
        let plain = input(&schema);
        assert_eq!(
            Value::Object(plain),
            json!({
                "type": "object",
                "properties": {
                    "files": {"type": "array", "default": [], "items": {"type": "object",
                        "properties": {"path": {"type": "string"}}, "required": ["path"]}},
                    "timeout_ms": {"type": "integer", "minimum": 1},
                    "when": {"type": "string", "format": "date-time"},
                    "session_id": {"type": "string"},
                    "format": {"type": "string"},
                }
            })
        );
    }

    #[test]
    fn a_recursive_reference_is_kept_with_its_definitions() {
        let schema = object(json!({
            "$defs": {"Node": {"type": "object", "properties": {
                "child": {"$ref": "#/$defs/Node"}}}},
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}}
        }));
        let plain = input(&schema);
        assert!(plain.contains_key("$defs"), "{plain:?}");
    }

    #[test]
    fn output_schemas_keep_their_nullable_types() {
        let schema = object(json!({"type": "object", "properties": {
            "bytes": {"type": "integer", "format": "uint64"},
            "result": {"type": ["string", "null"]}}}));
        assert_eq!(
            Value::Object(output(&schema)),
            json!({"type": "object", "properties": {
                "bytes": {"type": "integer"},
                "result": {"type": ["string", "null"]}}})
        );
    }
}
