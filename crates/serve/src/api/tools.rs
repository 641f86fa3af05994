//! Tool calling on chat completions: `tools`, `tool_choice` and `parallel_tool_calls`
//! checked; the grammar that holds a reply to calls where the choice requires one; and the
//! reply's calls read back into OpenAI's `tool_calls`, whole or as stream deltas.

use quench_text::{ParsedReply, ToolCall, ToolFormat};
use serde_json::{json, Value};

use super::ApiError;

/// Most tools a request may define.
const MAX_TOOLS: usize = 128;

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ToolChoice {
    /// The model decides: calls are read from its reply when it makes them.
    Auto,
    /// The reply is one or more calls.
    Required,
    /// The reply is a call of this function.
    Named(String),
}

/// A request's tools, checked.
#[derive(Debug, Clone)]
pub(super) struct ToolRequest {
    /// As the client sent them (templates read OpenAI's shape).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// Whether a reply may hold several calls (under `"required"`; a named choice gets one).
    pub parallel: bool,
}

impl ToolRequest {
    /// The grammar (llguidance's Lark) that a reply must follow in `format`: calls only,
    /// where the choice requires one; `None` where the model may answer in text.
    pub fn grammar(&self, format: ToolFormat) -> Option<String> {
        // A named choice asks for that function's call: one.
        let (chosen, parallel): (Vec<&Value>, bool) = match &self.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => (self.tools.iter().collect(), self.parallel),
            ToolChoice::Named(name) => (
                self.tools
                    .iter()
                    .filter(|t| t["function"]["name"].as_str() == Some(name))
                    .collect(),
                false,
            ),
        };
        Some(format.call_grammar(&chosen, parallel))
    }
}

/// A name OpenAI takes for a function or a schema: 1 to 64 letters, digits, `_` or `-`.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`. No tools (or an empty list),
/// or a choice of `"none"`, ask for nothing: `None`.
pub(super) fn check_tools(
    tools: Option<Vec<Value>>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolRequest>, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "tools holds {} tools; at most {MAX_TOOLS} are taken",
                tools.len()
            ),
        ));
    }
    let mut names: Vec<&str> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(
                format!("tools[{i}].function"),
                format!("tools[{i}].function must be an object with a name"),
            ));
        };
        let name = match f.get("name").and_then(Value::as_str) {
            Some(n) if valid_name(n) => n,
            _ => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    format!("tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-'"),
                ))
            }
        };
        if names.contains(&name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("tools[{i}].function.name {name:?} names an earlier tool too"),
            ));
        }
        names.push(name);
        match f.get("parameters") {
            None | Some(Value::Null | Value::Object(_)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    format!("tools[{i}].function.parameters must be a JSON Schema object"),
                ))
            }
        }
    }
    let choice = match choice {
        None | Some(Value::Null) if tools.is_empty() => return Ok(None),
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice.function.name",
                        "tool_choice.function.name is required",
                    )
                })?;
            if !names.contains(&name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!("tool_choice names {name:?}, which is not among tools"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, not {other}"
                ),
            ))
        }
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice asks for a tool call, and tools is empty",
        ));
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// An assistant message's `tool_calls`, as a client sends them back.
pub(super) fn read_calls(i: usize, given: &[Value]) -> Result<Vec<ToolCall>, ApiError> {
    given
        .iter()
        .enumerate()
        .map(|(j, c)| {
            serde_json::from_value::<ToolCall>(c.clone()).map_err(|e| {
                ApiError::invalid(
                    format!("messages[{i}].tool_calls[{j}]"),
                    format!(
                        "messages[{i}].tool_calls[{j}] must be {{\"id\", \"type\": \"function\", \
                         \"function\": {{\"name\", \"arguments\"}}}}: {e}"
                    ),
                )
            })
        })
        .collect()
}

/// A fresh id for a call.
fn call_id() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

/// One call as OpenAI writes it, the arguments as a string of JSON; with `index` for a
/// stream delta.
fn call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments.to_string()},
    });
    if let Some(i) = index {
        v["index"] = i.into();
    }
    v
}

