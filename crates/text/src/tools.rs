//! Tool calls in a chat: how a model is told about tools and how its calls are read back.
//!
//! A chat template that renders `tools` (most templates of tool-trained models do) is given
//! them as transformers gives them. One that does not (SmolLM2's, say) gets them described
//! in the system message, with the calls to be written in Hermes' form, and earlier calls
//! and tool results written into the conversation's text the same way.
//!
//! A reply is read in the form its template asks for ([`ToolFormat`]): Hermes'
//! `<tool_call>` blocks (Qwen2.5, Qwen3, Hermes and the templates without tools), or
//! Llama 3.1's single JSON object. A call that cannot be read leaves the whole reply as
//! text, with the reason ([`ParsedReply::malformed`]).

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Value};

use crate::chat_template::Message;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
/// Llama 3.1's marker before a call (a special token: decoded text rarely holds it).
const PYTHON_TAG: &str = "<|python_tag|>";

/// The form in which a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, a block per call.
    Hermes,
    /// The whole reply one JSON object, `{"name": ..., "parameters": {...}}`, after an
    /// optional `<|python_tag|>`.
    Llama3,
}

impl ToolFormat {
    /// The form a template's text asks for: Hermes' blocks where it names them, Llama 3's
    /// object in a Llama 3 template, otherwise Hermes' (the form quench's own description
    /// asks for).
    pub fn of_template(source: &str) -> ToolFormat {
        if !source.contains(CALL_OPEN) && source.contains("<|start_header_id|>") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }

    /// The key a call's arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3 => "parameters",
        }
    }

    /// A Lark grammar (llguidance's dialect) whose sentences are calls of one of `tools`
    /// (OpenAI tool definitions: `{"type": "function", "function": {"name", "parameters"}}`),
    /// several where `parallel` and the form allows it.
    pub fn call_grammar(self, tools: &[&Value], parallel: bool) -> String {
        let key = self.arguments_key();
        let calls: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let parameters = match f.get("parameters") {
                    Some(p @ Value::Object(_)) => p.clone(),
                    _ => json!({"type": "object"}),
                };
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, key: parameters},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({
            "anyOf": calls,
            // One line, as `response_format` JSON is written.
            "x-guidance": {
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "lenient": true,
            },
        });
        match self {
            ToolFormat::Hermes => {
                let more = if parallel { " (\"\\n\" call)*" } else { "" };
                format!(
                    "start: call{more}\ncall: \"{CALL_OPEN}\\n\" %json {schema} \"\\n{CALL_CLOSE}\"\n"
                )
            }
            ToolFormat::Llama3 => format!("start: %json {schema}\n"),
        }
    }

    /// Reads the tool calls out of a reply. Text around Hermes blocks stays the reply's
    /// content; a Llama 3 reply is a call only if it is one object as a whole.
    pub fn parse(self, reply: &str) -> ParsedReply {
        let parsed = match self {
            ToolFormat::Hermes => parse_hermes(reply),
            ToolFormat::Llama3 => parse_llama3(reply),
        };
        parsed.unwrap_or_else(|why| ParsedReply {
            content: reply.to_string(),
            calls: Vec::new(),
            malformed: Some(why),
        })
    }

    /// Where in `text` a call might begin: the byte offset before which text is surely
    /// content, for a stream that sends content as it comes. Text from there on may
    /// still turn out to be (the start of) a call.
    pub fn content_until(self, text: &str) -> usize {
        match self {
            ToolFormat::Hermes => {
                if let Some(at) = text.find(CALL_OPEN) {
                    return at;
                }
                // A tail that could grow into the opening tag is held back.
                (1..CALL_OPEN.len())
                    .rev()
                    .filter(|&n| n <= text.len())
                    .find(|&n| {
                        text.is_char_boundary(text.len() - n) && text.ends_with(&CALL_OPEN[..n])
                    })
                    .map_or(text.len(), |n| text.len() - n)
            }
            // A call is the whole reply: held back while it could be one.
            ToolFormat::Llama3 => {
                let start = text.trim_start();
                let maybe_call = start.starts_with('{')
                    || start.starts_with(PYTHON_TAG)
                    || PYTHON_TAG.starts_with(start);
                if maybe_call {
                    0
                } else {
                    text.len()
                }
            }
        }
    }
}

/// A tool call: the function's name and its arguments as a JSON value. Serialized as
/// OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}` with the
/// arguments as an object, which is how chat templates read them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "WireCall")]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            arguments: &'a Value,
        }
        let mut st = s.serialize_struct("ToolCall", 3)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("type", "function")?;
        st.serialize_field(
            "function",
            &Function {
                name: &self.name,
                arguments: &self.arguments,
            },
        )?;
        st.end()
    }
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

