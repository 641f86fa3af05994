//! `POST /v1/chat/completions` and `POST /v1/completions`: check the request, hand a job to
//! the model's engine thread, and answer with one JSON object or a stream of server-sent
//! events (`data: {...}` chunks, then `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use quench_engine::generate::{Constraint, OutputFormat, SamplingParams};
use quench_text::{Message, ToolFormat};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::body::read_json_split;
use super::tools::{check_tools, read_calls, reply_message, valid_name, CallStream, ToolRequest};
use super::types::{ChatMessage, ChatRequest, CompletionRequest, GenerationFields, PromptInput};
use super::{ApiError, AppState, ServedKind, ServedModel};
use crate::keys::Caller;
use crate::log::RequestLog;
use crate::scheduler::blocks::blocks_for;
use crate::scheduler::{Done, Event, Job, TokenLogprob, TokenOut};
use crate::sessions::{valid_session_id, History, SessionRefusal, SessionStore};
use crate::text::{TextFailure, TextSide};

/// Most stop strings a request may give.
const MAX_STOPS: usize = 16;
/// Most alternatives per token `top_logprobs` (chat) or `logprobs` (completions) may ask for.
const MAX_TOP_LOGPROBS: i64 = 20;
const SESSION_HEADER: &str = "x-session-id";
/// Most choices (`n`) one request may ask for.
const MAX_CHOICES: i64 = 16;

/// The options chat and text completions share, checked.
pub(super) struct Options {
    max_tokens: Option<(usize, &'static str)>,
    ignore_eos: bool,
    sampling: SamplingParams,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    /// `n`: how many choices continue the prompt, each drawn with its own seed.
    choices: usize,
    /// `response_format`, when it asks for JSON.
    format: Option<OutputFormat>,
    /// The format (or the tool calls a choice requires) compiled for the model, once it
    /// is known ([`receive`]).
    constraint: Option<Box<Constraint>>,
    /// `tools` with a choice other than `"none"` (chat only).
    tools: Option<ToolRequest>,
}

/// Checks the shared fields but `model` and `session_id`, which name what the request is
/// answered by rather than how.
pub(super) fn check_options(fields: GenerationFields) -> Result<Options, ApiError> {
    let GenerationFields {
        max_tokens,
        max_completion_tokens,
        temperature,
        top_p,
        seed,
        stop,
        stream,
        stream_options,
        n,
        presence_penalty,
        frequency_penalty,
        ignore_eos,
        logit_bias,
        best_of,
        tools,
        tool_choice,
        functions,
        parallel_tool_calls,
        response_format,
        top_k,
        min_p,
        repetition_penalty,
        ..
    } = fields;
    refuse_unserved(best_of, &functions)?;
    let format = output_format(response_format.as_ref())?;
    let tools = check_tools(tools, tool_choice.as_ref(), parallel_tool_calls)?;
    if format.is_some()
        && tools
            .as_ref()
            .is_some_and(|t| t.grammar(ToolFormat::Hermes).is_some())
    {
        return Err(ApiError::invalid(
            "tool_choice",
            "a tool_choice that requires a call cannot be combined with a response_format",
        ));
    }
    let max_tokens = match (max_completion_tokens, max_tokens) {
        (Some(v), _) => Some((v, "max_completion_tokens")),
        (None, Some(v)) => Some((v, "max_tokens")),
        (None, None) => None,
    };
    let max_tokens = match max_tokens {
        Some((v, name)) if v <= 0 => {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be at least 1, not {v}"),
            ))
        }
        Some((v, name)) => Some((usize::try_from(v).unwrap_or(usize::MAX), name)),
        None => None,
    };
    let temperature = temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 2, not {temperature}"),
        ));
    }
    let top_p = top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be above 0 and at most 1, not {top_p}"),
        ));
    }
    let choices = n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&choices) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be between 1 and {MAX_CHOICES}, not {choices}"),
        ));
    }
    for (name, value) in [
        ("presence_penalty", presence_penalty),
        ("frequency_penalty", frequency_penalty),
    ] {
        if let Some(v) = value.filter(|v| !(-2.0..=2.0).contains(v)) {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be between -2 and 2, not {v}"),
            ));
        }
    }
    let logit_bias = biases(logit_bias.as_ref())?;
    let stop: Vec<String> = stop.map(|s| s.0).unwrap_or_default();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop holds {} strings; at most {MAX_STOPS} are taken",
                stop.len()
            ),
        ));
    }
    let stream = stream.unwrap_or(false);
    let include_usage = stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let top_k = match top_k {
        None | Some(-1) => 0,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be 0 or more (0 or -1 keep every token), not {k}"),
            ))
        }
    };
    let min_p = min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid(
            "min_p",
            format!("min_p must be between 0 and 1, not {min_p}"),
        ));
    }
    let repetition_penalty = repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!(
                "repetition_penalty must be above 0 (1 changes nothing), not {repetition_penalty}"
            ),
        ));
    }
    let sampling = SamplingParams {
        temperature: temperature as f32,
        top_k,
        min_p: min_p as f32,
        repetition_penalty: repetition_penalty as f32,
        top_p: top_p as f32,
        logit_bias,
        presence_penalty: presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: frequency_penalty.unwrap_or(0.0) as f32,
        // Without a seed, each request draws differently.
        seed: seed.map_or_else(rand::random, |s| s as u64),
    };
    Ok(Options {
        max_tokens,
        ignore_eos: ignore_eos.unwrap_or(false),
        sampling,
        stop,
        stream,
        include_usage,
        choices: choices as usize,
        format,
        constraint: None,
        tools,
    })
}

