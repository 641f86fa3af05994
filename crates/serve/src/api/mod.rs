//! The HTTP API: routes, shared state, and the request log around every route.

mod body;
mod check;
mod embeddings;
mod error;
mod generate;
mod info;
mod origin;
mod page;
mod tokens;
mod tools;
mod types;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body::{Frame, SizeHint};
use tokio::sync::Semaphore;

pub use body::BodyLimits;
pub use check::{check_request, Endpoint};
pub use error::ApiError;
pub use origin::OriginPolicy;

use crate::backend::EmbeddingBackend;
use crate::keys::{ApiKeys, Caller, Refusal};
use crate::log::{RequestIds, RequestLog};
use crate::metrics::Metrics;
use crate::scheduler::EngineHandle;
use crate::sessions::SessionStore;
use crate::text::TextSide;

/// A model the server answers with.
pub struct ServedModel {
    /// The name clients put in `model`.
    pub id: String,
    pub created: i64,
    pub kind: ServedKind,
}

pub enum ServedKind {
    /// Generates text: its engine thread and its text side.
    Causal {
        engine: EngineHandle,
        text: Arc<dyn TextSide>,
    },
    /// Embeds text, one piece of a request at a time (pieces of waiting requests take
    /// turns in arrival order).
    Embedding {
        model: Arc<dyn EmbeddingBackend>,
        turns: Arc<Semaphore>,
    },
}

impl ServedModel {
    pub fn causal(id: String, engine: EngineHandle, text: Arc<dyn TextSide>) -> Self {
        ServedModel {
            id,
            created: chrono::Utc::now().timestamp(),
            kind: ServedKind::Causal { engine, text },
        }
    }

    pub fn embedding(id: String, model: Arc<dyn EmbeddingBackend>) -> Self {
        ServedModel {
            id,
            created: chrono::Utc::now().timestamp(),
            kind: ServedKind::Embedding {
                model,
                turns: Arc::new(Semaphore::new(1)),
            },
        }
    }

    pub fn is_causal(&self) -> bool {
        matches!(self.kind, ServedKind::Causal { .. })
    }

    pub fn engine(&self) -> Option<&EngineHandle> {
        match &self.kind {
            ServedKind::Causal { engine, .. } => Some(engine),
            ServedKind::Embedding { .. } => None,
        }
    }
}

/// Everything the handlers share.
pub struct AppState {
    pub models: Vec<Arc<ServedModel>>,
    pub sessions: Arc<SessionStore>,
    pub metrics: Arc<Metrics>,
    pub limits: BodyLimits,
    /// Set at shutdown: new requests are refused with 503.
    pub draining: AtomicBool,
    /// Set when the shutdown grace period is over: work still in flight stops at its next
    /// piece.
    pub stopping: AtomicBool,
    pub request_ids: RequestIds,
    /// The keys requests must carry (none: every request is served).
    pub keys: ApiKeys,
    /// The host names and web origins answered.
    pub origins: OriginPolicy,
}

/// The address a connection comes from, put in each request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::IpAddr);

impl AppState {
    /// The model a request names, or the first one of the kind asked for when it names none.
    fn model(&self, name: Option<&str>, causal: bool) -> Result<Arc<ServedModel>, ApiError> {
        let what = if causal {
            "generates text"
        } else {
            "makes embeddings"
        };
        let found = match name {
            Some(name) => self.models.iter().find(|m| m.id == name).ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "the model `{name}` does not exist; GET /v1/models lists the models served"
                    ),
                )
                .param("model")
                .code("model_not_found")
            })?,
            None => self
                .models
                .iter()
                .find(|m| m.is_causal() == causal)
                .ok_or_else(|| {
                    ApiError::invalid("model", format!("no model served here {what}"))
                })?,
        };
        if found.is_causal() != causal {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "the model `{}` {}; this route needs a model that {what}",
                    found.id,
                    if causal {
                        "makes embeddings"
                    } else {
                        "generates text"
                    },
                ),
            ));
        }
        Ok(found.clone())
    }
}

/// The routes, with the request log around them.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(page::chat_page))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/v1/sessions", get(info::sessions))
        .route(
            "/v1/sessions/{id}",
            get(info::session).delete(info::delete_session),
        )
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::check_origin,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            log_requests,
        ))
        .with_state(state)
}

/// With API keys, every route but the health check and the chat page (a static page,
/// which asks for the key when the API answers 401) needs one: 401 otherwise, as OpenAI
/// answers.
async fn require_key(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let open = matches!(request.uri().path(), "/health" | "/");
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match state.keys.check(given) {
        Ok(key) => {
            let addr = request.extensions().get::<ClientAddr>().map(|a| a.0);
            request.extensions_mut().insert(Caller { key, addr });
            next.run(request).await
        }
        Err(_) if open => next.run(request).await,
        Err(refusal) => {
            let message = match refusal {
                Refusal::Missing => {
                    "this server needs an API key: send it as `Authorization: Bearer KEY`"
                }
                Refusal::Wrong => "the API key given is not one this server accepts",
            };
            let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message)
                .code("invalid_api_key")
                .into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            response
        }
    }
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("there is no route {}", request.uri().path()),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// A route's name for logs and metrics: its pattern, not the ids in it.
fn route_name(path: &str) -> String {
    const KNOWN: [&str; 11] = [
        "/",
        "/health",
        "/metrics",
        "/v1/models",
        "/v1/sessions",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/favicon.ico",
    ];
    if KNOWN.contains(&path) {
        path.to_owned()
    } else if path.starts_with("/v1/sessions/") {
        "/v1/sessions/{id}".into()
    } else if path.starts_with("/v1/models/") {
        "/v1/models/{id}".into()
    } else {
        "(unknown)".into()
    }
}

async fn log_requests(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let id = state.request_ids.next();
    let log = Arc::new(RequestLog::new(
        id.clone(),
        request.method().as_str(),
        route_name(request.uri().path()),
        state.metrics.clone(),
    ));
    request.extensions_mut().insert(log.clone());
    let mut response = if state.draining.load(Ordering::Acquire) {
        // Answered (rather than the connection dropped) so that a client on a kept-alive
        // connection learns why, and closed so that it reconnects elsewhere.
        let mut r = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
        .retry_after(5)
        .into_response();
        r.headers_mut().insert(
            axum::http::header::CONNECTION,
            HeaderValue::from_static("close"),
        );
        r
    } else {
        next.run(request).await
    };
    log.set_status(response.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(LoggedBody {
            inner: body,
            _log: log,
        }),
    )
}

/// A response body that keeps its request's log line until the body is dropped.
struct LoggedBody {
    inner: Body,
    _log: Arc<RequestLog>,
}

impl http_body::Body for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
