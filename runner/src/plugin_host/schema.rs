//! A tool's `input_schema` is checked against the JSON Schema meta-schema when its plugin
//! loads: one plugin with a broken schema would otherwise make MCP clients reject the whole
//! tool list.

use serde_json::Value;

/// Why `schema` is not a usable JSON Schema, in one line; `None` when it is.
pub(super) fn problem(schema: &Value) -> Option<String> {
    if let Err(e) = jsonschema::meta::validate(schema) {
        let at = e.instance_path().to_string();
        let at = if at.is_empty() {
            "the root".to_owned()
        } else {
            at
        };
        return Some(format!("invalid JSON Schema at {at}: {e}"));
    }
    // The meta-schema does not check everything a validator needs (regex syntax, $refs).
    jsonschema::validator_for(schema)
        .err()
        .map(|e| format!("unusable JSON Schema: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelled_type_is_refused_and_a_good_schema_passes() {
        let bad = problem(&json!({"type": "objekt"})).unwrap_or_default();
        assert!(bad.contains("objekt"), "{bad}");
        assert!(!bad.contains('\n'), "{bad}");
        assert_eq!(
            problem(&json!({"type": "object", "properties": {"command": {"type": "string"}}})),
            None
        );
        assert!(problem(&json!({"type": "string", "pattern": "(["})).is_some());
    }
}