/// Refuses, by name, what a request may ask for that the server does not do, where the
/// value asks for something (an empty list or `best_of: 1` ask for nothing).
fn refuse_unserved(
    best_of: Option<i64>,
    functions: &Option<Vec<serde_json::Value>>,
) -> Result<(), ApiError> {
    let unsupported = |name: &str, what: &str| {
        Err(
            ApiError::invalid(name, format!("{name} is not supported: {what}"))
                .code("unsupported_parameter"),
        )
    };
    if let Some(b) = best_of.filter(|&b| b != 1) {
        return unsupported(
            "best_of",
            &format!("one completion is drawn per request (got {b})"),
        );
    }
    if functions.as_ref().is_some_and(|f| !f.is_empty()) {
        return unsupported(
            "functions",
            "the deprecated functions field is not served; send the functions as tools",
        );
    }
    Ok(())
}

/// `response_format`, read: `{"type": "text"}` (or none) asks for nothing, `json_object`
/// for any JSON object, `json_schema` for JSON valid against `json_schema.schema`,
/// `grammar` (a quench extension) for text that the Lark grammar `grammar` derives.
fn output_format(given: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    let Some(given) = given else {
        return Ok(None);
    };
    let Some(format) = given.as_object() else {
        return Err(ApiError::invalid(
            "response_format",
            "response_format must be an object such as {\"type\": \"json_object\"}",
        ));
    };
    let kind = match format.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => {
            return Err(ApiError::invalid(
                "response_format.type",
                "response_format.type must be a string",
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "response_format.type",
                "response_format.type is required: text, json_object or json_schema",
            ))
        }
    };
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputFormat::JsonObject)),
        "json_schema" => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "response_format.json_schema must be an object with a name and a schema",
                ));
            };
            match spec.get("name") {
                Some(Value::String(name)) if valid_name(name) => {}
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "response_format.json_schema.name must be 1 to 64 letters, digits, \
                         '_' or '-'",
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "response_format.json_schema.name is required",
                    ))
                }
            }
            let strict = match spec.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.strict",
                        "response_format.json_schema.strict must be true or false",
                    ))
                }
            };
            let schema = match spec.get("schema") {
                // Without a schema, any JSON value.
                None | Some(Value::Null) => json!({}),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "response_format.json_schema.schema must be a JSON Schema object",
                    ))
                }
            };
            Ok(Some(OutputFormat::JsonSchema { schema, strict }))
        }
        "grammar" => match format.get("grammar") {
            Some(Value::String(g)) if !g.trim().is_empty() => {
                Ok(Some(OutputFormat::Lark(g.clone())))
            }
            _ => Err(ApiError::invalid(
                "response_format.grammar",
                "response_format.grammar must be the text of a Lark grammar with a start rule",
            )),
        },
        other => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "response_format.type {other:?} is not one of text, json_object, json_schema, \
                 grammar"
            ),
        )),
    }
}

/// Compiles `format` for the model of `text`: a schema the compiler refuses is the
/// request's fault, named as `param` (`response_format`, or `tools` for the grammar of
/// the calls a tool choice requires).
fn compile_format(
    text: &dyn TextSide,
    format: &OutputFormat,
    param: &'static str,
) -> Result<Constraint, ApiError> {
    let grammars = text.grammars().map_err(|e| {
        ApiError::invalid(
            param,
            format!("{param} cannot be served by this model: {e}"),
        )
    })?;
    grammars
        .constraint(format)
        .map_err(|e| ApiError::invalid(param, format!("{param}: the grammar cannot be used: {e}")))
}