impl From<WireCall> for ToolCall {
    /// OpenAI's clients send the arguments as a string of JSON: read as the object it holds.
    fn from(w: WireCall) -> ToolCall {
        let arguments = match w.function.arguments {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        ToolCall {
            id: w.id,
            name: w.function.name,
            arguments,
        }
    }
}

/// A reply split into its text and its tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedReply {
    /// The text outside the calls, trimmed; the whole reply when a call was malformed.
    pub content: String,
    /// The calls, ids left empty for the caller to assign.
    pub calls: Vec<ToolCall>,
    /// Why a call could not be read, when one could not.
    pub malformed: Option<String>,
}

fn parse_hermes(reply: &str) -> Result<ParsedReply, String> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = reply;
    while let Some(at) = rest.find(CALL_OPEN) {
        content.push_str(&rest[..at]);
        let body = &rest[at + CALL_OPEN.len()..];
        // A reply cut off after its last call may lack the closing tag.
        let (inside, after) = match body.find(CALL_CLOSE) {
            Some(end) => (&body[..end], &body[end + CALL_CLOSE.len()..]),
            None => (body, ""),
        };
        calls.push(read_call(inside, &["arguments"])?);
        rest = after;
    }
    content.push_str(rest);
    Ok(ParsedReply {
        content: content.trim().to_string(),
        calls,
        malformed: None,
    })
}

fn parse_llama3(reply: &str) -> Result<ParsedReply, String> {
    let text = reply.trim();
    let body = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim();
    if !body.starts_with('{') {
        return Ok(ParsedReply {
            content: reply.trim().to_string(),
            calls: Vec::new(),
            malformed: None,
        });
    }
    // Llama 3.1's prompt asks for "parameters"; some fine-tunes write "arguments".
    let call = read_call(body, &["parameters", "arguments"])?;
    Ok(ParsedReply {
        content: String::new(),
        calls: vec![call],
        malformed: None,
    })
}

/// One call's JSON: `{"name": ..., KEY: {...}}` with the first of `keys` present (none:
/// no arguments), the arguments an object or a string holding one (as some models write
/// them).
fn read_call(text: &str, keys: &[&str]) -> Result<ToolCall, String> {
    let value: Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("a tool call is not valid JSON: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err("a tool call is not a JSON object".into());
    };
    let Some(name) = object.get("name").and_then(Value::as_str) else {
        return Err("a tool call has no \"name\" string".into());
    };
    let key = keys
        .iter()
        .find(|k| object.contains_key(**k))
        .unwrap_or(&keys[0]);
    let arguments = match object.get(*key) {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(a @ Value::Object(_)) => a,
            _ => {
                return Err(format!(
                    "the \"{key}\" of tool call {name:?} are not an object"
                ))
            }
        },
        Some(_) => {
            return Err(format!(
                "the \"{key}\" of tool call {name:?} are not an object"
            ))
        }
    };
    Ok(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments,
    })
}

/// The conversation for a template that does not render tools: `tools` described in the
/// system message (a first one added where there is none), calls written into assistant
/// turns as Hermes blocks, and tool results as user turns in `<tool_response>` tags.
pub(crate) fn inline(messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        let mut m = m.clone();
        if !m.tool_calls.is_empty() {
            for call in std::mem::take(&mut m.tool_calls) {
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                let call = json!({"name": call.name, "arguments": call.arguments});
                m.content
                    .push_str(&format!("{CALL_OPEN}\n{call}\n{CALL_CLOSE}"));
            }
        }
        if m.role == "tool" {
            m.role = "user".into();
            m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            m.tool_call_id = None;
            m.name = None;
        }
        out.push(m);
    }
    if tools.is_empty() {
        return out;
    }
    let described = describe(tools);
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{described}", first.content);
        }
        _ => out.insert(0, Message::new("system", described)),
    }
    out
}

