//! Chat templates rendered the way transformers renders them.
//!
//! transformers compiles `chat_template` with Jinja2's sandbox, `trim_blocks` and
//! `lstrip_blocks` on, the loop-controls extension (`break`, `continue`), its own
//! `tojson` filter (Python `json.dumps`: non-ASCII kept, `indent` honoured, keys in
//! insertion order) and the globals `raise_exception(msg)` and `strftime_now(fmt)`, then
//! renders it with `messages`, `add_generation_prompt`, `tools`, `documents` and the
//! special tokens. Here the same is done with minijinja, plus Python's string/dict/list
//! methods (`.strip()`, `.split()`, `.items()`, ...) and Python's way of printing values
//! (`None`, `True`, `['a', 1]`).
//!
//! A template comes inside a model file and is as untrusted as one: every render runs
//! within [`RenderLimits`] (see `template_limits`), and a template that passes one is
//! refused with an error naming the limit.

use std::sync::{Arc, Mutex};

use chrono::format::{Item, StrftimeItems};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TextError};
use crate::template_limits::{self, check_budget, Failure, RenderLimits};
use crate::tools::{self, ToolCall, ToolFormat};

const TEMPLATE_NAME: &str = "chat_template";
/// The widest `tojson` indent (in spaces, or bytes of an indent string).
const MAX_JSON_INDENT: usize = 64;

/// One chat message: `{"role": ..., "content": ...}` to the template, with the calls an
/// assistant turn made (`tool_calls`) and, on a `tool` message, the call it answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name, on a `tool` message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A compiled chat template with the special tokens it is rendered with, and the limits
/// every render of it keeps within ([`RenderLimits`]).
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    bos_token: String,
    eos_token: String,
    limits: RenderLimits,
    /// Whether the template renders `tools` itself, and the form it asks calls in.
    renders_tools: bool,
    tool_format: ToolFormat,
    /// Set once a render had to be abandoned (past its hard memory limit or its deadline):
    /// the template is refused from then on, so that it strands at most one thread.
    refused: Mutex<Option<String>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (from GGUF `tokenizer.chat_template` or `tokenizer_config.json`).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(RenderLimits::default().fuel));
        env.set_formatter(|out, _state, value| {
            check_budget()?;
            out.write_str(&python_str(value)?)
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TextError::TemplateSyntax {
                line: e.line().unwrap_or(0),
                message: e
                    .detail()
                    .map_or_else(|| e.kind().to_string(), str::to_string),
            })?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits: RenderLimits::default(),
            renders_tools: source.contains("tools"),
            tool_format: ToolFormat::of_template(source),
            refused: Mutex::new(None),
        })
    }

    /// The same template rendered within `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: RenderLimits) -> Self {
        // Nothing else holds the environment before the first render.
        if let Some(env) = Arc::get_mut(&mut self.env) {
            env.set_fuel(Some(limits.fuel));
            self.limits = limits;
        }
        self
    }

    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// Renders a conversation.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders a conversation whose replies may call `tools` (OpenAI tool definitions):
    /// given to the template as `tools` where it renders them, otherwise described in the
    /// system message, with the conversation's earlier calls and results written as text
    /// in the same form (see the `tools` module).
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        if self.renders_tools {
            let tools = (!tools.is_empty()).then_some(tools);
            return self.render_serialize(messages, add_generation_prompt, tools);
        }
        let inlined = tools::inline(messages, tools);
        self.render_serialize(&inlined, add_generation_prompt, None::<&()>)
    }

    /// The form in which replies rendered by this template write tool calls.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Renders any serializable messages (tool calls, structured content...) and tool
    /// definitions, as transformers' `apply_chat_template(messages, tools=...)`. Maps keep
    /// the order they serialize in (struct fields in declaration order), which `tojson`
    /// output depends on; note that `serde_json::Value` objects are sorted by key unless
    /// serde_json's `preserve_order` feature is on.
    pub fn render_serialize<M, T>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
        tools: Option<&T>,
    ) -> Result<String>
    where
        M: Serialize + ?Sized,
        T: Serialize + ?Sized,
    {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(reason) = refused {
            return Err(TextError::TemplateLimit(format!(
                "refused: an earlier render of this template was stopped ({reason})"
            )));
        }
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            tools => tools.map(Value::from_serialize),
            documents => Value::from(()),
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let mut abandoned = false;
        let result = template_limits::render(
            self.env.clone(),
            TEMPLATE_NAME,
            ctx,
            self.limits,
            &mut abandoned,
        );
        match result {
            Ok(text) => Ok(text),
            Err(Failure::Render(e)) => Err(render_error(e)),
            Err(Failure::Limit(reason)) => {
                if abandoned {
                    *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
                }
                Err(TextError::TemplateLimit(reason))
            }
        }
    }
}