/// `logit_bias` as OpenAI sends it (`{"TOKEN_ID": BIAS}`, each bias in [-100, 100]), sorted
/// by token id. Ids are checked against the vocabulary once the model is known.
fn biases(
    given: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = given else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map {
        let param = format!("logit_bias.{key}");
        let token: u32 = key
            .parse()
            .map_err(|_| ApiError::invalid(&param, format!("{key:?} is not a token id")))?;
        let bias = value
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid(
                    &param,
                    format!("the bias of token {token} must be a number between -100 and 100, not {value}"),
                )
            })?;
        out.push((token, bias as f32));
    }
    out.sort_by_key(|&(t, _)| t);
    Ok(out)
}

/// How many alternatives per token `name` asks for, at most [`MAX_TOP_LOGPROBS`].
fn alternatives(name: &str, n: i64) -> Result<usize, ApiError> {
    if !(0..=MAX_TOP_LOGPROBS).contains(&n) {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be between 0 and {MAX_TOP_LOGPROBS}, not {n}"),
        ));
    }
    Ok(n as usize)
}

/// What chat and text completions take alike from a request.
struct Received {
    arrived: Instant,
    log: Option<Arc<RequestLog>>,
    headers: HeaderMap,
    served: Arc<ServedModel>,
    options: Options,
    /// The session the body names, not yet checked against the header ([`session_id`]).
    body_session: Option<String>,
    /// Whose sessions it may continue.
    caller: Caller,
}

/// Reads a chat or text completion request: the shared fields, checked, and the endpoint's
/// own fields `E`, as read.
async fn receive<E: DeserializeOwned>(
    state: &AppState,
    request: Request,
) -> Result<(Received, E), ApiError> {
    let arrived = Instant::now();
    let log = request_log(&request);
    let caller = request
        .extensions()
        .get::<Caller>()
        .copied()
        .unwrap_or_default();
    let (parts, body) = request.into_parts();
    let (mut fields, own): (GenerationFields, E) =
        read_json_split(&parts.headers, body, state.limits).await?;
    let served = state.model(fields.model.as_deref(), true)?;
    if let Some(log) = &log {
        log.set_model(&served.id);
    }
    let body_session = fields.session_id.take();
    let mut options = check_options(fields)?;
    let text = generator_text(&served)?;
    let calls_only = options
        .tools
        .as_ref()
        .and_then(|t| t.grammar(text.tool_format()));
    let grammar = match (options.format.clone(), calls_only) {
        (Some(format), _) => Some((format, "response_format")),
        (None, Some(lark)) => Some((OutputFormat::Lark(lark), "tools")),
        (None, None) => None,
    };
    if let Some((format, param)) = grammar {
        // The first structured request builds the model's token trie and every one compiles
        // its schema: off the async workers.
        let text = text.clone();
        let compiled =
            tokio::task::spawn_blocking(move || compile_format(text.as_ref(), &format, param))
                .await
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("compiling {param} failed: {e}"),
                    )
                })??;
        options.constraint = Some(Box::new(compiled));
    }
    let vocab = text.vocab_size();
    if let Some(&(token, _)) = options
        .sampling
        .logit_bias
        .iter()
        .find(|&&(t, _)| t as usize >= vocab)
    {
        return Err(ApiError::invalid(
            format!("logit_bias.{token}"),
            format!("token id {token} is past the vocabulary ({vocab} tokens)"),
        ));
    }
    let received = Received {
        arrived,
        log,
        headers: parts.headers,
        served,
        options,
        body_session,
        caller,
    };
    Ok((received, own))
}

/// The session a request names in its body or its `X-Session-Id` header.
fn session_id(body: Option<String>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let header = match headers.get(SESSION_HEADER) {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("X-Session-Id", "X-Session-Id must be ASCII text"))?
                .to_owned(),
        ),
        None => None,
    };
    let id = match (body, header) {
        (Some(b), Some(h)) if b != h => {
            return Err(ApiError::invalid(
                "session_id",
                format!("session_id {b:?} differs from the X-Session-Id header {h:?}"),
            ))
        }
        (b, h) => b.or(h),
    };
    if let Some(id) = &id {
        if !valid_session_id(id) {
            return Err(ApiError::invalid(
                "session_id",
                "session_id must be 1 to 128 characters out of letters, digits and -_.:",
            ));
        }
    }
    Ok(id)
}

/// One request's turn in a session: on an answer the session's history grows by the
/// request's input and the reply; otherwise it stays as it was.
struct SessionTurn {
    store: Arc<SessionStore>,
    id: String,
    /// The history with this request's input appended.
    with_input: Option<History>,
}

