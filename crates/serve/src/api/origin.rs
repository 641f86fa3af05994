//! Which names and web pages may talk to the server.
//!
//! - **Host.** A web page on another site can make a browser send requests to a server on
//!   the browser's own machine by pointing a name of its own at 127.0.0.1 (DNS rebinding);
//!   such requests carry that name in `Host`. The server answers only requests whose `Host`
//!   is an IP address, `localhost`, the name it was bound to, this machine's name (when
//!   bound to every interface) or a name given with `--allowed-host`.
//! - **Origin.** A browser names the page that sends a request in `Origin`. Requests from a
//!   page of the server itself (the chat page) are answered; requests from other pages only
//!   when `--cors-origin` names their origin, and then with CORS headers (preflights
//!   included). Every other request with an `Origin` is refused, so that a page cannot even
//!   send one that needs no preflight.
//!
//! Clients that are not browsers send no `Origin` and are not affected by the second rule.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

/// The names and origins the server answers.
#[derive(Clone, Debug, Default)]
pub struct OriginPolicy {
    /// Host names accepted besides IP addresses and `localhost` (lower case, no port).
    hosts: Vec<String>,
    any_host: bool,
    /// Origins (`scheme://host[:port]`, lower case) whose pages may call the API.
    cors: Vec<String>,
    any_origin: bool,
}

impl OriginPolicy {
    /// `allowed_hosts` and `cors_origins` as given (`*` accepts any); `bound` is the name
    /// or address the server listens on, `machine` this machine's host name.
    pub fn new(
        allowed_hosts: &[String],
        cors_origins: &[String],
        bound: &str,
        machine: Option<&str>,
    ) -> Result<OriginPolicy, String> {
        let mut policy = OriginPolicy::default();
        for h in allowed_hosts {
            let h = h.trim().to_ascii_lowercase();
            if h == "*" {
                policy.any_host = true;
            } else if h.is_empty() || h.contains(['/', ' ']) {
                return Err(format!("--allowed-host {h:?} is not a host name"));
            } else {
                policy.hosts.push(strip_port(&h).to_owned());
            }
        }
        let bound = bound.trim().to_ascii_lowercase();
        let everywhere = matches!(bound.parse::<IpAddr>(), Ok(ip) if ip.is_unspecified());
        if everywhere {
            if let Some(m) = machine {
                policy.hosts.push(m.trim().to_ascii_lowercase());
            }
        } else {
            policy.hosts.push(bound);
        }
        for o in cors_origins {
            let o = o.trim().trim_end_matches('/').to_ascii_lowercase();
            if o == "*" {
                policy.any_origin = true;
            } else if !(o.starts_with("http://") || o.starts_with("https://"))
                || o.split_once("://")
                    .is_some_and(|(_, rest)| rest.is_empty() || rest.contains('/'))
            {
                return Err(format!(
                    "--cors-origin {o:?} is not an origin such as https://app.example.com"
                ));
            } else {
                policy.cors.push(o);
            }
        }
        Ok(policy)
    }

    /// Whether a request with this `Host` header value (if any) is answered.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            // Only HTTP/1.0 clients leave it out; browsers always send it.
            return true;
        };
        let name = strip_port(host).to_ascii_lowercase();
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        self.any_host
            || bare.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || self.hosts.contains(&name)
    }

    /// Whether a page of `origin` may call the API, for a request sent to `host`.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> Allowed {
        let origin = origin.to_ascii_lowercase();
        let same = host.is_some_and(|h| {
            origin
                .split_once("://")
                .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(h))
        });
        if same {
            Allowed::SameOrigin
        } else if self.any_origin || self.cors.contains(&origin) {
            Allowed::Cors
        } else {
            Allowed::No
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Allowed {
    SameOrigin,
    Cors,
    No,
}

/// `host` without a port: `name:8080` → `name`, `[::1]:8080` → `[::1]`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        // A bare IPv6 address has more than one colon and no port.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Refuses requests for names or from pages the server does not answer, answers CORS
/// preflights, and adds CORS headers for the origins allowed.
pub async fn check_origin(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let policy = &state.origins;
    let headers = request.headers();
    let host = header_str(headers, header::HOST);
    if !policy.host_allowed(host) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this server does not answer requests for the host {:?}; start it with \
                 --allowed-host NAME to accept a name",
                host.unwrap_or("")
            ),
        )
        .code("host_not_allowed")
        .into_response();
    }
    let Some(origin) = header_str(headers, header::ORIGIN).map(str::to_owned) else {
        return next.run(request).await;
    };
    match policy.origin_allowed(&origin, host) {
        Allowed::SameOrigin => next.run(request).await,
        Allowed::No => ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "requests from pages of {origin:?} are not allowed; start the server with \
                 --cors-origin {origin} to allow them"
            ),
        )
        .code("origin_not_allowed")
        .into_response(),
        Allowed::Cors => {
            let preflight = request.method() == Method::OPTIONS
                && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
            let mut response = if preflight {
                let mut r = StatusCode::NO_CONTENT.into_response();
                let h = r.headers_mut();
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_METHODS,
                    HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
                );
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_HEADERS,
                    HeaderValue::from_static("authorization, content-type, x-session-id"),
                );
                h.insert(
                    header::ACCESS_CONTROL_MAX_AGE,
                    HeaderValue::from_static("600"),
                );
                r
            } else {
                next.run(request).await
            };
            let h = response.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&origin) {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            }
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("x-request-id, retry-after"),
            );
            h.append(header::VARY, HeaderValue::from_static("origin"));
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str], cors: &[&str], bound: &str) -> OriginPolicy {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        OriginPolicy::new(&own(hosts), &own(cors), bound, Some("box")).expect("valid policy")
    }

    #[test]
    fn hosts_are_addresses_localhost_or_named() {
        let p = policy(&["api.example.com"], &[], "127.0.0.1");
        for ok in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "::1",
            "localhost:8080",
            "LOCALHOST",
            "api.example.com:443",
        ] {
            assert!(p.host_allowed(Some(ok)), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8080", "box", "127.0.0.1.evil"] {
            assert!(!p.host_allowed(Some(bad)), "{bad}");
        }
        // Bound to every interface, this machine's name is one of its own.
        assert!(policy(&[], &[], "0.0.0.0").host_allowed(Some("box:8080")));
        assert!(policy(&["*"], &[], "127.0.0.1").host_allowed(Some("anything")));
    }

    #[test]
    fn origins_are_the_servers_own_or_listed() {
        let p = policy(&[], &["https://app.example.com"], "127.0.0.1");
        let host = Some("127.0.0.1:8080");
        assert!(p.origin_allowed("http://127.0.0.1:8080", host) == Allowed::SameOrigin);
        assert!(p.origin_allowed("https://APP.example.com", host) == Allowed::Cors);
        assert!(p.origin_allowed("https://evil.example", host) == Allowed::No);
        assert!(p.origin_allowed("null", host) == Allowed::No);
        assert!(p.origin_allowed("http://127.0.0.1:9090", host) == Allowed::No);
    }

    #[test]
    fn bad_flags_are_refused() {
        let own = |s: &str| vec![s.to_owned()];
        assert!(OriginPolicy::new(&[], &own("app.example.com"), "127.0.0.1", None).is_err());
        assert!(OriginPolicy::new(&[], &own("https://a.com/path"), "127.0.0.1", None).is_err());
        assert!(OriginPolicy::new(&own("a b"), &[], "127.0.0.1", None).is_err());
    }
}