/// A whole reply's message and finish reason: its calls, if it made any, as
/// `tool_calls` (with `finish_reason: "tool_calls"` unless it ran out of room); a call that
/// could not be read leaves the reply as content with `tool_call_error` saying why.
pub(super) fn reply_message(format: ToolFormat, text: &str, finish: &str) -> (Value, String) {
    let ParsedReply {
        content,
        calls,
        malformed,
    } = format.parse(text);
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(why) = malformed {
        message["tool_call_error"] = why.into();
        return (message, finish.to_string());
    }
    if calls.is_empty() {
        return (message, finish.to_string());
    }
    if content.is_empty() {
        message["content"] = Value::Null;
    }
    message["tool_calls"] = calls.iter().map(|c| call_json(c, None)).collect();
    (message, calls_finish(finish))
}

fn calls_finish(finish: &str) -> String {
    if finish == "length" {
        finish.to_string()
    } else {
        "tool_calls".to_string()
    }
}

/// A streamed reply's text split into content deltas and call deltas as it comes: text
/// that cannot be part of a call goes out at once; a call goes out whole, as one delta,
/// once it is complete.
pub(super) struct CallStream {
    format: ToolFormat,
    /// Text received and not yet sent.
    held: String,
    /// Calls sent so far.
    calls: usize,
    /// Set once text went out in Llama 3's form, where a call is a whole reply: the rest
    /// is text too.
    plain: bool,
}

impl CallStream {
    pub fn new(format: ToolFormat) -> CallStream {
        CallStream {
            format,
            held: String::new(),
            calls: 0,
            plain: false,
        }
    }