impl SessionTurn {
    fn complete(mut self, reply: &str) {
        let history = match self.with_input.take() {
            Some(History::Chat(mut messages)) => {
                messages.push(Message::new("assistant", reply));
                History::Chat(messages)
            }
            Some(History::Text(mut text)) => {
                text.push_str(reply);
                History::Text(text)
            }
            Some(History::Empty) | None => History::Empty,
        };
        self.store.finish(&self.id, history);
    }
}

impl Drop for SessionTurn {
    fn drop(&mut self) {
        if self.with_input.is_some() {
            self.store.release(&self.id);
        }
    }
}

/// Claims session `id` for a request to `model`, dropping the cache of a session forgotten
/// to make room.
fn claim_session(
    state: &AppState,
    received: &Received,
    id: &str,
    chat: bool,
) -> Result<(crate::sessions::Claim, SessionTurn), ApiError> {
    let served = &received.served;
    let (claim, forgotten) = state
        .sessions
        .claim(id, &served.id, chat, received.caller)
        .map_err(|e| match e {
            SessionRefusal::Busy(_) => ApiError::new(StatusCode::CONFLICT, e.to_string())
                .param("session_id")
                .code("session_busy"),
            SessionRefusal::Quota(_) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
                .param("session_id")
                .code("session_quota"),
            _ => ApiError::invalid("session_id", e.to_string()),
        })?;
    if let Some(old) = forgotten {
        for m in &state.models {
            if let Some(engine) = m.engine() {
                engine.drop_session(&old);
            }
        }
    }
    let turn = SessionTurn {
        store: state.sessions.clone(),
        id: id.to_owned(),
        with_input: None,
    };
    Ok((claim, turn))
}

/// A chat request's messages, checked: at least one, text content, a known role; an
/// assistant turn's tool calls and a tool message's call id read.
pub(super) fn chat_messages(given: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if given.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(given.len());
    for (i, m) in given.iter().enumerate() {
        let text = m.content.text().map_err(|kind| {
            ApiError::invalid(
                format!("messages[{i}].content"),
                format!(
                    "messages[{i}].content: parts of type {kind:?} are not supported; send text"
                ),
            )
        })?;
        if !["system", "developer", "user", "assistant", "tool"].contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                "messages[{i}].role {:?} is not one of system, developer, user, assistant, tool",
                m.role
            ),
            ));
        }
        // Chat templates know "system"; "developer" is its newer name.
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        let mut message = Message::new(role, text);
        if let Some(calls) = &m.tool_calls {
            if m.role != "assistant" {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_calls"),
                    format!("messages[{i}].tool_calls: only assistant messages make tool calls"),
                ));
            }
            message.tool_calls = read_calls(i, calls)?;
        }
        if m.role == "tool" {
            message.tool_call_id = m.tool_call_id.clone();
            message.name = m.name.clone();
        }
        messages.push(message);
    }
    Ok(messages)
}

/// Refuses an id past the model's vocabulary, naming its place in `field`.
pub(super) fn check_token_ids(
    text: &dyn TextSide,
    ids: &[u32],
    field: &str,
) -> Result<(), ApiError> {
    let vocab = text.vocab_size();
    match ids.iter().position(|&t| t as usize >= vocab) {
        None => Ok(()),
        Some(i) => Err(ApiError::invalid(
            format!("{field}[{i}]"),
            format!(
                "{field}[{i}] is token id {}, outside the vocabulary of {vocab} tokens (0 to {})",
                ids[i],
                vocab.saturating_sub(1)
            ),
        )),
    }
}

pub(super) fn text_failure(e: TextFailure, param: &str) -> ApiError {
    match e {
        TextFailure::NoTemplate => ApiError::invalid("model", e.to_string()),
        _ => ApiError::invalid(param, e.to_string()),
    }
}

fn request_log(request: &Request) -> Option<Arc<RequestLog>> {
    request.extensions().get::<Arc<RequestLog>>().cloned()
}

