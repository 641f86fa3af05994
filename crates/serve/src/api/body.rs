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
    parse_json(&read_body(headers, body, limits).await?)
}

/// Reads the body and parses it as `A` and `B` (see [`parse_json_split`]).
pub async fn read_json_split<A: DeserializeOwned, B: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<(A, B), ApiError> {
    parse_json_split(&read_body(headers, body, limits).await?)
}

/// Refuses a body not declared as JSON: the forms a web page may POST to another origin
/// without asking first (`text/plain`, `multipart/form-data`, URL-encoded forms) never
/// reach the parser, nor does a body with no `Content-Type`, which a page may send unasked
/// too (a `fetch` of a `Blob` without a type, `navigator.sendBeacon`). OpenAI's clients,
/// and any JSON client, declare `application/json`.
fn check_json_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(given) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the request body must be JSON sent as `Content-Type: application/json`; this \
             request declares no Content-Type",
        )
        .code("unsupported_media_type"));
    };
    let media = given
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if media.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "the request body must be JSON sent as `Content-Type: application/json`, not {:?}",
            String::from_utf8_lossy(given.as_bytes())
        ),
    )
    .code("unsupported_media_type"))
}

/// The body's bytes, refused when not JSON, larger than the limit or slower than the
/// timeout.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<Vec<u8>, ApiError> {
    check_json_type(headers)?;
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
    // A body declared too large is refused at once; what the client still sends is read
    // and dropped beside the answer (see `drain`).
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        tokio::spawn(drain(
            body,
            limits,
            tokio::time::Instant::now() + DRAIN_TIME,
        ));
        return Err(too_large());
    }
    let deadline = tokio::time::Instant::now() + limits.timeout;
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
                tokio::spawn(drain(
                    body,
                    limits,
                    tokio::time::Instant::now() + DRAIN_TIME,
                ));
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// How long the rest of a refused body is read for.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and drops what is left of a body that is too large, while the 413 is sent, so that
/// the client, which may still be sending it, can read the answer instead of a reset
/// connection. At most a few times the limit is read, for at most `DRAIN_TIME`; then the
/// connection closes.
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
    let value = json_object(bytes)?;
    serde_path_to_error::deserialize(value).map_err(field_error)
}

/// Parses a JSON object as two types that each read their own fields of it and ignore the
/// rest: fields that several requests share, and those of one request. (Not one type with the
/// shared fields `#[serde(flatten)]`ed in: serde's flatten loses the path of the field at
/// fault.) Where both find a fault, the error is the one a single type holding all the fields
/// would report.
pub fn parse_json_split<A: DeserializeOwned, B: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(A, B), ApiError> {
    let value = json_object(bytes)?;
    let a = serde_path_to_error::deserialize(&value);
    let b = serde_path_to_error::deserialize(&value);
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(field_error(e)),
        (Err(ea), Err(eb)) => Err(field_error(first_fault(&value, ea, eb))),
    }
}

type FieldError = serde_path_to_error::Error<serde_json::Error>;

/// Of two faults found in `object` by two passes, the one a single pass would meet first:
/// serde visits the fields in the object's order and stops at the first bad one, and it
/// reports a missing field (an error at the root) only after visiting them all. On a tie
/// (both missing), the first pass's.
fn first_fault(object: &serde_json::Value, a: FieldError, b: FieldError) -> FieldError {
    let position = |e: &FieldError| match e.path().iter().next() {
        Some(serde_path_to_error::Segment::Map { key }) => object
            .as_object()
            .and_then(|fields| fields.keys().position(|k| k == key))
            .unwrap_or(usize::MAX),
        _ => usize::MAX,
    };
    if position(&b) < position(&a) {
        b
    } else {
        a
    }
}

/// The body as a JSON object.
fn json_object(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
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
    Ok(value)
}

/// A field's fault as an answer naming the field path and what was wrong with it.
fn field_error(e: FieldError) -> ApiError {
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

    /// Fields shared by several requests (one of them required), one request's own, and
    /// all of them in one type, the shared first.
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Shared {
        alpha: Option<i64>,
        mid: bool,
        zeta: Option<String>,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Own {
        beta: Vec<i64>,
        omega: Option<f64>,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Whole {
        alpha: Option<i64>,
        mid: bool,
        zeta: Option<String>,
        beta: Vec<i64>,
        omega: Option<f64>,
    }

    #[test]
    fn split_reading_refuses_as_one_type_would() {
        use rand::{Rng, SeedableRng};
        use serde_json::{json, Value};

        let seed: u64 = rand::random();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        // Per field: a good value, a bad one, and null (good only where the field is optional).
        let values = |field: &str| -> [Value; 3] {
            match field {
                "alpha" => [json!(7), json!("seven"), Value::Null],
                "mid" => [json!(true), json!(3), Value::Null],
                "zeta" => [json!("z"), json!([1]), Value::Null],
                "beta" => [json!([1, 2]), json!([1, "two"]), Value::Null],
                _ => [json!(1.5), json!({"a": 1}), Value::Null],
            }
        };
        let mut refused = 0;
        for _ in 0..1000 {
            let mut object = serde_json::Map::new();
            for field in ["alpha", "mid", "zeta", "beta", "omega", "extra"] {
                // Absent a quarter of the time.
                if let Some(choice) = [None, Some(0), Some(1), Some(2)][rng.gen_range(0..4)] {
                    object.insert(field.into(), values(field)[choice].clone());
                }
            }
            let bytes = Value::Object(object).to_string().into_bytes();
            let body = String::from_utf8_lossy(&bytes).into_owned();
            match (
                parse_json_split::<Shared, Own>(&bytes),
                parse_json::<Whole>(&bytes),
            ) {
                (Ok(_), Ok(_)) => {}
                (Err(split), Err(whole)) => {
                    refused += 1;
                    let answer = |e: &ApiError| (e.status, e.param.clone(), e.message.clone());
                    assert_eq!(answer(&split), answer(&whole), "seed {seed}, body {body}");
                }
                (split, whole) => panic!(
                    "seed {seed}, body {body}: split {:?}, whole {:?}",
                    split.err(),
                    whole.err()
                ),
            }
        }
        // Most random bodies hold a fault; some must not.
        assert!(
            (500..1000).contains(&refused),
            "seed {seed}: {refused} refused"
        );
    }
}
