//! Just enough HTTP/1.1 to fetch a `/metrics` page from a server on this machine or
//! the local network: plain `http://`, one GET, a short deadline.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HttpError {
    #[error("{0} is not an http:// URL (https is not supported)")]
    BadUrl(String),
    #[error("cannot reach {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url} sent a malformed response: {reason}")]
    Malformed { url: String, reason: String },
}

/// The pieces of an `http://host[:port][/path]` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub path: String,
}

pub fn parse_url(url: &str) -> Result<Url, HttpError> {
    let bad = || HttpError::BadUrl(url.to_string());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        // A bracketed IPv6 literal keeps its colons.
        Some((h, p)) if !p.contains(']') => (h, p.parse::<u16>().map_err(|_| bad())?),
        _ => (authority, 80),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok(Url {
        host: host.trim_matches(|c| c == '[' || c == ']').to_string(),
        port,
        path: path.to_string(),
    })
}

/// GETs `url` and returns the body, each network step bounded by `timeout`.
pub fn get(url: &str, timeout: Duration) -> Result<String, HttpError> {
    let u = parse_url(url)?;
    let connect_err = |reason: String| HttpError::Connect {
        url: url.to_string(),
        reason,
    };
    let addr = (u.host.as_str(), u.port)
        .to_socket_addrs()
        .map_err(|e| connect_err(e.to_string()))?
        .next()
        .ok_or_else(|| connect_err("host has no address".into()))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| connect_err(e.to_string()))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| connect_err(e.to_string()))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| connect_err(e.to_string()))?;
    let host_header = if u.host.contains(':') {
        format!("[{}]", u.host)
    } else {
        u.host.clone()
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}:{}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
        u.path, host_header, u.port
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| connect_err(e.to_string()))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| connect_err(e.to_string()))?;
    parse_response(url, &raw)
}

/// The body of a complete response, de-chunked; non-2xx statuses are errors.
pub fn parse_response(url: &str, raw: &[u8]) -> Result<String, HttpError> {
    let malformed = |reason: &str| HttpError::Malformed {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| malformed("no end of headers"))?;
    let head =
        std::str::from_utf8(&raw[..split]).map_err(|_| malformed("headers are not UTF-8"))?;
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("bad status line"))?;
    if !(200..300).contains(&status) {
        return Err(HttpError::Status {
            url: url.to_string(),
            status,
        });
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| malformed("bad chunked body"))?
    } else {
        body.to_vec()
    };
    String::from_utf8(body).map_err(|_| malformed("body is not UTF-8"))
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..eol]).ok()?;
        let size_hex = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size..)?.strip_prefix(b"\r\n")?;
    }
}
