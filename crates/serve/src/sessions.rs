//! Sessions: conversations the server remembers between requests, with their KV cache.
//!
//! A request that names a session continues its conversation: the server prepends what the
//! session already holds (earlier messages and its own replies, or earlier text) and, while
//! the session's KV cache is kept, feeds only what is new. The store here holds the
//! conversations; the engine thread holds the caches and reports their size back.
//!
//! On a server with API keys a session belongs to the key that made it: another key's
//! requests neither see it listed nor continue nor delete it (to them it does not exist).
//! Without keys, a session is read, continued or deleted by whoever knows its id, and never
//! listed (the HTTP route refuses to: every client on one address would see the others').
//!
//! Each key (or, without keys, each address) holds at most a quota of sessions, and the
//! store at most its capacity. A new session past either makes room only from its own
//! maker's sessions: with keys, the key's least recently used idle one is forgotten; without
//! keys nothing is, because the sessions of one address may be several clients' (every
//! local client is 127.0.0.1), and the new one is refused instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use quench_text::Message;
use serde::Serialize;

use crate::keys::Caller;

/// What a session has said so far.
#[derive(Clone, Debug, PartialEq)]
pub enum History {
    /// Nothing yet.
    Empty,
    /// Chat messages, the assistant's replies included.
    Chat(Vec<Message>),
    /// Plain text: prompts and completions, one after the other.
    Text(String),
}

#[derive(Debug)]
struct Entry {
    owner: Caller,
    model: String,
    history: History,
    busy: bool,
    created: i64,
    last_used: Instant,
    turns: usize,
    cached_tokens: usize,
    kv_blocks: usize,
}

/// A session as `GET /v1/sessions` shows it.
#[derive(Debug, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub object: &'static str,
    pub model: String,
    pub created: i64,
    pub turns: usize,
    /// Positions held in the KV cache (0 once evicted: the next turn prefills again).
    pub cached_tokens: usize,
    pub kv_blocks: usize,
    pub busy: bool,
}

/// Why a session cannot take a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionRefusal {
    #[error("session {0:?} is answering another request; send the next turn when it is done")]
    Busy(String),
    #[error("session {id:?} belongs to model {model:?}")]
    OtherModel { id: String, model: String },
    #[error("session {id:?} holds a {held} conversation; continue it with {route}")]
    OtherKind {
        id: String,
        held: &'static str,
        route: &'static str,
    },
    #[error("session {0:?} does not exist")]
    Unknown(String),
    #[error("{0}")]
    Quota(Limit),
}

/// Which limit keeps a new session from being made (answered 429, `session_quota`).
#[derive(Debug, PartialEq, Eq)]
pub enum Limit {
    /// A key holds its quota of sessions, every one of them answering a request.
    Key { held: usize },
    /// An address (on a server without keys) holds its quota of sessions.
    Address { held: usize },
    /// The store holds its capacity, none of it the caller's to forget.
    Server { capacity: usize },
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Key { held } => write!(
                f,
                "this API key holds {held} sessions, its quota, each answering a request; wait \
                 for one to finish or delete one (DELETE /v1/sessions/ID)"
            ),
            Limit::Address { held } => write!(
                f,
                "this address holds {held} sessions, its quota (--sessions-per-client); delete \
                 one (DELETE /v1/sessions/ID) to start another. Without API keys the server \
                 cannot tell the clients of one address apart, so it forgets none of their \
                 sessions to make room"
            ),
            Limit::Server { capacity } => write!(
                f,
                "the server holds its most sessions ({capacity}, --max-sessions) and none of \
                 them is this client's to forget; delete one of yours (DELETE \
                 /v1/sessions/ID) or try again later"
            ),
        }
    }
}

/// All sessions; shared by the HTTP handlers and the engine threads.
#[derive(Debug)]
pub struct SessionStore {
    entries: Mutex<HashMap<String, Entry>>,
    capacity: usize,
    /// Most sessions one key (or address) holds.
    quota: usize,
}

/// A session taken by one request: its history at that time. Give it back with
/// [`SessionStore::finish`] or [`SessionStore::release`].
#[derive(Debug)]
pub struct Claim {
    pub id: String,
    pub history: History,
}

