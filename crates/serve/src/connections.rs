//! Open connections per client address, so that one address (a slowloris, a runaway
//! client) cannot take every connection slot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// How many connections each address holds open.
#[derive(Debug)]
pub struct PerAddress {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection of an address; dropping it closes its place.
#[derive(Debug)]
pub struct Place {
    table: Arc<PerAddress>,
    addr: IpAddr,
}

impl PerAddress {
    pub fn new(limit: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress {
            limit: limit.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection from `addr`, unless it holds the limit already.
    pub fn enter(self: &Arc<Self>, addr: IpAddr) -> Option<Place> {
        let mut open = self.lock();
        let n = open.entry(addr).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Place {
            table: self.clone(),
            addr,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

/// What a connection past its address's limit is told before it is closed: a complete
/// HTTP response, so that the client sees why rather than a reset.
pub fn refusal(limit: usize) -> Vec<u8> {
    let body = crate::api::ApiError::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        format!(
            "this address holds {limit} connections to the server already; \
             close one or reuse it (keep-alive)"
        ),
    )
    .code("too_many_connections")
    .body()
    .to_string();
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit() {
        let table = PerAddress::new(2);
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let first = table.enter(a).unwrap();
        let _second = table.enter(a).unwrap();
        assert!(table.enter(a).is_none());
        assert!(table.enter(b).is_some());
        drop(first);
        let _third = table.enter(a).unwrap();
        assert!(table.enter(a).is_none());
    }

    #[test]
    fn the_refusal_is_a_whole_response() {
        let text = String::from_utf8(refusal(4)).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 429"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }
}
