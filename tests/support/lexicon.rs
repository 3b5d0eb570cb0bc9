//! A strict validator of JSON values against lexicon defs, for the part of the schema language the
//! lexicons in `lexicons/` use: object, array, string with formats and known values, integer,
//! boolean, ref, union, unknown; required and nullable; a query's output and a subscription's
//! message. It is strict where lexicons are lenient, so the lexicons must document everything the
//! server says:
//! - a field the schema does not declare is an error;
//! - a string outside its `knownValues` is an error;
//! - a union value must match exactly one of its refs, open or closed (the frames validated here
//!   carry no `$type`: their shapes, and their `op`, tell them apart).
#![allow(dead_code)] // each test that includes it uses a part

use backlinks::model::syntax::{LinkTarget, parse_target, validate_did, validate_nsid, validate_record_key};
use backlinks::server::LEXICONS;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Deepest schema nesting the validator follows (refs included), so a cyclic ref cannot loop.
pub const MAX_DEPTH: usize = 32;

pub struct Lexicons {
    by_id: HashMap<String, Value>,
}

impl Lexicons {
    /// The query lexicons (`LEXICONS`).
    pub fn load() -> Self {
        Self::of(&LEXICONS)
    }

    /// The lexicons given as (id, JSON text).
    pub fn of(lexicons: &[(&str, &str)]) -> Self {
        let by_id = lexicons.iter().map(|(id, text)| (id.to_string(), serde_json::from_str(text).unwrap())).collect();
        Lexicons { by_id }
    }

    pub fn output_schema(&self, id: &str) -> &Value {
        &self.by_id[id]["defs"]["main"]["output"]["schema"]
    }

    /// Checks one message of the subscription `id` against its `main` def's message union;
    /// returns the ref it matched (`#link`).
    pub fn validate_message(&self, id: &str, value: &Value) -> Result<String, String> {
        let main = &self.by_id.get(id).ok_or_else(|| format!("no lexicon {id:?}"))?["defs"]["main"];
        if main["type"] != "subscription" {
            return Err(format!("{id} is not a subscription"));
        }
        let schema = &main["message"]["schema"];
        if schema["type"] != "union" {
            return Err(format!("{id}: a subscription's message schema is a union, not {}", schema["type"]));
        }
        self.union_member(schema, value, &At::root(id))
    }

    /// Resolves `#name` (in `current`), `nsid#name` or `nsid` (its main).
    fn resolve(&self, current: &str, reference: &str) -> Result<(String, &Value), String> {
        let (id, name) = match reference.split_once('#') {
            Some(("", name)) => (current, name),
            Some((id, name)) => (id, name),
            None => (reference, "main"),
        };
        let def = self.by_id.get(id).map(|lexicon| &lexicon["defs"][name]).filter(|d| !d.is_null());
        def.map(|d| (id.to_string(), d)).ok_or_else(|| format!("unresolved ref {reference:?}"))
    }

    /// Checks `value` against `schema`, a def of the lexicon `id` (its refs resolve there).
    pub fn validate(&self, id: &str, schema: &Value, value: &Value) -> Result<(), String> {
        self.check(schema, value, &At::root(id))
    }

    fn check(&self, schema: &Value, value: &Value, at: &At) -> Result<(), String> {
        if at.depth > MAX_DEPTH {
            return Err(format!("{}: schema nesting deeper than {MAX_DEPTH}", at.path));
        }
        let path = &at.path;
        let fail = |what: String| Err(format!("{path}: {what}"));
        match schema["type"].as_str().unwrap_or("") {
            "object" => self.check_object(schema, value, at),
            "array" => {
                let Some(items) = value.as_array() else { return fail(format!("expected an array, got {value}")) };
                check_length(schema, items.len(), path)?;
                for (i, item) in items.iter().enumerate() {
                    self.check(&schema["items"], item, &at.within(&format!("[{i}]")))?;
                }
                Ok(())
            }
            "string" => {
                let Some(text) = value.as_str() else { return fail(format!("expected a string, got {value}")) };
                check_length(schema, text.len(), path)?;
                check_known(schema, value, path)?;
                check_format(schema["format"].as_str(), text).map_err(|e| format!("{path}: {e}"))
            }
            "integer" => {
                let Some(n) = value.as_i64() else { return fail(format!("expected an integer, got {value}")) };
                let below = schema["minimum"].as_i64().is_some_and(|min| n < min);
                let above = schema["maximum"].as_i64().is_some_and(|max| n > max);
                if below || above { fail(format!("{n} is out of range")) } else { Ok(()) }
            }
            "boolean" if value.is_boolean() => Ok(()),
            "boolean" => fail(format!("expected a boolean, got {value}")),
            "unknown" if value.is_object() => Ok(()),
            "unknown" => fail(format!("unknown must be an object, got {value}")),
            "ref" => {
                let reference = schema["ref"].as_str().ok_or_else(|| format!("{path}: ref without a target"))?;
                let (id, def) = self.resolve(&at.lexicon, reference)?;
                self.check(def, value, &at.referring(id))
            }
            "union" => self.union_member(schema, value, at).map(|_| ()),
            other => fail(format!("unsupported schema type {other:?}")),
        }
    }