impl SessionStore {
    /// A store that keeps at most `capacity` sessions, at most `quota` of them for one
    /// holder (see [`SessionStore::claim`] for what makes room).
    pub fn new(capacity: usize, quota: usize) -> Arc<Self> {
        Arc::new(SessionStore {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            quota: quota.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic elsewhere while holding the lock leaves plain data; keep serving.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks session `id` busy for a request to `model` that continues a `chat` (or plain
    /// text) history, creating it if new. Returns the history and the id of a session
    /// forgotten to make room, if any (its cache must be dropped too).
    ///
    /// A new session past the holder's quota or the store's capacity takes the place of
    /// the holder's least recently used idle session when the holder is a key; otherwise
    /// (every one of the key's sessions busy, or a server without keys, where one address
    /// may be many clients) it is refused with [`SessionRefusal::Quota`]. Another holder's
    /// session is never forgotten for it.
    pub fn claim(
        &self,
        id: &str,
        model: &str,
        chat: bool,
        owner: Caller,
    ) -> Result<(Claim, Option<String>), SessionRefusal> {
        let mut entries = self.lock();
        if entries.get(id).is_some_and(|e| !owner.may_use(&e.owner)) {
            return Err(SessionRefusal::Unknown(id.to_owned()));
        }
        let mut forgotten = None;
        if !entries.contains_key(id) {
            let holder = owner.holder();
            let held = entries
                .values()
                .filter(|e| e.owner.holder() == holder)
                .count();
            let at_quota = held >= self.quota;
            if at_quota || entries.len() >= self.capacity {
                let own = match owner.key {
                    Some(_) => least_recently_used(&entries, |e| e.owner.holder() == holder),
                    None => None,
                };
                let Some(old) = own else {
                    return Err(SessionRefusal::Quota(match (at_quota, owner.key) {
                        (true, Some(_)) => Limit::Key { held },
                        (true, None) => Limit::Address { held },
                        (false, _) => Limit::Server {
                            capacity: self.capacity,
                        },
                    }));
                };
                entries.remove(&old);
                forgotten = Some(old);
            }
        }
        let entry = entries.entry(id.to_owned()).or_insert_with(|| Entry {
            owner,
            model: model.to_owned(),
            history: History::Empty,
            busy: false,
            created: chrono::Utc::now().timestamp(),
            last_used: Instant::now(),
            turns: 0,
            cached_tokens: 0,
            kv_blocks: 0,
        });
        if entry.busy {
            return Err(SessionRefusal::Busy(id.to_owned()));
        }
        if entry.model != model {
            return Err(SessionRefusal::OtherModel {
                id: id.to_owned(),
                model: entry.model.clone(),
            });
        }
        match (&entry.history, chat) {
            (History::Text(_), true) => {
                return Err(SessionRefusal::OtherKind {
                    id: id.to_owned(),
                    held: "plain-text",
                    route: "/v1/completions",
                })
            }
            (History::Chat(_), false) => {
                return Err(SessionRefusal::OtherKind {
                    id: id.to_owned(),
                    held: "chat",
                    route: "/v1/chat/completions",
                })
            }
            _ => {}
        }
        entry.busy = true;
        entry.last_used = Instant::now();
        Ok((
            Claim {
                id: id.to_owned(),
                history: entry.history.clone(),
            },
            forgotten,
        ))
    }

    /// The request ended with an answer: the session's history becomes `history`.
    pub fn finish(&self, id: &str, history: History) {
        if let Some(e) = self.lock().get_mut(id) {
            e.history = history;
            e.busy = false;
            e.turns += 1;
            e.last_used = Instant::now();
        }
    }

    /// The request ended without an answer: the history stays as it was. A session that
    /// never got an answer is forgotten.
    pub fn release(&self, id: &str) {
        let mut entries = self.lock();
        if let Some(e) = entries.get_mut(id) {
            e.busy = false;
            if e.history == History::Empty {
                entries.remove(id);
            }
        }
    }

    /// Forgets a session `caller` may use that is not busy; returns the model it belonged
    /// to, whose engine holds its KV cache (to be dropped too). Another key's session is
    /// [`SessionRefusal::Unknown`], as an id that does not exist.
    pub fn delete(&self, id: &str, caller: Caller) -> Result<String, SessionRefusal> {
        let mut entries = self.lock();
        match entries.get(id).filter(|e| caller.may_use(&e.owner)) {
            None => Err(SessionRefusal::Unknown(id.to_owned())),
            Some(e) if e.busy => Err(SessionRefusal::Busy(id.to_owned())),
            Some(_) => Ok(entries.remove(id).map(|e| e.model).unwrap_or_default()),
        }
    }

    /// Session `id` as `caller` may see it: `None` when it does not exist or is another
    /// key's.
    pub fn get(&self, id: &str, caller: Caller) -> Option<SessionInfo> {
        let entries = self.lock();
        let e = entries.get(id).filter(|e| caller.may_use(&e.owner))?;
        Some(info(id, e))
    }

    /// Whether session `id` still exists (the engine keeps caches only for those).
    pub fn exists(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The engine reports how much KV cache it keeps for a session.
    pub fn set_cache(&self, id: &str, cached_tokens: usize, kv_blocks: usize) {
        if let Some(e) = self.lock().get_mut(id) {
            e.cached_tokens = cached_tokens;
            e.kv_blocks = kv_blocks;
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sessions `caller` holds (made with its key, or without keys from its address),
    /// most recently used first. The HTTP route lists only with keys: without them one
    /// address may be many clients.
    pub fn list(&self, caller: Caller) -> Vec<SessionInfo> {
        let entries = self.lock();
        let holder = caller.holder();
        let mut list: Vec<(&String, &Entry)> = entries
            .iter()
            .filter(|(_, e)| e.owner.holder() == holder)
            .collect();
        list.sort_by(|a, b| b.1.last_used.cmp(&a.1.last_used).then(a.0.cmp(b.0)));
        list.into_iter().map(|(id, e)| info(id, e)).collect()
    }
}

fn info(id: &str, e: &Entry) -> SessionInfo {
    SessionInfo {
        id: id.to_owned(),
        object: "session",
        model: e.model.clone(),
        created: e.created,
        turns: e.turns,
        cached_tokens: e.cached_tokens,
        kv_blocks: e.kv_blocks,
        busy: e.busy,
    }
}

/// The id of the least recently used idle session among those `which` picks.
fn least_recently_used(
    entries: &HashMap<String, Entry>,
    which: impl Fn(&Entry) -> bool,
) -> Option<String> {
    entries
        .iter()
        .filter(|(_, e)| !e.busy && which(e))
        .min_by_key(|(_, e)| e.last_used)
        .map(|(k, _)| k.clone())
}

/// Whether `id` is acceptable as a session id: 1 to 128 characters out of letters, digits
/// and `-_.:`.
pub fn valid_session_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_keys_sessions_do_not_exist_for_it() {
        let store = SessionStore::new(8, 8);
        let (a, b) = (Caller::with_key(0), Caller::with_key(1));
        let (claim, _) = store.claim("s", "m", true, a).unwrap();
        store.finish(&claim.id, History::Text("secret".into()));
        assert_eq!(
            store.claim("s", "m", true, b).unwrap_err(),
            SessionRefusal::Unknown("s".into())
        );
        assert!(store.list(b).is_empty());
        assert!(store.get("s", b).is_none());
        assert_eq!(
            store.delete("s", b),
            Err(SessionRefusal::Unknown("s".into()))
        );
        assert_eq!(store.list(a).len(), 1);
        assert_eq!(store.get("s", a).map(|s| s.turns), Some(1));
        assert_eq!(store.delete("s", a).as_deref(), Ok("m"));
    }

    #[test]
    fn a_claimed_session_is_busy_until_finished() {
        let store = SessionStore::new(8, 8);
        let (claim, _) = store.claim("s", "m", true, Caller::default()).unwrap();
        assert_eq!(claim.history, History::Empty);
        assert_eq!(
            store.claim("s", "m", true, Caller::default()).unwrap_err(),
            SessionRefusal::Busy("s".into())
        );
        assert!(store.delete("s", Caller::default()).is_err());
        let history = History::Chat(vec![Message::new("user", "hi")]);
        store.finish("s", history.clone());
        assert!(matches!(
            store.claim("s", "other", true, Caller::default()),
            Err(SessionRefusal::OtherModel { .. })
        ));
        assert!(matches!(
            store.claim("s", "m", false, Caller::default()),
            Err(SessionRefusal::OtherKind { .. })
        ));
        let (claim, _) = store.claim("s", "m", true, Caller::default()).unwrap();
        assert_eq!(claim.history, history);
        store.release("s");
        assert_eq!(store.list(Caller::default())[0].turns, 1);
        store.delete("s", Caller::default()).unwrap();
        assert!(store.is_empty());
    }

    #[test]
    fn a_session_without_an_answer_is_forgotten() {
        let store = SessionStore::new(8, 8);
        store.claim("s", "m", false, Caller::default()).unwrap();
        store.release("s");
        assert!(!store.exists("s"));
    }

    #[test]
    fn the_least_recently_used_idle_session_of_a_key_makes_room() {
        let store = SessionStore::new(2, 2);
        let key = Caller::with_key(0);
        for id in ["a", "b"] {
            store.claim(id, "m", true, key).unwrap();
            store.finish(id, History::Chat(vec![]));
        }
        store.claim("a", "m", true, key).unwrap();
        store.finish("a", History::Chat(vec![]));
        let (_, forgotten) = store.claim("c", "m", true, key).unwrap();
        assert_eq!(forgotten.as_deref(), Some("b"));
        assert!(store.exists("a") && store.exists("c") && !store.exists("b"));
    }

    #[test]
    fn a_full_store_forgets_the_callers_own_sessions_only() {
        let store = SessionStore::new(3, 8);
        let (a, b, c) = (
            Caller::with_key(0),
            Caller::with_key(1),
            Caller::with_key(2),
        );
        for (id, owner) in [("a1", a), ("a2", a), ("b1", b)] {
            store.claim(id, "m", true, owner).unwrap();
            store.finish(id, History::Chat(vec![]));
        }
        // b's own session makes room, not a's older ones.
        let (_, forgotten) = store.claim("b2", "m", true, b).unwrap();
        assert_eq!(forgotten.as_deref(), Some("b1"));
        store.finish("b2", History::Chat(vec![]));
        // c holds nothing to forget: refused, and nobody's session goes.
        assert_eq!(
            store.claim("c1", "m", true, c).unwrap_err(),
            SessionRefusal::Quota(Limit::Server { capacity: 3 })
        );
        // Nor without keys.
        assert_eq!(
            store.claim("x", "m", true, Caller::default()).unwrap_err(),
            SessionRefusal::Quota(Limit::Server { capacity: 3 })
        );
        assert!(store.exists("a1") && store.exists("a2") && store.exists("b2"));
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn without_keys_an_address_at_its_quota_is_refused_and_forgets_nothing() {
        let store = SessionStore::new(8, 2);
        // Two clients on one address: what one holds, the other must not lose.
        let local = Caller {
            key: None,
            addr: Some(std::net::IpAddr::from([127, 0, 0, 1])),
        };
        for id in ["first-client", "second-client"] {
            store.claim(id, "m", true, local).unwrap();
            store.finish(id, History::Chat(vec![]));
        }
        let refused = store
            .claim("second-client-2", "m", true, local)
            .unwrap_err();
        assert_eq!(refused, SessionRefusal::Quota(Limit::Address { held: 2 }));
        assert!(refused.to_string().contains("--sessions-per-client"));
        assert!(store.exists("first-client") && store.exists("second-client"));
        // Another address has its own quota.
        let other = Caller {
            addr: Some(std::net::IpAddr::from([10, 0, 0, 2])),
            ..local
        };
        assert!(store.claim("elsewhere", "m", true, other).is_ok());
        // Deleting one makes room.
        assert_eq!(store.delete("first-client", local).as_deref(), Ok("m"));
        assert!(store.claim("second-client-2", "m", true, local).is_ok());
    }

    #[test]
    fn a_client_at_its_quota_makes_room_from_its_own_sessions() {
        let store = SessionStore::new(8, 2);
        let (a, b) = (Caller::with_key(0), Caller::with_key(1));
        for id in ["b1", "a1", "a2"] {
            let owner = if id.starts_with('a') { a } else { b };
            store.claim(id, "m", true, owner).unwrap();
            store.finish(id, History::Chat(vec![]));
        }
        // a is at its quota: its own oldest session goes, not b's (older still).
        let (_, forgotten) = store.claim("a3", "m", true, a).unwrap();
        assert_eq!(forgotten.as_deref(), Some("a1"));
        assert!(store.exists("b1"));
        // With both of a's sessions busy, a third is refused.
        store.claim("a2", "m", true, a).unwrap();
        assert_eq!(
            store.claim("a4", "m", true, a).unwrap_err(),
            SessionRefusal::Quota(Limit::Key { held: 2 })
        );
        assert!(store.exists("b1") && store.exists("a2") && store.exists("a3"));
    }

    #[test]
    fn without_keys_the_id_reaches_a_session_from_any_address() {
        let store = SessionStore::new(8, 8);
        let at = |last: u8| Caller {
            key: None,
            addr: Some(std::net::IpAddr::from([10, 0, 0, last])),
        };
        store.claim("s", "m", true, at(1)).unwrap();
        store.finish("s", History::Chat(vec![]));
        assert_eq!(store.list(at(1)).len(), 1);
        assert!(store.list(at(2)).is_empty());
        // The id alone lets another address see, continue and delete it.
        assert_eq!(store.get("s", at(2)).map(|s| s.turns), Some(1));
        store.claim("s", "m", true, at(2)).unwrap();
        store.finish("s", History::Chat(vec![]));
        assert_eq!(store.delete("s", at(2)).as_deref(), Ok("m"));
        assert!(store.get("s", at(1)).is_none());
    }

    #[test]
    fn session_ids_are_checked() {
        assert!(valid_session_id("chat-42:a_b.c"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("has space"));
        assert!(!valid_session_id(&"x".repeat(129)));
    }
}
