//! Which request fields each endpoint implements. A field outside them is refused with a
//! 400 naming it, as OpenAI's API refuses an unrecognized argument: a client that asks for
//! tools or a suffix gets an error, never an answer that silently is not
//! what it asked for. `user` (an end-user id kept for abuse monitoring) is the one field
//! accepted and ignored. Chat implements tools; completions refuse them.
//!
//! The fields implemented are the serde request types' (`request.rs`): [`Generation`]'s for
//! both endpoints, and each endpoint's own struct's.

use super::error::ApiError;
use super::params::kind;
use super::request::{fields_of, Generation};
use serde_json::{Map, Value};

/// Fields accepted and ignored: they change nothing a client gets back.
pub const IGNORED: [&str; 1] = ["user"];

/// Fields of OpenAI's API (or vLLM's) that this server does not implement, with what the
/// refusal says; a neutral value (absent, null, an empty list, `"none"`) is accepted.
fn not_implemented(key: &str, v: &Value, n: usize) -> Option<&'static str> {
    let neutral = match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty() || (key == "tool_choice" && s == "none"),
        _ => false,
    };
    if neutral {
        return None;
    }
    Some(match key {
        "tools" | "tool_choice" | "parallel_tool_calls" => "tools are for /v1/chat/completions",
        "functions" | "function_call" => "OpenAI's deprecated functions: send `tools` and `tool_choice`",
        "guided_grammar" | "guided_decoding_backend" => {
            "grammars other than a JSON schema, a regular expression or a choice are not implemented by this server"
        }
        // best_of = n draws exactly the n choices asked for
        "best_of" if v.as_u64().is_some_and(|b| b as usize == n) => return None,
        "best_of" => "`best_of` (drawing more choices than returned) is not implemented by this server",
        "suffix" => "`suffix` (text after the completion, for insertion) is not implemented by this server",
        _ => return None,
    })
}

/// Refuses every field of `body` that the endpoint does not implement: its own fields are
/// `own` (its request struct's, [`fields_of`]) besides [`Generation`]'s and [`IGNORED`].
pub fn check(body: &Map<String, Value>, own: &[&str]) -> Result<(), ApiError> {
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1) as usize;
    let common = fields_of::<Generation>();
    for (key, v) in body {
        if common.contains(&key.as_str()) || IGNORED.contains(&key.as_str()) || own.contains(&key.as_str()) {
            continue;
        }
        if let Some(why) = not_implemented(key, v, n) {
            return Err(ApiError::invalid(key, format!("`{key}` ({}): {why}", short(v))));
        }
        let known = ["best_of", "suffix", "tools", "tool_choice", "functions", "function_call"];
        if known.contains(&key.as_str()) || key == "parallel_tool_calls" || key.starts_with("guided_") {
            continue; // a neutral value
        }
        return Err(ApiError::invalid(
            key,
            format!("Unrecognized request argument supplied: `{key}` (this server does not implement it)"),
        ));
    }
    Ok(())
}

/// A value shown in a refusal: its JSON kind, or a short string.
fn short(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() <= 40 => format!("\"{s}\""),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}

/// The roles a chat message may have here; `tool` needs tool calling.
pub fn check_role(i: usize, role: &str) -> Result<(), ApiError> {
    let param = format!("messages[{i}].role");
    match role {
        "system" | "developer" | "user" | "assistant" | "tool" => Ok(()),
        "function" => Err(ApiError::invalid(
            &param,
            format!("`{param}`: `function` messages are OpenAI's deprecated form: send `tool` messages"),
        )),
        other => Err(ApiError::invalid(
            &param,
            format!("`{param}`: `{other}` is not a role (system, developer, user, assistant or tool)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_c(v: Value) -> Result<(), ApiError> {
        check(v.as_object().unwrap(), &["prompt", "echo"])
    }

    #[test]
    fn fields_not_implemented_are_refused_by_name_and_neutral_ones_pass() {
        let ok = json!({"model": "m", "prompt": "a", "max_tokens": 3, "user": "u-1", "best_of": 2, "n": 2,
            "suffix": null, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}});
        check_c(ok).unwrap();
        for (body, param) in [
            (json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}), "tools"),
            (json!({"prompt": "a", "tool_choice": "auto"}), "tool_choice"),
            (json!({"prompt": "a", "guided_grammar": "root ::= x"}), "guided_grammar"),
            (json!({"prompt": "a", "best_of": 3}), "best_of"),
            (json!({"prompt": "a", "suffix": "end"}), "suffix"),
            (json!({"prompt": "a", "ignore_eos": true}), "ignore_eos"),
            (json!({"prompt": "a", "wizardry": 1}), "wizardry"),
        ] {
            let e = check_c(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
            assert_eq!(e.status.as_u16(), 400);
        }
        // a chat field is unknown to completions
        assert_eq!(check_c(json!({"prompt": "a", "messages": []})).unwrap_err().param.as_deref(), Some("messages"));
    }

    #[test]
    fn chat_roles_are_openai_s_five() {
        for r in ["system", "developer", "user", "assistant", "tool"] {
            check_role(0, r).unwrap();
        }
        let e = check_role(2, "wizard").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[2].role"));
        assert!(e.message.contains("wizard"));
        assert!(check_role(1, "function").unwrap_err().message.contains("tool"));
    }
}