    /// The deltas `text` makes ready to send (each a chat `delta` object).
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let sure = if self.plain {
                self.held.len()
            } else {
                self.format.content_until(&self.held)
            };
            if sure > 0 {
                self.plain = self.format == ToolFormat::Llama3;
                let content: String = self.held.drain(..sure).collect();
                out.push(json!({"content": content}));
            }
            // A Hermes block goes once its closing tag is in.
            let Some(end) = (self.format == ToolFormat::Hermes)
                .then(|| self.held.find("</tool_call>"))
                .flatten()
            else {
                return out;
            };
            let block: String = self.held.drain(..end + "</tool_call>".len()).collect();
            out.extend(self.deltas(&block));
        }
    }

    /// The deltas of what is held at the end of the reply, and the finish reason.
    pub fn finish(&mut self, finish: &str) -> (Vec<Value>, String) {
        let rest = std::mem::take(&mut self.held);
        let out = if rest.is_empty() {
            Vec::new()
        } else {
            self.deltas(&rest)
        };
        let finish = if self.calls > 0 {
            calls_finish(finish)
        } else {
            finish.to_string()
        };
        (out, finish)
    }

    fn deltas(&mut self, text: &str) -> Vec<Value> {
        let parsed = self.format.parse(text);
        let mut out = Vec::new();
        if let Some(why) = parsed.malformed {
            out.push(json!({"content": text, "tool_call_error": why}));
            return out;
        }
        if !parsed.content.is_empty() {
            out.push(json!({"content": parsed.content}));
        }
        for call in &parsed.calls {
            out.push(json!({"tool_calls": [call_json(call, Some(self.calls))]}));
            self.calls += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn choices_are_read_and_bad_ones_refused_by_name() {
        let t = || Some(vec![weather()]);
        assert!(check_tools(None, None, None).unwrap().is_none());
        assert!(check_tools(t(), Some(&json!("none")), None)
            .unwrap()
            .is_none());
        let r = check_tools(t(), None, None).unwrap().unwrap();
        assert_eq!((r.choice, r.parallel), (ToolChoice::Auto, true));
        let r = check_tools(t(), Some(&json!("required")), Some(false))
            .unwrap()
            .unwrap();
        assert_eq!((r.choice, r.parallel), (ToolChoice::Required, false));
        let named = json!({"type": "function", "function": {"name": "weather"}});
        let r = check_tools(t(), Some(&named), None).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::Named("weather".into()));

        let param = |tools, choice: Option<Value>| {
            check_tools(tools, choice.as_ref(), None)
                .unwrap_err()
                .param
                .unwrap()
        };
        let other = json!({"type": "function", "function": {"name": "time"}});
        assert_eq!(param(t(), Some(other)), "tool_choice.function.name");
        assert_eq!(param(None, Some(json!("required"))), "tool_choice");
        assert_eq!(param(t(), Some(json!("always"))), "tool_choice");
        assert_eq!(
            param(Some(vec![json!({"type": "code"})]), None),
            "tools[0].type"
        );
        assert_eq!(
            param(
                Some(vec![
                    json!({"type": "function", "function": {"name": "a b"}})
                ]),
                None
            ),
            "tools[0].function.name"
        );
        assert_eq!(
            param(Some(vec![weather(), weather()]), None),
            "tools[1].function.name"
        );
        let bad_params = json!({"type": "function", "function": {"name": "f", "parameters": 1}});
        assert_eq!(
            param(Some(vec![bad_params]), None),
            "tools[0].function.parameters"
        );
    }

    #[test]
    fn only_a_required_or_named_choice_constrains() {
        let mut r = check_tools(Some(vec![weather()]), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(r.grammar(ToolFormat::Hermes), None);
        r.choice = ToolChoice::Named("weather".into());
        let g = r.grammar(ToolFormat::Hermes).unwrap();
        assert!(g.contains("\"weather\""), "{g}");
        assert!(
            g.starts_with("start: call\n"),
            "a named choice gets one call: {g}"
        );
    }

    #[test]
    fn a_whole_reply_becomes_tool_calls() {
        let text = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (m, finish) = reply_message(ToolFormat::Hermes, text, "stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(m["content"], Value::Null);
        let call = &m["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Oslo\"}");
        // Out of room mid-call: what was read, with the reason it stopped.
        let (m, finish) =
            reply_message(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"w", "length");
        assert_eq!(finish, "length");
        assert!(m["tool_call_error"].is_string() && m.get("tool_calls").is_none());
        let (m, finish) = reply_message(ToolFormat::Hermes, "Sunny.", "stop");
        assert_eq!(
            (m["content"].as_str(), finish.as_str()),
            (Some("Sunny."), "stop")
        );
    }

    #[test]
    fn a_stream_sends_text_at_once_and_calls_whole() {
        let mut s = CallStream::new(ToolFormat::Hermes);
        let mut deltas = Vec::new();
        for piece in [
            "Checking",
            " <tool",
            "_call>\n{\"name\": \"weather\", ",
            "\"arguments\": {}}\n</tool_call>",
            "\n<tool_call>{\"name\": \"weather\"}",
        ] {
            deltas.extend(s.push(piece));
        }
        let (rest, finish) = s.finish("stop");
        deltas.extend(rest);
        assert_eq!(finish, "tool_calls");
        assert_eq!(deltas[0], json!({"content": "Checking"}));
        assert_eq!(deltas[1], json!({"content": " "}));
        assert_eq!(deltas[2]["tool_calls"][0]["index"], 0);
        assert_eq!(deltas[2]["tool_calls"][0]["function"]["name"], "weather");
        assert_eq!(deltas[3], json!({"content": "\n"}));
        assert_eq!(deltas[4]["tool_calls"][0]["index"], 1);
        assert_eq!(deltas.len(), 5);

        let mut s = CallStream::new(ToolFormat::Llama3);
        assert!(s.push("{\"name\": \"weather\",").is_empty());
        assert!(s.push(" \"parameters\": {\"city\": \"Oslo\"}}").is_empty());
        let (d, finish) = s.finish("stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(
            d[0]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Oslo\"}"
        );
        let mut s = CallStream::new(ToolFormat::Llama3);
        assert_eq!(s.push("Hi"), [json!({"content": "Hi"})]);
        assert_eq!(
            s.push(" {\"name\": 1}"),
            [json!({"content": " {\"name\": 1}"})]
        );
        assert_eq!(s.finish("stop"), (vec![], "stop".to_string()));
    }
}
