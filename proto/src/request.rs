//! Parsing a JSON `todo_write` request into a [`WriteRequest`], with errors that name
//! the offending field (a path such as `ops[2].task.status`) and the values it allows.

use crate::{ApiError, ErrorCode, PatchOp, TaskPatch, WriteMode, WriteRequest};

/// Parses a JSON `todo_write` request into an [`ApiError`] that names the field (a path
/// such as `ops[2].task.status`) and, for enums and unknown fields, the allowed values.
///
/// Tagged enums hide paths from serde, so the envelope (`mode`, `ops[i].op`) is walked
/// here and each task is deserialized on its own.
pub fn parse_write_request(json: &str) -> Result<WriteRequest, ApiError> {
    use serde_json::Value;
    let v: Value = serde_json::from_str(json).map_err(|e| {
        api_error(
            ErrorCode::InvalidValue,
            None,
            format!("not JSON: {e}"),
            Vec::new(),
        )
    })?;
    let Value::Object(obj) = &v else {
        return Err(api_error(
            ErrorCode::InvalidValue,
            None,
            "a todo_write request is a JSON object".into(),
            Vec::new(),
        ));
    };
    let modes = vec!["replace".to_owned(), "patch".to_owned()];
    let mode = match obj.get("mode") {
        None => {
            return Err(api_error(
                ErrorCode::MissingField,
                Some("mode".into()),
                "say which mode the write uses".into(),
                modes,
            ))
        }
        Some(Value::String(m)) if modes.contains(m) => m.clone(),
        Some(other) => {
            return Err(api_error(
                ErrorCode::InvalidValue,
                Some("mode".into()),
                format!("unknown mode {other}"),
                modes,
            ))
        }
    };
    let keys: &[&str] = if mode == "replace" {
        &[
            "mode",
            "tasks",
            "base_version",
            "expected_version",
            "explanation",
        ]
    } else {
        &["mode", "ops", "expected_version", "explanation"]
    };
    reject_unknown_keys(obj, keys, None)?;
    let expected_version = typed_opt(obj.get("expected_version"), "expected_version")?;
    let explanation = typed_opt(obj.get("explanation"), "explanation")?;
    let mode = if mode == "replace" {
        let tasks = array(obj.get("tasks"), "tasks")?
            .iter()
            .enumerate()
            .map(|(i, t)| typed(t, &format!("tasks[{i}]")))
            .collect::<Result<Vec<TaskPatch>, ApiError>>()?;
        WriteMode::Replace {
            tasks,
            base_version: typed_opt(obj.get("base_version"), "base_version")?,
        }
    } else {
        let mut ops = Vec::new();
        for (i, op) in array(obj.get("ops"), "ops")?.iter().enumerate() {
            let at = format!("ops[{i}]");
            let Value::Object(o) = op else {
                return Err(api_error(
                    ErrorCode::InvalidValue,
                    Some(at),
                    "an op is an object with an \"op\" field".into(),
                    Vec::new(),
                ));
            };
            let kinds = vec!["upsert".to_owned(), "remove".to_owned(), "move".to_owned()];
            let kind = o.get("op").and_then(Value::as_str).unwrap_or_default();
            let op = match kind {
                "upsert" => {
                    reject_unknown_keys(o, &["op", "task"], Some(&at))?;
                    let task = o.get("task").ok_or_else(|| {
                        api_error(
                            ErrorCode::MissingField,
                            Some(format!("{at}.task")),
                            "an upsert carries the task's fields in \"task\"".into(),
                            Vec::new(),
                        )
                    })?;
                    PatchOp::Upsert {
                        task: typed(task, &format!("{at}.task"))?,
                    }
                }
                "remove" | "move" => {
                    let allowed: &[&str] = if kind == "remove" {
                        &["op", "id"]
                    } else {
                        &["op", "id", "after"]
                    };
                    reject_unknown_keys(o, allowed, Some(&at))?;
                    let id: String =
                        typed(o.get("id").unwrap_or(&Value::Null), &format!("{at}.id"))?;
                    if kind == "remove" {
                        PatchOp::Remove { id }
                    } else {
                        PatchOp::Move {
                            id,
                            after: typed_opt(o.get("after"), &format!("{at}.after"))?,
                        }
                    }
                }
                _ => {
                    return Err(api_error(
                        ErrorCode::InvalidValue,
                        Some(format!("{at}.op")),
                        format!("unknown op {:?}", o.get("op")),
                        kinds,
                    ))
                }
            };
            ops.push(op);
        }
        WriteMode::Patch { ops }
    };
    Ok(WriteRequest {
        mode,
        expected_version,
        explanation,
    })
}

fn api_error(
    code: ErrorCode,
    field: Option<String>,
    what: String,
    allowed: Vec<String>,
) -> ApiError {
    ApiError {
        code,
        field,
        allowed,
        message: format!("{what}: fix the request and send it again"),
        current: None,
    }
}

fn reject_unknown_keys(
    obj: &serde_json::Map<String, serde_json::Value>,
    allowed: &[&str],
    at: Option<&str>,
) -> Result<(), ApiError> {
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(api_error(
            ErrorCode::InvalidValue,
            Some(match at {
                Some(at) => format!("{at}.{k}"),
                None => k.clone(),
            }),
            format!("unknown field {k:?}"),
            allowed.iter().map(|s| (*s).to_owned()).collect(),
        ));
    }
    Ok(())
}

fn array<'v>(
    v: Option<&'v serde_json::Value>,
    at: &str,
) -> Result<&'v Vec<serde_json::Value>, ApiError> {
    match v {
        Some(serde_json::Value::Array(a)) => Ok(a),
        None => Err(api_error(
            ErrorCode::MissingField,
            Some(at.into()),
            format!("{at} is required"),
            Vec::new(),
        )),
        Some(_) => Err(api_error(
            ErrorCode::InvalidValue,
            Some(at.into()),
            format!("{at} must be an array"),
            Vec::new(),
        )),
    }
}

fn typed_opt<T: serde::de::DeserializeOwned>(
    v: Option<&serde_json::Value>,
    at: &str,
) -> Result<Option<T>, ApiError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => typed(v, at).map(Some),
    }
}

/// Deserializes one value, turning serde's error into an [`ApiError`] at `at` + the
/// path inside the value, with the allowed values serde lists.
fn typed<T: serde::de::DeserializeOwned>(v: &serde_json::Value, at: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner_path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let field = if inner_path == "." {
            at.to_owned()
        } else {
            format!("{at}.{inner_path}")
        };
        let allowed: Vec<String> = inner
            .split_once("expected one of ")
            .or_else(|| inner.split_once("expected "))
            .map(|(_, rest)| {
                rest.split(", ")
                    .filter_map(|s| s.split('`').nth(1))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let code = if inner.starts_with("missing field") {
            ErrorCode::MissingField
        } else {
            ErrorCode::InvalidValue
        };
        api_error(code, Some(field), inner, allowed)
    })
}

/// A [`WriteRequest`] inside another serde value as its JSON text, read back by
/// [`parse_write_request`] (the derived `Deserialize` cannot take the flattened mode
/// beside `deny_unknown_fields`): `#[serde(with = "swarmtodo_proto::write_request_as_json")]`.
pub mod as_json {
    use super::parse_write_request;
    use crate::WriteRequest;

    /// Writes the request as its JSON text.
    pub fn serialize<S: serde::Serializer>(r: &WriteRequest, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(r).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    /// Reads the request from its JSON text, checked as a caller's would be.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<WriteRequest, D::Error> {
        let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        parse_write_request(&text).map_err(serde::de::Error::custom)
    }
}