    /// The one ref of the union `schema` that `value` matches.
    fn union_member(&self, schema: &Value, value: &Value, at: &At) -> Result<String, String> {
        let refs: Vec<&str> = schema["refs"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if refs.is_empty() {
            return Err(format!("{}: a union without refs", at.path));
        }
        let (mut matched, mut errors) = (vec![], vec![]);
        for reference in refs {
            let (id, def) = self.resolve(&at.lexicon, reference)?;
            match self.check(def, value, &at.referring(id)) {
                Ok(()) => matched.push(reference),
                Err(error) => errors.push(format!("{reference}: {error}")),
            }
        }
        match matched[..] {
            [one] => Ok(one.to_string()),
            [] => Err(format!("{}: matches none of the union's refs ({})", at.path, errors.join("; "))),
            _ => Err(format!("{}: matches more than one of the union's refs ({})", at.path, matched.join(", "))),
        }
    }

    fn check_object(&self, schema: &Value, value: &Value, at: &At) -> Result<(), String> {
        let path = &at.path;
        let Some(object) = value.as_object() else { return Err(format!("{path}: expected an object, got {value}")) };
        let names = |key: &str| -> Vec<&str> {
            schema[key].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
        };
        let (required, nullable) = (names("required"), names("nullable"));
        let properties = schema["properties"].as_object().cloned().unwrap_or_else(Map::new);
        for name in &required {
            if !object.contains_key(*name) {
                return Err(format!("{path}: missing required field {name:?}"));
            }
        }
        for (name, field) in object {
            let field_at = at.within(&format!(".{name}"));
            let Some(field_schema) = properties.get(name) else {
                return Err(format!("{}: field not declared in the lexicon", field_at.path));
            };
            if field.is_null() {
                if !nullable.contains(&name.as_str()) {
                    return Err(format!("{}: null but not nullable", field_at.path));
                }
                continue;
            }
            self.check(field_schema, field, &field_at)?;
        }
        Ok(())
    }
}

/// Where a check is: the lexicon its refs resolve in, the place in the value its errors name,
/// and how deep in the schema it is.
struct At {
    lexicon: String,
    path: String,
    depth: usize,
}

impl At {
    fn root(lexicon: &str) -> At {
        At { lexicon: lexicon.to_string(), path: "$".to_string(), depth: 0 }
    }

    /// A part of the value here (`.name`, `[i]`).
    fn within(&self, part: &str) -> At {
        At { lexicon: self.lexicon.clone(), path: format!("{}{part}", self.path), depth: self.depth + 1 }
    }

    /// The same place, checked against a def of the lexicon `id`.
    fn referring(&self, id: String) -> At {
        At { lexicon: id, path: self.path.clone(), depth: self.depth + 1 }
    }
}

fn check_length(schema: &Value, len: usize, path: &str) -> Result<(), String> {
    let too_short = schema["minLength"].as_u64().is_some_and(|min| (len as u64) < min);
    let too_long = schema["maxLength"].as_u64().is_some_and(|max| (len as u64) > max);
    if too_short || too_long { Err(format!("{path}: length {len} out of bounds")) } else { Ok(()) }
}

/// A string with `knownValues` must be one of them.
fn check_known(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    match schema["knownValues"].as_array() {
        Some(known) if !known.contains(value) => {
            Err(format!("{path}: {value} is not one of the known values {known:?}"))
        }
        _ => Ok(()),
    }
}

fn check_format(format: Option<&str>, text: &str) -> Result<(), String> {
    match format {
        None => Ok(()),
        Some("did") => validate_did(text).map_err(|e| format!("not a did: {e}")),
        Some("nsid") => validate_nsid(text).map_err(|e| format!("not an nsid: {e}")),
        Some("record-key") => validate_record_key(text).map_err(|e| format!("not a record key: {e}")),
        // A target may also be a bare DID or a URL: an at-uri is neither.
        Some("at-uri") => match parse_target(text).map_err(|e| format!("not an at-uri: {e}"))? {
            LinkTarget::Record { .. } | LinkTarget::Did(_) if text.starts_with("at://") => Ok(()),
            _ => Err("not an at-uri".into()),
        },
        Some(other) => Err(format!("unsupported format {other:?}")),
    }
}
