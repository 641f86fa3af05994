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
use crate::sessions::SessionRefusal;

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

/// The caller's sessions only.
pub async fn sessions(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Json<Value> {
    Json(json!({"object": "list", "data": state.sessions.list(caller)}))
}

pub async fn delete_session(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let model = state
        .sessions
        .list(caller)
        .into_iter()
        .find(|s| s.id == id)
        .map(|s| s.model);
    state.sessions.delete(&id, caller).map_err(|e| match e {
        SessionRefusal::Unknown(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string())
            .param("session_id")
            .code("session_not_found"),
        _ => ApiError::new(StatusCode::CONFLICT, e.to_string()).param("session_id"),
    })?;
    for m in state
        .models
        .iter()
        .filter(|m| Some(&m.id) == model.as_ref())
    {
        if let Some(engine) = m.engine() {
            engine.drop_session(&id);
        }
    }
    Ok(Json(
        json!({"id": id, "object": "session", "deleted": true}),
    ))
}
