//! The chat page at `/`: one self-contained HTML file, built into the binary.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("chat.html");

pub async fn chat_page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
