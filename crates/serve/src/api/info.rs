//! Routes that describe the server: health, metrics, models and sessions.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState, ServedKind, ServedModel};
use crate::keys::Caller;
use crate::sessions::{SessionInfo, SessionRefusal};

pub async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    let models: Vec<Value> = state
        .models
        .iter()
        .map(|m| match m.engine() {
            Some(e) => json!({
                "id": m.id,
                "running": e.stats.running.load(Ordering::Relaxed),
                "queued": e.stats.queued.load(Ordering::Relaxed),
                "kv_blocks_used": e.stats.kv_blocks_used.load(Ordering::Relaxed),
                "kv_blocks_total": e.kv_blocks(),
            }),
            None => json!({"id": m.id}),
        })
        .collect();
    Json(json!({"status": "ok", "models": models}))
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let engines = state
        .models
        .iter()
        .filter_map(|m| m.engine().map(|e| (m.id.as_str(), &*e.stats)));
    let text = state.metrics.render(engines, state.sessions.len());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn describe(m: &ServedModel) -> Value {
    let mut v = json!({
        "id": m.id,
        "object": "model",
        "created": m.created,
        "owned_by": "quench",
    });
    match &m.kind {
        ServedKind::Causal { engine, .. } => {
            v["kind"] = "chat".into();
            v["context_length"] = engine.context_limit().into();
        }
        ServedKind::Embedding { model, .. } => {
            v["kind"] = "embedding".into();
            v["dimensions"] = model.dimensions().into();
        }
    }
    v
}

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = state.models.iter().map(|m| describe(m)).collect();
    Json(json!({"object": "list", "data": data}))
}

pub async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let m = state.models.iter().find(|m| m.id == id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the model `{id}` does not exist"),
        )
        .param("model")
        .code("model_not_found")
    })?;
    Ok(Json(describe(m)))
}

/// The caller's sessions, on a server with API keys. Without keys the server cannot tell
/// one client from another (every local client is 127.0.0.1), so listing would show each
/// client the others' session ids: it is refused, and a session is reached by its id.
pub async fn sessions(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    if caller.key.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "sessions are listed only on a server with API keys (start it with --api-key), \
             where each key sees its own; without keys, use a session by its id: \
             GET or DELETE /v1/sessions/ID",
        )
        .code("session_listing_needs_api_key"));
    }
    Ok(Json(
        json!({"object": "list", "data": state.sessions.list(caller)}),
    ))
}

fn unknown_session(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        SessionRefusal::Unknown(id.to_owned()).to_string(),
    )
    .param("session_id")
    .code("session_not_found")
}

/// One session, to whoever may use it (with keys, its key; without, whoever knows its id).
pub async fn session(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    state
        .sessions
        .get(&id, caller)
        .map(Json)
        .ok_or_else(|| unknown_session(&id))
}

/// Forgets a session and drops its KV cache from the engine of its model. Another key's
/// session is 404, as an unknown one.
pub async fn delete_session(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let model = state.sessions.delete(&id, caller).map_err(|e| match e {
        SessionRefusal::Unknown(_) => unknown_session(&id),
        _ => ApiError::new(StatusCode::CONFLICT, e.to_string()).param("session_id"),
    })?;
    let engine = state
        .models
        .iter()
        .find(|m| m.id == model)
        .and_then(|m| m.engine());
    if let Some(engine) = engine {
        engine.drop_session(&id);
    }
    Ok(Json(
        json!({"id": id, "object": "session", "deleted": true}),
    ))
}
