//! `POST /v1/embeddings`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::body::read_json;
use super::types::EmbeddingRequest;
use super::{ApiError, AppState, ServedKind};
use crate::log::RequestLog;

/// Most texts in one request.
const MAX_INPUTS: usize = 2048;

pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let log = request.extensions().get::<Arc<RequestLog>>().cloned();
    let (parts, body) = request.into_parts();
    let req: EmbeddingRequest = read_json(&parts.headers, body, state.limits).await?;
    let served = state.model(req.model.as_deref(), false)?;
    if let Some(log) = &log {
        log.set_model(&served.id);
    }
    let ServedKind::Embedding { model, busy } = &served.kind else {
        return Err(ApiError::invalid("model", "this model does not make embeddings"));
    };
    let texts = req.input.0;
    if texts.is_empty() {
        return Err(ApiError::invalid("input", "input must hold at least one text"));
    }
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("input holds {} texts; at most {MAX_INPUTS} are taken", texts.len()),
        ));
    }
    if let Some(i) = texts.iter().position(|t| t.is_empty()) {
        return Err(ApiError::invalid(format!("input[{i}]"), "input texts must not be empty"));
    }
    match req.encoding_format.as_deref() {
        None | Some("float") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format {other:?} is not supported; use \"float\""),
            ))
        }
    }
    let dims = model.dimensions();
    if let Some(d) = req.dimensions {
        if d != dims as i64 {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model makes vectors of {dims} dimensions, not {d}"),
            ));
        }
    }
    // One request at a time per model, off the async threads.
    let _turn = busy
        .acquire()
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is unloading"))?;
    let worker = model.clone();
    let out = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        worker.embed(&refs)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("embedding failed: {e}")))?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let tokens: usize = out.iter().map(|e| e.tokens).sum();
    let metrics = &state.metrics;
    metrics
        .embedding_inputs
        .fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
    metrics
        .embedding_tokens
        .fetch_add(tokens as u64, std::sync::atomic::Ordering::Relaxed);
    if let Some(log) = &log {
        log.set_tokens(tokens, 0);
    }
    let data: Vec<Value> = out
        .into_iter()
        .enumerate()
        .map(|(i, e)| json!({"object": "embedding", "index": i, "embedding": e.vector}))
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": served.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}