pub async fn chat(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let (mut received, req): (Received, ChatRequest) = receive(&state, request).await?;
    let top = req
        .top_logprobs
        .map(|n| alternatives("top_logprobs", n))
        .transpose()?;
    let logprobs = match (req.logprobs.unwrap_or(false), top) {
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs set to true",
            ))
        }
        (true, n) => Some(n.unwrap_or(0)),
        (false, None) => None,
    };
    let mut messages = chat_messages(&req.messages)?;

    let session = session_id(received.body_session.take(), &received.headers)?;
    let text = generator_text(&received.served)?;
    let mut turn = None;
    if let Some(id) = &session {
        let (claim, mut t) = claim_session(&state, &received, id, true)?;
        if let History::Chat(earlier) = claim.history {
            messages.splice(0..0, earlier);
        }
        t.with_input = Some(History::Chat(messages.clone()));
        turn = Some(t);
    }
    let tools = received.options.tools.as_ref();
    let prompt = text
        .chat_prompt(&messages, tools.map_or(&[], |t| t.tools.as_slice()))
        .map_err(|e| text_failure(e, "messages"))?;
    let mut reply = Reply::new(&received, true, text.clone(), session);
    reply.tool_format = tools.map(|_| text.tool_format());
    run(state, received, reply, prompt, "messages", logprobs, turn).await
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let (mut received, req): (Received, CompletionRequest) = receive(&state, request).await?;
    let logprobs = req
        .logprobs
        .map(|n| alternatives("logprobs", n))
        .transpose()?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if req.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if received.options.tools.is_some() {
        return Err(ApiError::invalid(
            "tools",
            "tools are taken by /v1/chat/completions, not by text completions",
        ));
    }
    let text = generator_text(&received.served)?;
    let session = session_id(received.body_session.take(), &received.headers)?;
    let prompt_input = req
        .prompt
        .ok_or_else(|| ApiError::invalid("prompt", "prompt is required"))?;
    let mut turn = None;
    let prompt = match prompt_input {
        PromptInput::Many(n) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt holds {n} prompts; send one per request"),
            ))
        }
        PromptInput::Text(t) if t.is_empty() => {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"))
        }
        PromptInput::Tokens(t) if t.is_empty() => {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"))
        }
        PromptInput::Tokens(_) if session.is_some() => {
            return Err(ApiError::invalid(
                "prompt",
                "a session continues text prompts; send the prompt as text",
            ))
        }
        PromptInput::Tokens(tokens) => {
            check_token_ids(&*text, &tokens, "prompt")?;
            tokens
        }
        PromptInput::Text(mut t) => {
            if let Some(id) = &session {
                let (claim, mut tr) = claim_session(&state, &received, id, false)?;
                if let History::Text(earlier) = claim.history {
                    t.insert_str(0, &earlier);
                }
                tr.with_input = Some(History::Text(t.clone()));
                turn = Some(tr);
            }
            text.text_prompt(&t)
                .map_err(|e| text_failure(e, "prompt"))?
        }
    };
    let reply = Reply::new(&received, false, text, session);
    run(state, received, reply, prompt, "prompt", logprobs, turn).await
}

/// The text side of a model that generates text; other models are refused.
pub(super) fn generator_text(served: &ServedModel) -> Result<Arc<dyn TextSide>, ApiError> {
    match &served.kind {
        ServedKind::Causal { text, .. } => Ok(text.clone()),
        ServedKind::Embedding { .. } => Err(ApiError::invalid(
            "model",
            "this model does not generate text",
        )),
    }
}

/// Checks the prompt against the model's limits, submits the job and answers.
async fn run(
    state: Arc<AppState>,
    received: Received,
    reply: Reply,
    prompt: Vec<u32>,
    prompt_param: &'static str,
    logprobs: Option<usize>,
    turn: Option<SessionTurn>,
) -> Result<Response, ApiError> {
    let Received {
        arrived,
        log,
        served,
        options,
        ..
    } = received;
    let engine = served
        .engine()
        .ok_or_else(|| ApiError::invalid("model", "this model does not generate text"))?;
    let context = engine.context_limit();
    if prompt.len() >= context {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "this model's context holds {context} tokens and the {prompt_param} take {}, \
                 leaving no room for a reply",
                prompt.len()
            ),
        )
        .code("context_length_exceeded"));
    }
    let max_tokens = match options.max_tokens {
        Some((n, name)) if prompt.len().saturating_add(n) > context => {
            return Err(ApiError::invalid(
                name,
                format!(
                    "this model's context holds {context} tokens: {} in the {prompt_param} and \
                     {n} asked in {name} exceed it (at most {} can be asked)",
                    prompt.len(),
                    context - prompt.len()
                ),
            )
            .code("context_length_exceeded"))
        }
        Some((n, _)) => n,
        None => context - prompt.len(),
    };
    let blocks = blocks_for(prompt.len() + 1);
    if blocks > engine.kv_blocks() {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "the {prompt_param} take {} tokens, {blocks} KV blocks, and the server has {} \
                 (--kv-blocks)",
                prompt.len(),
                engine.kv_blocks()
            ),
        )
        .code("context_length_exceeded"));
    }
    if let (Some(log), Some(id)) = (&log, &reply.session) {
        log.set_session(id);
    }
    if options.choices > 1 && reply.session.is_some() {
        return Err(ApiError::invalid(
            "n",
            "a session continues one conversation: n must be 1 with session_id",
        ));
    }
    let (events, rx) = unbounded_channel();
    let (siblings, mut receivers): (Vec<_>, Vec<_>) =
        (1..options.choices).map(|_| unbounded_channel()).unzip();
    receivers.insert(0, rx);
    let job = Job {
        request_id: log.as_ref().map_or_else(String::new, |l| l.id.clone()),
        prompt,
        session: reply.session.clone(),
        max_tokens,
        sampling: options.sampling,
        stop: options.stop,
        logprobs,
        ignore_eos: options.ignore_eos,
        constraint: options.constraint,
        events,
        arrived,
        siblings,
    };
    if let Err(full) = engine.submit(job) {
        state
            .metrics
            .rejected_queue_full
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, full.to_string())
                .code("queue_full")
                .retry_after(1),
        );
    }
    let mut response = if options.stream {
        stream_response(reply.clone(), receivers, options.include_usage, turn, log)
    } else {
        whole_response(&reply, receivers, turn, log).await?
    };
    if let Some(id) = reply
        .session
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok())
    {
        response.headers_mut().insert(SESSION_HEADER, id);
    }
    Ok(response)
}

