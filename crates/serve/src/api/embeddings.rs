//! `POST /v1/embeddings`.

use std::sync::atomic::Ordering::{Acquire, Relaxed};
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

/// Most text, in bytes, embedded in one turn of the model (a longer text is a turn of its
/// own): about 500 tokens. A large request takes its turns between other requests' (the
/// turns go in arrival order), and stops at its next turn when its client goes away or the
/// server's shutdown grace is over.
const PIECE_BYTES: usize = 2048;

/// The ranges of `texts` embedded in one turn each.
fn pieces(texts: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, t) in texts.iter().enumerate() {
        if i > start && bytes + t.len() > PIECE_BYTES {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += t.len();
    }
    if start < texts.len() {
        out.push(start..texts.len());
    }
    out
}

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
    let ServedKind::Embedding { model, turns } = &served.kind else {
        return Err(ApiError::invalid(
            "model",
            "this model does not make embeddings",
        ));
    };
    let texts = req.input.0;
    if texts.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "input must hold at least one text",
        ));
    }
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!(
                "input holds {} texts; at most {MAX_INPUTS} are taken",
                texts.len()
            ),
        ));
    }
    if let Some(i) = texts.iter().position(|t| t.is_empty()) {
        return Err(ApiError::invalid(
            format!("input[{i}]"),
            "input texts must not be empty",
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format {other:?} is not one of \"float\", \"base64\""),
            ))
        }
    };
    let dims = model.dimensions();
    if let Some(d) = req.dimensions {
        if d != dims as i64 {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model makes vectors of {dims} dimensions, not {d}"),
            ));
        }
    }
    let texts = Arc::new(texts);
    let mut out = Vec::with_capacity(texts.len());
    for range in pieces(&texts) {
        let (start, end) = (range.start, range.end);
        if state.stopping.load(Acquire) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server shut down before the embeddings were finished",
            ));
        }
        let unloading =
            |_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is unloading");
        // The turn is held by the piece's thread, so that a piece whose client has gone
        // still keeps the next one waiting until it ends.
        let turn = turns.clone().acquire_owned().await.map_err(unloading)?;
        let (worker, texts, metrics) = (model.clone(), texts.clone(), state.metrics.clone());
        let piece = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let refs: Vec<&str> = texts[start..end].iter().map(String::as_str).collect();
            let piece = worker.embed(&refs)?;
            // Counted as each piece is done: the metrics show the work as it goes.
            let tokens = piece.iter().map(|e| e.tokens as u64).sum();
            metrics
                .embedding_inputs
                .fetch_add(piece.len() as u64, Relaxed);
            metrics.embedding_tokens.fetch_add(tokens, Relaxed);
            Ok::<_, crate::backend::BackendError>(piece)
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("embedding failed: {e}"),
            )
        })?
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("input[{start}..{end}]: {e}"),
            )
        })?;
        out.extend(piece);
    }
    let tokens: usize = out.iter().map(|e| e.tokens).sum();
    if let Some(log) = &log {
        log.set_tokens(tokens, 0);
    }
    let data: Vec<Value> = out
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let embedding = if base64 {
                json!(base64_f32(&e.vector))
            } else {
                json!(e.vector)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": served.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// The vector as little-endian f32 bytes in standard base64, as OpenAI sends
/// `encoding_format: "base64"`.
fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{base64_f32, pieces};

    #[test]
    fn texts_are_embedded_in_pieces_of_bounded_size() {
        let texts = |lens: &[usize]| lens.iter().map(|&n| "x".repeat(n)).collect::<Vec<_>>();
        assert_eq!(
            pieces(&texts(&[1000, 1000, 100, 5000, 10])),
            [0..2, 2..3, 3..4, 4..5]
        );
        assert_eq!(pieces(&texts(&[1; 3000])).len(), 2);
        assert_eq!(pieces(&texts(&[1; 3000]))[0], 0..2048);
        assert!(pieces(&[]).is_empty());
    }

    #[test]
    fn base64_of_f32_bytes() {
        // 1.0f32 = 00 00 80 3f; -2.5f32 = 00 00 20 c0
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