fn render_error(e: Error) -> TextError {
    let mut message = match e.detail() {
        Some(detail) => detail.to_string(),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        message.push_str(&format!(" (line {line})"));
    }
    TextError::TemplateRender(message)
}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    check_budget()?;
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: &str) -> std::result::Result<String, Error> {
    check_budget()?;
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {format:?}"),
        ));
    }
    Ok(chrono::Local::now()
        .format_with_items(items.into_iter())
        .to_string())
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    check_budget()?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            // Python takes any width; a width past this is only ever a way to ask for
            // gigabytes (the indent is repeated at every level of every line).
            (Some(n), _) if n > MAX_JSON_INDENT as i64 => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent {n} is wider than {MAX_JSON_INDENT}"),
                ))
            }
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) if s.len() > MAX_JSON_INDENT => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: an indent string of {} bytes is wider than {MAX_JSON_INDENT}",
                        s.len()
                    ),
                ))
            }
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let opts = JsonOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        separators: match kwargs.get::<Option<Vec<String>>>("separators")? {
            Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
            Some(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ))
            }
            None if indent.is_some() => (",".to_string(), ": ".to_string()),
            None => (", ".to_string(), ": ".to_string()),
        },
        indent,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

struct JsonOptions {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    separators: (String, String),
}

fn write_json(
    out: &mut String,
    value: &Value,
    opts: &JsonOptions,
    depth: usize,
) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&json_number(value)),
        ValueKind::String => {
            write_json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_json_container(out, '[', ']', items.len(), opts, depth, |out, i| {
                write_json(out, &items[i], opts, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            write_json_container(out, '{', '}', keys.len(), opts, depth, |out, i| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => write_json_string(out, s, opts.ensure_ascii),
                    None => write_json_string(out, &python_str(key)?, opts.ensure_ascii),
                }
                out.push_str(&opts.separators.1);
                write_json(out, &value.get_item(key)?, opts, depth + 1)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn write_json_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    opts: &JsonOptions,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> std::result::Result<(), Error>,
) -> std::result::Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.separators.0);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => "NaN".to_string(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string(),
        Ok(f) => python_float(f),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `.0` on integral values, and an
/// exponent (`1e+16`, `1e-05`) outside 1e-4 <= |x| < 1e16.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// How Python's `str()` prints a value into the template output.
fn python_str(value: &Value) -> std::result::Result<String, Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(String::new()),
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_string()),
        _ => python_repr(value),
    }
}

/// Python's `repr()` of a value.
fn python_repr(value: &Value) -> std::result::Result<String, Error> {
    Ok(match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => python_float(f),
            Err(_) => value.to_string(),
        },
        ValueKind::String => python_string_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items = value
                .try_iter()?
                .map(|v| python_repr(&v))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let mut items = Vec::new();
            for key in value.try_iter()? {
                items.push(format!(
                    "{}: {}",
                    python_repr(&key)?,
                    python_repr(&value.get_item(&key)?)?
                ));
            }
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    })
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn python_string_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_floats() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.5e-5), "1.5e-05");
        assert_eq!(python_float(-2.5), "-2.5");
    }

    #[test]
    fn python_string_quotes() {
        assert_eq!(python_string_repr("a'b"), "\"a'b\"");
        assert_eq!(python_string_repr("a\"b'c\n"), "'a\"b\\'c\\n'");
    }

    #[test]
    fn strftime_now_refuses_bad_formats_without_panicking() {
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            chrono::Local::now().format("%Y").to_string()
        );
    }
}