/// How the answer is written: chat or text completion objects.
#[derive(Clone)]
struct Reply {
    id: String,
    created: i64,
    model: String,
    chat: bool,
    text: Arc<dyn TextSide>,
    session: Option<String>,
    /// The form in which the reply's tool calls are read, where the request has tools.
    tool_format: Option<ToolFormat>,
}

impl Reply {
    fn new(
        received: &Received,
        chat: bool,
        text: Arc<dyn TextSide>,
        session: Option<String>,
    ) -> Reply {
        let kind = if chat { "chatcmpl" } else { "cmpl" };
        let request = received.log.as_ref().map_or("0", |l| l.id.as_str());
        Reply {
            id: format!("{kind}-{request}"),
            created: chrono::Utc::now().timestamp(),
            model: received.served.id.clone(),
            chat,
            text,
            session,
            tool_format: None,
        }
    }

    /// The usage of the choices `done` (the prompt counted once, as it was fed once).
    fn usage(&self, done: &[Done]) -> Value {
        let (prompt, cached) = done
            .first()
            .map_or((0, 0), |d| (d.prompt_tokens, d.cached_tokens));
        let completion: usize = done.iter().map(|d| d.completion_tokens).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn entry(&self, lp: TokenLogprob) -> Value {
        let token = self.text.token_text(lp.token);
        json!({"token": token, "logprob": lp.logprob, "bytes": token.as_bytes()})
    }

    /// Chat logprobs of some tokens.
    fn chat_logprobs(&self, tokens: &[(TokenLogprob, Vec<TokenLogprob>)]) -> Value {
        let content: Vec<Value> = tokens
            .iter()
            .map(|(chosen, top)| {
                let mut v = self.entry(*chosen);
                v["top_logprobs"] = top.iter().map(|t| self.entry(*t)).collect();
                v
            })
            .collect();
        json!({"content": content})
    }

    /// Completion logprobs of some tokens, the first at `offset` in the text.
    fn completion_logprobs(
        &self,
        tokens: &[(TokenLogprob, Vec<TokenLogprob>)],
        mut offset: usize,
    ) -> Value {
        let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for (chosen, top) in tokens {
            let t = self.text.token_text(chosen.token);
            offsets.push(offset);
            offset += t.len();
            texts.push(t);
            lps.push(chosen.logprob);
            let alternatives: serde_json::Map<String, Value> = top
                .iter()
                .map(|a| (self.text.token_text(a.token), json!(a.logprob)))
                .collect();
            tops.push(Value::Object(alternatives));
        }
        json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }

    fn logprobs(&self, tokens: &[(TokenLogprob, Vec<TokenLogprob>)], offset: usize) -> Value {
        if self.chat {
            self.chat_logprobs(tokens)
        } else {
            self.completion_logprobs(tokens, offset)
        }
    }

    /// A streamed chunk of choice `index`.
    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        if self.chat {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            return self.chat_chunk(index, delta, logprobs, finish);
        }
        let choice = json!({"index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish});
        self.object(vec![choice], true)
    }

    /// A streamed chat chunk of choice `index` whose delta is `delta`.
    fn chat_chunk(
        &self,
        index: usize,
        delta: Value,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        let choice =
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish});
        self.object(vec![choice], true)
    }

