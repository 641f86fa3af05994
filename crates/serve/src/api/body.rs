//! Reading a JSON request body within a size limit and a time limit, with errors that name
//! the field at fault.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// How much of a body the server reads, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
}

/// Reads the body and parses it as `T`.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {} bytes", limits.max_bytes),
        )
        .code("request_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let timed_out = || {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                limits.timeout.as_secs_f64()
            ),
        )
        .code("request_timeout")
    };
    let deadline = tokio::time::Instant::now() + limits.timeout;
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        drain(body, limits, deadline).await;
        return Err(too_large());
    }
    let mut body = body;
    let mut bytes = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(timed_out()),
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("the request body could not be read: {e}"),
                ))
            }
        };
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > limits.max_bytes {
                drain(body, limits, deadline).await;
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    parse_json(&bytes)
}

/// Reads and drops what is left of a body that is too large, so that the client, which is
/// still sending it, can read the 413 instead of a reset connection. At most a few times
/// the limit is read, within the body's deadline; beyond that the connection closes.
async fn drain(mut body: Body, limits: BodyLimits, deadline: tokio::time::Instant) {
    let mut left = limits.max_bytes.saturating_mul(16);
    while left > 0 {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len());
                left = left.saturating_sub(n.max(1));
            }
            _ => return,
        }
    }
}

/// Parses a JSON object as `T`; errors name the field path and what was wrong with it.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
        )
        .code("invalid_json")
    })?;
    if !value.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        )
        .code("invalid_json"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            // A missing field: serde names it in the message.
            let field = inner
                .strip_prefix("missing field `")
                .and_then(|r| r.split('`').next())
                .map(str::to_owned);
            let mut err = ApiError::new(StatusCode::BAD_REQUEST, inner);
            err.param = field;
            err.code("invalid_type")
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}")).code("invalid_type")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Req {
        model: String,
        messages: Vec<Msg>,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Msg {
        content: String,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_json::<Req>(br#"{"model": "m", "messages": [{"content": 5}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        assert!(e.message.contains("invalid type: integer"), "{}", e.message);
        let e = parse_json::<Req>(br#"{"messages": []}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = parse_json::<Req>(b"{\"model\": ").unwrap_err();
        assert_eq!(e.code, Some("invalid_json"));
        let e = parse_json::<Req>(b"[1]").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