/// The system message's description of `tools` and of how to call them.
fn describe(tools: &[Value]) -> String {
    let mut text = String::from(
        "You may call one or more of the functions below to answer. Their signatures, as JSON \
         Schema, are inside <tools></tools>:\n<tools>\n",
    );
    for t in tools {
        text.push_str(&t.to_string());
        text.push('\n');
    }
    text.push_str(
        "</tools>\n\nTo call a function, reply with a JSON object holding its name and \
         arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n\
         {\"name\": \"FUNCTION NAME\", \"arguments\": {ARGUMENTS}}\n</tool_call>",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: String::new(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn hermes_blocks_and_the_text_around_them() {
        let r = ToolFormat::Hermes.parse(
            "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n\
             <tool_call>{\"name\": \"time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}</tool_call>",
        );
        assert_eq!(r.malformed, None);
        assert_eq!(r.content, "Let me look.");
        assert_eq!(
            r.calls,
            [
                call("weather", json!({"city": "Oslo"})),
                call("time", json!({"zone": "CET"}))
            ]
        );
        // Cut off before the closing tag: still a call.
        let r = ToolFormat::Hermes.parse("<tool_call>\n{\"name\": \"now\"}");
        assert_eq!(r.calls, [call("now", json!({}))]);
        // Plain text stays text.
        let r = ToolFormat::Hermes.parse(" Hello. ");
        assert_eq!((r.content.as_str(), r.calls.len()), ("Hello.", 0));
    }

    #[test]
    fn a_malformed_call_leaves_the_reply_as_text_with_the_reason() {
        for bad in [
            "<tool_call>{\"name\": \"f\", </tool_call>",
            "<tool_call>[1, 2]</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
        ] {
            let r = ToolFormat::Hermes.parse(bad);
            assert_eq!(r.content, bad);
            assert!(r.calls.is_empty());
            assert!(r.malformed.is_some(), "{bad}");
        }
        let r = ToolFormat::Llama3.parse("{\"name\": 1}");
        assert!(r.malformed.is_some() && r.calls.is_empty());
    }

    #[test]
    fn llama3_reads_one_object_as_the_whole_reply() {
        let r = ToolFormat::Llama3
            .parse("<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}");
        assert_eq!(r.calls, [call("weather", json!({"city": "Oslo"}))]);
        assert_eq!(r.content, "");
        let r = ToolFormat::Llama3.parse("{\"name\": \"f\", \"arguments\": {\"x\": 1}}");
        assert_eq!(r.calls, [call("f", json!({"x": 1}))]);
        let r = ToolFormat::Llama3.parse("It is sunny {mostly}.");
        assert!(r.calls.is_empty() && r.malformed.is_none());
    }

    #[test]
    fn the_form_follows_the_template() {
        assert_eq!(
            ToolFormat::of_template("{{ '<|start_header_id|>' }}{% if tools %}…{% endif %}"),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::of_template("<|im_start|>{% if tools %}<tool_call>{% endif %}"),
            ToolFormat::Hermes
        );
        assert_eq!(ToolFormat::of_template("<|im_start|>"), ToolFormat::Hermes);
    }

    #[test]
    fn a_stream_holds_back_what_may_start_a_call() {
        let h = ToolFormat::Hermes;
        assert_eq!(h.content_until("Hi there"), 8);
        assert_eq!(h.content_until("Hi <tool"), 3);
        assert_eq!(h.content_until("Hi <tool_call>{"), 3);
        assert_eq!(h.content_until("a < b"), 5);
        assert_eq!(h.content_until("é<"), "é".len());
        let l = ToolFormat::Llama3;
        assert_eq!(l.content_until(" {\"na"), 0);
        assert_eq!(l.content_until("<|py"), 0);
        assert_eq!(l.content_until("Sure"), 4);
    }

    #[test]
    fn templates_without_tools_get_them_in_the_system_message() {
        let tools = [json!({"type": "function", "function": {"name": "weather"}})];
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = vec![call("weather", json!({"city": "Oslo"}))];
        let mut answer = Message::new("tool", "{\"c\": 3}");
        answer.tool_call_id = Some("call_1".into());
        let out = inline(&[Message::new("user", "Weather?"), asked, answer], &tools);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(
            out[0].content.contains("\"name\":\"weather\""),
            "{}",
            out[0].content
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\":\"weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert!(out[2].tool_calls.is_empty());
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n{\"c\": 3}\n</tool_response>")
        );
        // An existing system message is extended, not replaced.
        let out = inline(&[Message::new("system", "Be brief.")], &tools);
        assert!(out[0].content.starts_with("Be brief.\n\n"));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn calls_serialize_as_openai_writes_them_and_read_back() {
        let c = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: json!({"x": 1}),
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v,
            json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}})
        );
        assert_eq!(serde_json::from_value::<ToolCall>(v).unwrap(), c);
        let sent = json!({"id": "call_1", "type": "function",
                          "function": {"name": "f", "arguments": "{\"x\": 1}"}});
        assert_eq!(serde_json::from_value::<ToolCall>(sent).unwrap(), c);
    }

    #[test]
    fn the_call_grammar_names_each_tool() {
        let t = json!({"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let g = ToolFormat::Hermes.call_grammar(&[&t], true);
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains("{\"const\":\"weather\"}"), "{g}");
        let g = ToolFormat::Llama3.call_grammar(&[&t], false);
        assert!(g.contains("\"parameters\":{\"type\":\"object\""), "{g}");
    }
}