    /// Choice `index` of a whole answer.
    fn whole_choice(&self, index: usize, done: &Done, logprobs: Value) -> Value {
        if let Some(format) = self.tool_format {
            let (message, finish) = reply_message(format, &done.text, done.finish.as_str());
            json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
        } else if self.chat {
            json!({"index": index, "message": {"role": "assistant", "content": done.text},
                   "logprobs": logprobs, "finish_reason": done.finish.as_str()})
        } else {
            json!({"index": index, "text": done.text, "logprobs": logprobs,
                   "finish_reason": done.finish.as_str()})
        }
    }

    fn object(&self, choices: Vec<Value>, chunk: bool) -> Value {
        let object = match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": choices,
        });
        if let Some(s) = &self.session {
            v["session_id"] = s.as_str().into();
        }
        v
    }
}

fn failure(message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
}

fn cancelled() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server shut down before the answer was finished",
    )
    .retry_after(5)
}

/// Waits for one choice's whole answer: its end and the log-probabilities of its tokens.
async fn whole_choice(
    mut rx: UnboundedReceiver<Event>,
) -> Result<(Done, Vec<(TokenLogprob, Vec<TokenLogprob>)>), ApiError> {
    let mut logprobs = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Token(TokenOut {
                logprobs: Some(lp), ..
            })) => logprobs.push(lp),
            Some(Event::Token(_)) => {}
            Some(Event::Done(done)) => return Ok((done, logprobs)),
            Some(Event::Failed(why)) => return Err(failure(why)),
            Some(Event::Cancelled) => return Err(cancelled()),
            None => return Err(failure("the model's engine stopped".into())),
        }
    }
}

/// Waits for the whole answer, every choice.
async fn whole_response(
    reply: &Reply,
    receivers: Vec<UnboundedReceiver<Event>>,
    turn: Option<SessionTurn>,
    log: Option<Arc<RequestLog>>,
) -> Result<Response, ApiError> {
    let mut choices = Vec::with_capacity(receivers.len());
    let mut done = Vec::with_capacity(receivers.len());
    for (index, rx) in receivers.into_iter().enumerate() {
        let (d, logprobs) = whole_choice(rx).await?;
        let lp = if logprobs.is_empty() {
            Value::Null
        } else {
            reply.logprobs(&logprobs, 0)
        };
        choices.push(reply.whole_choice(index, &d, lp));
        done.push(d);
    }
    let usage = reply.usage(&done);
    if let Some(log) = &log {
        log.set_tokens(
            done.first().map_or(0, |d| d.prompt_tokens),
            done.iter().map(|d| d.completion_tokens).sum(),
        );
    }
    if let (Some(turn), Some(d)) = (turn, done.first()) {
        turn.complete(&d.text);
    }
    let mut body = reply.object(choices, false);
    body["usage"] = usage;
    Ok(axum::Json(body).into_response())
}

/// What arrives on a streamed answer's merged channels: an event of choice `.0`, or
/// `None` when that choice's channel closed.
type Tagged = (usize, Option<Event>);

/// One choice of a streamed answer.
struct StreamedChoice {
    /// Bytes of text sent so far (completion logprobs' offsets).
    sent: usize,
    /// Where the request has tools: the reply's text split into content and calls.
    calls: Option<CallStream>,
    done: Option<Done>,
}

/// The state of a streamed answer.
struct Streaming {
    reply: Reply,
    events: futures_util::stream::SelectAll<
        std::pin::Pin<Box<dyn futures_util::Stream<Item = Tagged> + Send>>,
    >,
    choices: Vec<StreamedChoice>,
    include_usage: bool,
    turn: Option<SessionTurn>,
    log: Option<Arc<RequestLog>>,
    finished: bool,
}

fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// The events of choice `index`, then `None` once its channel closes.
fn tagged(
    index: usize,
    rx: UnboundedReceiver<Event>,
) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = Tagged> + Send>> {
    Box::pin(futures_util::stream::unfold(
        Some(rx),
        move |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(e) => Some(((index, Some(e)), Some(rx))),
                None => Some(((index, None), None)),
            }
        },
    ))
}

