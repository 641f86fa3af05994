//! API keys: the bearer tokens a client must present (`Authorization: Bearer KEY`) on every
//! route but `/health` and the chat page, when the server is given any.
//!
//! Keys are kept as SHA-256 digests and a presented key's digest is compared with every
//! one of them in full, so the time an answer takes does not depend on how much of a key
//! a guess got right, nor on which key matched.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// The keys a server accepts; none means every request is served.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

/// Who sent a request: the index of the key it carried (`None` on a server without keys)
/// and the address it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    pub key: Option<usize>,
    pub addr: Option<IpAddr>,
}

/// Whom a session counts against (its owner's quota) and whose list shows it: the key that
/// made it, or on a server without keys the address it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Key(usize),
    Addr(Option<IpAddr>),
}

impl Caller {
    /// A caller with key `key` (a server with keys), from no particular address.
    pub fn with_key(key: usize) -> Caller {
        Caller {
            key: Some(key),
            addr: None,
        }
    }

    /// Whether this caller may continue or delete a session `owner` made: with keys, only
    /// the same key may; without keys, anyone who knows the session's id.
    pub fn may_use(&self, owner: &Caller) -> bool {
        self.key == owner.key
    }

    pub fn holder(&self) -> Holder {
        match self.key {
            Some(k) => Holder::Key(k),
            None => Holder::Addr(self.addr),
        }
    }
}

/// Why a request was not let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that is not one of the server's.
    Wrong,
}

impl ApiKeys {
    /// Refuses an empty key and one with white space or control characters (which no
    /// header could carry intact).
    pub fn new(keys: &[String]) -> Result<ApiKeys, String> {
        let mut digests = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            if k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "API key {} is empty or holds white space or control characters",
                    i + 1
                ));
            }
            digests.push(digest(k));
        }
        Ok(ApiKeys { digests })
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The index of the key a request with this `Authorization` header value carries
    /// (`None` on a server without keys), if it may go on.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<Option<usize>, Refusal> {
        if self.digests.is_empty() {
            return Ok(None);
        }
        let key = authorization
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .ok_or(Refusal::Missing)?;
        let d: [u8; 32] = Sha256::digest(key).into();
        // Every key is compared, and the match is selected without a branch on it.
        let matched = self
            .digests
            .iter()
            .enumerate()
            .fold(0usize, |found, (i, k)| {
                let mask = 0usize.wrapping_sub(usize::from(same(k, &d)));
                found | ((i + 1) & mask)
            });
        match matched {
            0 => Err(Refusal::Wrong),
            n => Ok(Some(n - 1)),
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equal digests, every byte compared whatever the first difference.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_by_value() {
        let keys = ApiKeys::new(&["sk-one".into(), "sk-two".into()]).expect("valid keys");
        assert_eq!(keys.check(Some(b"Bearer sk-one")), Ok(Some(0)));
        assert_eq!(keys.check(Some(b"Bearer sk-two")), Ok(Some(1)));
        assert_eq!(keys.check(Some(b"Bearer sk-on")), Err(Refusal::Wrong));
        assert_eq!(keys.check(Some(b"Bearer sk-one ")), Err(Refusal::Wrong));
        assert_eq!(keys.check(Some(b"sk-one")), Err(Refusal::Missing));
        assert_eq!(keys.check(None), Err(Refusal::Missing));
        assert_eq!(ApiKeys::default().check(None), Ok(None));
    }

    #[test]
    fn unusable_keys_are_refused() {
        for bad in ["", "two words", "tab\there"] {
            assert!(ApiKeys::new(&[bad.to_string()]).is_err(), "{bad:?}");
        }
    }
}
