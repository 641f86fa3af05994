//! Sessions: conversations the server remembers between requests, with their KV cache.
//!
//! A request that names a session continues its conversation: the server prepends what the
//! session already holds (earlier messages and its own replies, or earlier text) and, while
//! the session's KV cache is kept, feeds only what is new. The store here holds the
//! conversations; the engine thread holds the caches and reports their size back.
//!
//! On a server with API keys a session belongs to the key that made it: another key's
//! requests neither see it listed nor continue nor delete it (to them it does not exist).
//! Without keys, a session is continued or deleted by whoever knows its id, and listed only
//! to the address that made it. Each key (or, without keys, each address) holds at most a
//! quota of sessions: beyond it, its own least recently used idle session makes room, never
//! another client's.

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
    #[error(
        "this client holds {0} sessions, each answering a request; wait for one to finish \
         or delete one (DELETE /v1/sessions/ID)"
    )]
    Quota(usize),
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
    /// holder (the least recently used idle one is forgotten to make room: the holder's own
    /// when it is at its quota).
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
            let room = if held >= self.quota {
                let own = least_recently_used(&entries, |e| e.owner.holder() == holder);
                Some(own.ok_or(SessionRefusal::Quota(held))?)
            } else if entries.len() >= self.capacity {
                least_recently_used(&entries, |_| true)
            } else {
                None
            };
            if let Some(old) = room {
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

    /// Forgets a session of `owner`'s that is not busy.
    pub fn delete(&self, id: &str, owner: Caller) -> Result<(), SessionRefusal> {
        let mut entries = self.lock();
        match entries.get(id).filter(|e| owner.may_use(&e.owner)) {
            None => Err(SessionRefusal::Unknown(id.to_owned())),
            Some(e) if e.busy => Err(SessionRefusal::Busy(id.to_owned())),
            Some(_) => {
                entries.remove(id);
                Ok(())
            }
        }
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
    /// most recently used first.
    pub fn list(&self, caller: Caller) -> Vec<SessionInfo> {
        let entries = self.lock();
        let holder = caller.holder();
        let mut list: Vec<(&String, &Entry)> = entries
            .iter()
            .filter(|(_, e)| e.owner.holder() == holder)
            .collect();
        list.sort_by(|a, b| b.1.last_used.cmp(&a.1.last_used).then(a.0.cmp(b.0)));
        list.into_iter()
            .map(|(id, e)| SessionInfo {
                id: id.clone(),
                object: "session",
                model: e.model.clone(),
                created: e.created,
                turns: e.turns,
                cached_tokens: e.cached_tokens,
                kv_blocks: e.kv_blocks,
                busy: e.busy,
            })
            .collect()
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
        assert_eq!(
            store.delete("s", b),
            Err(SessionRefusal::Unknown("s".into()))
        );
        assert_eq!(store.list(a).len(), 1);
        store.delete("s", a).unwrap();
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
    fn the_least_recently_used_idle_session_makes_room() {
        let store = SessionStore::new(2, 2);
        for id in ["a", "b"] {
            store.claim(id, "m", true, Caller::default()).unwrap();
            store.finish(id, History::Chat(vec![]));
        }
        store.claim("a", "m", true, Caller::default()).unwrap();
        store.finish("a", History::Chat(vec![]));
        let (_, forgotten) = store.claim("c", "m", true, Caller::default()).unwrap();
        assert_eq!(forgotten.as_deref(), Some("b"));
        assert!(store.exists("a") && store.exists("c") && !store.exists("b"));
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
            SessionRefusal::Quota(2)
        );
        assert!(store.exists("b1") && store.exists("a2") && store.exists("a3"));
    }

    #[test]
    fn without_keys_the_list_shows_the_callers_address_only() {
        let store = SessionStore::new(8, 8);
        let at = |last: u8| Caller {
            key: None,
            addr: Some(std::net::IpAddr::from([10, 0, 0, last])),
        };
        store.claim("s", "m", true, at(1)).unwrap();
        store.finish("s", History::Chat(vec![]));
        assert_eq!(store.list(at(1)).len(), 1);
        assert!(store.list(at(2)).is_empty());
        // The id alone lets another address continue it.
        store.claim("s", "m", true, at(2)).unwrap();
        store.finish("s", History::Chat(vec![]));
        store.delete("s", at(2)).unwrap();
    }

    #[test]
    fn session_ids_are_checked() {
        assert!(valid_session_id("chat-42:a_b.c"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("has space"));
        assert!(!valid_session_id(&"x".repeat(129)));
    }
}