impl Streaming {
    /// The next bytes to send, or `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        use futures_util::StreamExt;
        if self.finished {
            return None;
        }
        loop {
            let (index, got) = match self.events.next().await {
                Some(tagged) => tagged,
                None => {
                    return Some(Bytes::from(
                        self.fail(failure("the model's engine stopped".into())),
                    ))
                }
            };
            let out = match got {
                Some(Event::Token(t)) => match self.token(index, t) {
                    Some(out) => out,
                    None => continue,
                },
                Some(Event::Done(done)) => self.done(index, done),
                Some(Event::Failed(why)) => self.fail(failure(why)),
                Some(Event::Cancelled) => self.fail(cancelled()),
                // A choice's channel closes after its end.
                None if self.choices[index].done.is_some() => continue,
                None => self.fail(failure("the model's engine stopped".into())),
            };
            return Some(Bytes::from(out));
        }
    }

    /// The chunks of a token of choice `index`, if it has any to send yet.
    fn token(&mut self, index: usize, t: TokenOut) -> Option<String> {
        if t.text.is_empty() && t.logprobs.is_none() {
            return None;
        }
        let choice = &mut self.choices[index];
        let lp = match &t.logprobs {
            Some(lp) => self.reply.logprobs(std::slice::from_ref(lp), choice.sent),
            None => Value::Null,
        };
        choice.sent += t.text.len();
        match &mut choice.calls {
            None => Some(event(&self.reply.chunk(index, Some(&t.text), lp, None))),
            Some(calls) => {
                let deltas = calls.push(&t.text);
                if deltas.is_empty() && lp.is_null() {
                    return None;
                }
                Some(self.delta_events(index, deltas, lp))
            }
        }
    }

    /// The end of choice `index`: its last chunk, and after the last choice the usage
    /// and `[DONE]`.
    fn done(&mut self, index: usize, done: Done) -> String {
        let mut finish = done.finish.as_str().to_string();
        let mut out = String::new();
        if let Some(calls) = &mut self.choices[index].calls {
            let (deltas, f) = calls.finish(&finish);
            finish = f;
            if !deltas.is_empty() {
                out = self.delta_events(index, deltas, Value::Null);
            }
        }
        out.push_str(&event(&self.reply.chunk(
            index,
            None,
            Value::Null,
            Some(&finish),
        )));
        self.choices[index].done = Some(done);
        if self.choices.iter().any(|c| c.done.is_none()) {
            return out;
        }
        self.finished = true;
        let done: Vec<Done> = self
            .choices
            .iter_mut()
            .filter_map(|c| c.done.take())
            .collect();
        if self.include_usage {
            let mut usage = self.reply.object(vec![], true);
            usage["usage"] = self.reply.usage(&done);
            out.push_str(&event(&usage));
        }
        out.push_str("data: [DONE]\n\n");
        if let Some(log) = &self.log {
            log.set_tokens(
                done.first().map_or(0, |d| d.prompt_tokens),
                done.iter().map(|d| d.completion_tokens).sum(),
            );
        }
        if let (Some(turn), Some(d)) = (self.turn.take(), done.first()) {
            turn.complete(&d.text);
        }
        out
    }

    /// A chunk per delta of choice `index`, the token's log-probabilities on the first (or
    /// on an empty delta of their own while the text is held back).
    fn delta_events(&self, index: usize, deltas: Vec<Value>, mut logprobs: Value) -> String {
        if deltas.is_empty() {
            return event(&self.reply.chat_chunk(index, json!({}), logprobs, None));
        }
        let mut out = String::new();
        for d in deltas {
            out.push_str(&event(&self.reply.chat_chunk(
                index,
                d,
                std::mem::take(&mut logprobs),
                None,
            )));
        }
        out
    }

    fn fail(&mut self, error: ApiError) -> String {
        self.finished = true;
        if let Some(log) = &self.log {
            log.set_error(&error.message);
        }
        event(&error.body())
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(log) = &self.log {
                log.set_cancelled();
            }
        }
    }
}

fn stream_response(
    reply: Reply,
    receivers: Vec<UnboundedReceiver<Event>>,
    include_usage: bool,
    turn: Option<SessionTurn>,
    log: Option<Arc<RequestLog>>,
) -> Response {
    // The chat stream opens with the assistant's role for each choice, as OpenAI's does.
    let opening: Vec<Bytes> = if reply.chat {
        (0..receivers.len())
            .map(|index| {
                let mut chunk = reply.chunk(index, Some(""), Value::Null, None);
                chunk["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
                Bytes::from(event(&chunk))
            })
            .collect()
    } else {
        Vec::new()
    };
    let choices = (0..receivers.len())
        .map(|_| StreamedChoice {
            sent: 0,
            calls: reply.tool_format.map(CallStream::new),
            done: None,
        })
        .collect();
    let events = futures_util::stream::select_all(
        receivers
            .into_iter()
            .enumerate()
            .map(|(index, rx)| tagged(index, rx)),
    );
    let state = Streaming {
        reply,
        events,
        choices,
        include_usage,
        turn,
        log,
        finished: false,
    };
    let rest = futures_util::stream::unfold(state, |mut s| async move {
        s.next().await.map(|bytes| (Ok::<_, Infallible>(bytes), s))
    });
    let body = futures_util::stream::StreamExt::chain(
        futures_util::stream::iter(opening.into_iter().map(Ok::<_, Infallible>)),
        rest,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
