//! The engine thread of one causal model: continuous batching over a KV block budget.
//!
//! Requests arrive as [`Job`]s and wait in a queue. Between two steps the scheduler admits
//! waiting jobs into the running batch while there is room (`max_batch`) and KV blocks for
//! the whole prompt. Each step then moves the running sequences forward: every decoding
//! one draws a token and feeds it, and those still reading their prompts feed their next
//! chunks, oldest first, `prefill_chunk` prompt tokens in all, so that long prompts do not
//! stall the streams already flowing and a prompt alone is read in few steps.
//!
//! KV memory is counted in blocks of [`blocks::BLOCK_TOKENS`] positions. A sequence that
//! needs a block when none is free first evicts idle session caches (least recently used
//! first), then pauses the youngest running sequence, which returns to the head of the
//! queue and later recomputes its cache from its tokens. The oldest sequence is never
//! paused, so the batch always progresses. A request whose client went away is dropped at
//! the next step and its blocks freed.
//!
//! A request for several choices (`n` > 1) feeds its prompt once: when it is fed, each
//! other choice starts from a fork of the cache (on the GPU its whole blocks shared, not
//! copied) and draws with a seed of its own.

pub mod blocks;
mod logprobs;
mod prefix;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use quench_engine::generate::{Constraint, Piece, Sampler, SamplingParams, TextStream};
use quench_engine::{BatchItem, CausalModel, Fed, Session};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::EngineStats;
use crate::sessions::SessionStore;
use crate::text::TextSide;
use blocks::{blocks_for, BlockPool, BLOCK_TOKENS};
pub use logprobs::TokenLogprob;
use prefix::{Pin, PrefixCache};

/// How the scheduler is sized.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// KV blocks of [`blocks::BLOCK_TOKENS`] positions shared by all sequences and sessions.
    pub kv_blocks: usize,
    /// Most requests waiting to be admitted; beyond it requests are refused.
    pub queue: usize,
    /// Most prompt tokens fed in one step, shared by the sequences reading prompts (oldest
    /// first).
    pub prefill_chunk: usize,
    /// Keep finished prompts' KV blocks for later requests that start the same way
    /// ([`prefix`]).
    pub prefix_cache: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 16,
            kv_blocks: 4096,
            queue: 64,
            prefill_chunk: 512,
            prefix_cache: true,
        }
    }
}

/// One generation request, as the HTTP side hands it over.
pub struct Job {
    pub request_id: String,
    pub prompt: Vec<u32>,
    /// A session whose KV cache the prompt may continue, and which keeps it afterwards.
    pub session: Option<String>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// `Some(n)`: report each drawn token's log-probability and the `n` most likely.
    pub logprobs: Option<usize>,
    /// Keep drawing past end-of-sequence tokens (they are then part of the text), for
    /// answers of a fixed length.
    pub ignore_eos: bool,
    /// `response_format`'s grammar: each step's logits are masked to what it allows, and
    /// the reply ends once it is complete.
    pub constraint: Option<Box<Constraint>>,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
    /// The events of the request's other choices (`n` > 1), in order: choice `k` (from 1)
    /// continues the prompt from a fork of this job's cache and draws with the seed
    /// `sampling.seed + k`.
    pub siblings: Vec<UnboundedSender<Event>>,
}

impl Job {
    /// Whether the model may pick this job's tokens itself: greedy decoding with nothing
    /// that changes or reports the logits, and no other choices to start from them.
    fn picks_largest_logit(&self) -> bool {
        self.sampling.picks_largest_logit() && self.logprobs.is_none() && self.siblings.is_empty()
    }

    /// Choice `k` (from 1) of this job: the same request, answered on `events`.
    fn sibling(&self, k: usize, events: UnboundedSender<Event>) -> Job {
        let mut sampling = self.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(k as u64);
        Job {
            request_id: self.request_id.clone(),
            prompt: self.prompt.clone(),
            session: None,
            max_tokens: self.max_tokens,
            sampling,
            stop: self.stop.clone(),
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            constraint: self.constraint.clone(),
            events,
            arrived: self.arrived,
            siblings: Vec::new(),
        }
    }

    /// Tells the job's choices, those not started yet included.
    fn tell_all(&self, event: impl Fn() -> Event) {
        for events in std::iter::once(&self.events).chain(&self.siblings) {
            let _ = events.send(event());
        }
    }
}

/// What the engine tells the HTTP side about a job.
#[derive(Debug)]
pub enum Event {
    Token(TokenOut),
    Done(Done),
    /// The model failed, or the request cannot be served (named in the message).
    Failed(String),
    /// The server shut down before the request finished.
    Cancelled,
}

#[derive(Debug)]
pub struct TokenOut {
    pub token: u32,
    /// Text that became final with this token (possibly empty).
    pub text: String,
    /// The drawn token's log-probability and the most likely alternatives.
    pub logprobs: Option<(TokenLogprob, Vec<TokenLogprob>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token, a stop string, or a `response_format` grammar complete.
    Stop,
    /// `max_tokens`, the context, or the KV budget ran out.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Debug)]
pub struct Done {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens that a session's KV cache already held.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The whole generated text (cut before a stop string).
    pub text: String,
}

/// The admission queue is full.
#[derive(Debug, thiserror::Error)]
#[error("the server is busy: {0} requests are already waiting")]
pub struct QueueFull(pub usize);

enum Command {
    Submit(Box<Job>),
    DropSession(String),
    /// Finish what is running or waiting, cancelling whatever is left at the deadline.
    Shutdown(Instant),
}

/// The HTTP side's handle on an engine thread.
pub struct EngineHandle {
    commands: Mutex<Sender<Command>>,
    /// Jobs submitted and not yet admitted.
    waiting: Arc<AtomicUsize>,
    queue_capacity: usize,
    context_limit: usize,
    kv_blocks: usize,
    pub stats: Arc<EngineStats>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts the scheduler thread of `model`.
    pub fn start(
        name: &str,
        model: Arc<CausalModel>,
        text: Arc<dyn TextSide>,
        config: EngineConfig,
        sessions: Arc<SessionStore>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(EngineStats::new(config.kv_blocks));
        let context_limit = model.info().context_limit;
        let scheduler = Scheduler {
            pool: BlockPool::new(config.kv_blocks),
            config: config.clone(),
            model,
            text,
            sessions,
            commands: rx,
            waiting: waiting.clone(),
            stats: stats.clone(),
            queue: VecDeque::new(),
            running: Vec::new(),
            idle: HashMap::new(),
            prefix: PrefixCache::default(),
            deadline: None,
            next_order: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || scheduler.run())?;
        Ok(EngineHandle {
            commands: Mutex::new(tx),
            waiting,
            queue_capacity: config.queue,
            context_limit,
            kv_blocks: config.kv_blocks,
            stats,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    pub fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    fn send(&self, command: Command) -> bool {
        let tx = self.commands.lock().unwrap_or_else(|e| e.into_inner());
        tx.send(command).is_ok()
    }

    /// Queues a job, or refuses it when `queue` jobs are already waiting. Events arrive on
    /// the job's channel; if the engine has stopped, the channel closes without any.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        let cap = self.queue_capacity;
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < cap).then_some(w + 1)
            })
            .map_err(|_| QueueFull(cap))?;
        if !self.send(Command::Submit(Box::new(job))) {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Drops the KV cache the engine keeps for a session.
    pub fn drop_session(&self, id: &str) {
        self.send(Command::DropSession(id.to_owned()));
    }

    /// Asks the engine to finish its work by `deadline`, cancelling what is left then, and
    /// waits for its thread to end.
    pub fn shutdown(&self, deadline: Instant) {
        self.send(Command::Shutdown(deadline));
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// A request inside the engine.
struct Seq {
    job: Job,
    /// The prompt followed by the generated tokens that belong to the context.
    tokens: Vec<u32>,
    prompt_len: usize,
    cache: Option<Session>,
    /// Positions of `tokens` held by `cache`.
    fed: usize,
    /// KV blocks held and counted by this sequence: those it does not share through `pin`.
    blocks: usize,
    /// The prefix-cache entry whose first blocks `cache` shares.
    pin: Option<Pin>,
    /// Whether the positions of its prompt came from the prompt path alone, so that its
    /// cache may serve later requests (not so after a session's earlier turns).
    cacheable: bool,
    /// Once the whole of `tokens` is fed: the logits after the last token, or the next
    /// token where the model picked it (greedy decoding, on the GPU under the grammar's
    /// mask on the device).
    next: Option<Fed>,
    /// Tokens fed this step (none while it waits for the step's prompt budget).
    planned: usize,
    sampler: Sampler,
    out: TextStream,
    generated: Vec<u32>,
    cached_tokens: usize,
    admitted_before: bool,
    last_token_at: Option<Instant>,
}

struct Idle {
    cache: Session,
    tokens: Vec<u32>,
    /// As [`Seq::blocks`].
    blocks: usize,
    pin: Option<Pin>,
    last_used: u64,
}

enum Drawn {
    Continue,
    Finished(Finish),
    Gone,
}

struct Scheduler {
    config: EngineConfig,
    model: Arc<CausalModel>,
    text: Arc<dyn TextSide>,
    sessions: Arc<SessionStore>,
    commands: Receiver<Command>,
    waiting: Arc<AtomicUsize>,
    stats: Arc<EngineStats>,
    pool: BlockPool,
    queue: VecDeque<Seq>,
    /// In admission order: the oldest first.
    running: Vec<Seq>,
    /// KV caches of sessions between their turns.
    idle: HashMap<String, Idle>,
    /// KV caches of finished prompts, for requests that start the same way.
    prefix: PrefixCache,
    deadline: Option<Instant>,
    /// Orders idle caches by last use.
    next_order: u64,
}

impl Seq {
    fn new(job: Job, sampler: Sampler) -> Seq {
        Seq {
            tokens: job.prompt.clone(),
            prompt_len: job.prompt.len(),
            out: TextStream::new(&job.stop),
            cacheable: job.session.is_none(),
            job,
            cache: None,
            fed: 0,
            blocks: 0,
            pin: None,
            next: None,
            planned: 0,
            sampler,
            generated: Vec::new(),
            cached_tokens: 0,
            admitted_before: false,
            last_token_at: None,
        }
    }

    /// Blocks its cache holds, those shared with a prefix-cache entry included.
    fn held(&self) -> usize {
        self.blocks + self.pin.map_or(0, |p| p.shared)
    }
}

/// Tokens to feed of a sequence with `remaining` left, at most `limit` a step. A prompt's
/// token is never fed alone but where it is the whole of it: a single token takes a decode
/// step, whose rounding differs from the prompt path's, and the positions would not get
/// the bits they get when the same prompt is cut elsewhere (as a prefix-cache hit cuts
/// it).
fn chunk_len(remaining: usize, limit: usize) -> usize {
    let n = remaining.min(limit.max(1));
    match remaining - n {
        1 if limit >= 2 && n > 2 => n - 1,
        1 if limit >= 2 => n + 1,
        _ => n,
    }
}

impl Scheduler {
    fn run(mut self) {
        loop {
            if !self.receive() {
                break;
            }
            self.drop_gone();
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            self.admit();
            if !self.running.is_empty() {
                self.step();
            }
            self.publish();
        }
        self.cancel_all();
        self.publish();
    }

    /// Takes commands: waits for one while there is nothing to do, then takes whatever else
    /// has arrived. False once the engine should stop.
    fn receive(&mut self) -> bool {
        if self.running.is_empty() && self.queue.is_empty() {
            if self.deadline.is_some() {
                return false;
            }
            match self.commands.recv() {
                Ok(c) => self.handle(c),
                Err(_) => return false,
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(c) => self.handle(c),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => {
                    // Every handle is gone: finish what runs, then stop.
                    self.deadline.get_or_insert_with(Instant::now);
                    return true;
                }
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(job) => {
                let job = *job;
                let sampler = match Sampler::new(job.sampling.clone()) {
                    Ok(s) => s,
                    Err(e) => {
                        self.waiting.fetch_sub(1, Ordering::AcqRel);
                        job.tell_all(|| Event::Failed(e.to_string()));
                        return;
                    }
                };
                self.queue.push_back(Seq::new(job, sampler));
            }
            Command::DropSession(id) => {
                if let Some(idle) = self.idle.remove(&id) {
                    self.drop_idle(idle);
                }
            }
            Command::Shutdown(deadline) => self.deadline = Some(deadline),
        }
    }

    /// Lets go of a pin on a prefix-cache entry, giving back what that frees.
    fn unpin(&mut self, pin: Option<Pin>) {
        if let Some(pin) = pin {
            let freed = self.prefix.release(pin);
            self.pool.give_back(freed);
        }
    }

    /// Drops a session's idle cache, giving back its blocks.
    fn drop_idle(&mut self, idle: Idle) {
        self.pool.give_back(idle.blocks);
        self.unpin(idle.pin);
    }

    /// Lets go of a sequence that ends without an answer: its blocks, its place in the
    /// admission count, and the session cache it had taken.
    fn discard(&mut self, seq: &mut Seq) {
        self.pool.give_back(seq.blocks);
        seq.blocks = 0;
        self.unpin(seq.pin.take());
        if !seq.admitted_before {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        if let (Some(id), Some(_)) = (&seq.job.session, &seq.cache) {
            self.sessions.set_cache(id, 0, 0);
        }
    }

    /// Removes requests whose client has gone away, freeing their blocks.
    fn drop_gone(&mut self) {
        let gone = |s: &Seq| s.job.events.is_closed();
        let (left, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| gone(s));
        self.running = kept;
        let (left_waiting, waiting): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|s| gone(s));
        self.queue = waiting;
        for mut seq in left.into_iter().chain(left_waiting) {
            self.discard(&mut seq);
        }
    }

    fn cancel_all(&mut self) {
        let all: Vec<_> = self.running.drain(..).chain(self.queue.drain(..)).collect();
        for mut seq in all {
            self.discard(&mut seq);
            seq.job.tell_all(|| Event::Cancelled);
        }
    }

    fn publish(&self) {
        let s = &self.stats;
        s.running.store(self.running.len(), Ordering::Relaxed);
        s.queued.store(self.queue.len(), Ordering::Relaxed);
        let cached = self.prefix.blocks();
        s.kv_blocks_used
            .store(self.pool.used() - cached, Ordering::Relaxed);
        s.kv_blocks_cached.store(cached, Ordering::Relaxed);
    }

    /// Moves waiting sequences into the batch, oldest first, while they fit.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some(mut seq) = self.queue.pop_front() else {
                break;
            };
            if seq.cache.is_none() {
                self.resume_session(&mut seq);
            }
            if seq.cache.is_none() && self.config.prefix_cache {
                self.reuse_prefix(&mut seq);
            }
            // The whole prompt and the first drawn token.
            let want = blocks_for(seq.tokens.len() + 1);
            if want > self.pool.total() {
                self.end_unfittable(seq, want);
                continue;
            }
            let need = want.saturating_sub(seq.held());
            while self.pool.free() < need && self.evict_idle() {}
            if !self.pool.try_take(need) {
                self.park_session(&mut seq);
                self.queue.push_front(seq);
                break;
            }
            seq.blocks += need;
            if seq.cache.is_none() {
                seq.cache = Some(self.model.new_session());
            }
            if !seq.admitted_before {
                seq.admitted_before = true;
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                let st = &self.stats;
                st.prompt_tokens
                    .fetch_add(seq.prompt_len as u64, Ordering::Relaxed);
                st.cached_prompt_tokens
                    .fetch_add(seq.cached_tokens as u64, Ordering::Relaxed);
                if self.config.prefix_cache {
                    let counter = match seq.pin {
                        Some(_) => &st.prefix_hits,
                        None => &st.prefix_misses,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.running.push(seq);
        }
    }

    /// Gives a sequence its session's cache, cut to the prefix it shares with the prompt.
    fn resume_session(&mut self, seq: &mut Seq) {
        let Some(idle) = seq.job.session.as_ref().and_then(|id| self.idle.remove(id)) else {
            return;
        };
        let Idle {
            mut cache,
            tokens,
            blocks,
            pin,
            ..
        } = idle;
        let shared = tokens
            .iter()
            .zip(&seq.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // At least the last prompt token is fed again: its logits start the reply.
        let keep = shared.min(seq.tokens.len().saturating_sub(1));
        cache.truncate(keep);
        let keep = cache.tokens().len();
        // The blocks still held: those shared with a prefix-cache entry first.
        let held = blocks_for(keep);
        let shared = pin.map_or(0, |p| p.shared.min(held));
        let kept_blocks = (held - shared).min(blocks);
        self.pool.give_back(blocks - kept_blocks);
        seq.pin = match pin {
            Some(p) if shared > 0 => Some(Pin { shared, ..p }),
            other => {
                self.unpin(other);
                None
            }
        };
        seq.cache = Some(cache);
        seq.fed = keep;
        seq.blocks = kept_blocks;
        if !seq.admitted_before {
            seq.cached_tokens = keep;
        }
    }

    /// Starts a sequence from the longest prefix of its tokens the prefix cache holds,
    /// leaving at least two tokens to feed (a prompt chunk, as [`chunk_len`] keeps them).
    fn reuse_prefix(&mut self, seq: &mut Seq) {
        self.next_order += 1;
        let usable = seq.tokens.len().saturating_sub(2);
        let Some(hit) = self.prefix.lookup(&seq.tokens, usable, self.next_order) else {
            return;
        };
        seq.fed = hit.cache.tokens().len();
        seq.cache = Some(hit.cache);
        seq.pin = Some(hit.pin);
        if !seq.admitted_before {
            seq.cached_tokens = seq.fed;
        }
    }

    /// Offers a finished sequence's cache to the prefix cache: the whole blocks of its
    /// prompt, if they are not held already and the budget has room.
    fn keep_prefix(&mut self, seq: &mut Seq, mut cache: Session) {
        let pin = seq.pin.take();
        self.pool.give_back(seq.blocks);
        seq.blocks = 0;
        let whole = seq.prompt_len.min(seq.fed) / BLOCK_TOKENS * BLOCK_TOKENS;
        cache.truncate(whole);
        let tokens = &seq.tokens[..whole];
        let add = self.prefix.blocks_to_add(tokens, pin);
        if !seq.cacheable || cache.tokens() != tokens || add == 0 || !self.pool.try_take(add) {
            self.unpin(pin);
            return;
        }
        self.next_order += 1;
        let freed = self
            .prefix
            .insert(cache, tokens.to_vec(), pin, self.next_order);
        self.pool.give_back(freed);
    }

    /// Puts back the session cache of a sequence that must wait after all, so that it stays
    /// evictable while the sequence waits.
    fn park_session(&mut self, seq: &mut Seq) {
        let (Some(id), Some(cache)) = (seq.job.session.clone(), seq.cache.take()) else {
            return;
        };
        self.next_order += 1;
        let idle = Idle {
            cache,
            tokens: seq.tokens[..seq.fed].to_vec(),
            blocks: seq.blocks,
            pin: seq.pin.take(),
            last_used: self.next_order,
        };
        self.idle.insert(id, idle);
        seq.fed = 0;
        seq.blocks = 0;
    }

    /// A sequence that needs more blocks than exist ends here.
    fn end_unfittable(&mut self, mut seq: Seq, want: usize) {
        if seq.generated.is_empty() {
            self.discard(&mut seq);
            let total = self.pool.total();
            seq.job.tell_all(|| {
                Event::Failed(format!(
                    "the prompt needs {want} KV blocks and the server has {total}"
                ))
            });
        } else {
            self.finish(seq, Finish::Length);
        }
    }

    /// Drops the least recently used of the idle session caches and the prefix-cache
    /// entries nobody uses; false if there is none.
    fn evict_idle(&mut self) -> bool {
        let session = self
            .idle
            .iter()
            .min_by_key(|(_, i)| i.last_used)
            .map(|(id, i)| (id.clone(), i.last_used));
        match (session, self.prefix.oldest()) {
            (Some((_, session)), Some(entry)) if entry < session => self.evict_prefix(),
            (None, Some(_)) => self.evict_prefix(),
            (Some((id, _)), _) => {
                if let Some(idle) = self.idle.remove(&id) {
                    self.drop_idle(idle);
                }
                self.sessions.set_cache(&id, 0, 0);
                true
            }
            (None, None) => false,
        }
    }

    fn evict_prefix(&mut self) -> bool {
        let freed = self.prefix.evict();
        self.pool.give_back(freed);
        freed > 0
    }

    /// Pauses running sequence `i`: its cache is dropped and it waits at the head of the
    /// queue, to be recomputed from its tokens.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        self.discard(&mut seq);
        seq.cache = None;
        seq.fed = 0;
        seq.next = None;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.queue.push_front(seq);
    }

    /// Finds `need` free blocks for running sequence `i`, evicting idle session caches,
    /// then pausing sequences younger than `i`. False if that is not enough.
    fn acquire(&mut self, i: usize, need: usize) -> bool {
        loop {
            if self.pool.try_take(need) {
                return true;
            }
            if self.evict_idle() {
                continue;
            }
            if self.running.len() > i + 1 {
                self.preempt(self.running.len() - 1);
                continue;
            }
            return false;
        }
    }

    /// One step: every decoding sequence draws and feeds a token; sequences reading their
    /// prompts feed chunks of them, oldest first, while the step's prompt budget lasts.
    fn step(&mut self) {
        let mut budget = self.config.prefill_chunk.max(1);
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            if seq.fed == seq.tokens.len() {
                match self.draw(i) {
                    Drawn::Continue => {}
                    Drawn::Finished(finish) => {
                        let seq = self.running.remove(i);
                        self.finish(seq, finish);
                        continue;
                    }
                    Drawn::Gone => {
                        let mut seq = self.running.remove(i);
                        self.discard(&mut seq);
                        continue;
                    }
                }
            }
            let seq = &self.running[i];
            let n = match seq.tokens.len() - seq.fed {
                1 => 1,
                // What is left of the budget would feed one prompt token alone (a decode
                // step: see `chunk_len`), unless the budget itself is one token a step.
                _ if budget == 0 || (budget == 1 && self.config.prefill_chunk > 1) => 0,
                left => chunk_len(left, budget),
            };
            let need = blocks_for(seq.fed + n).saturating_sub(seq.held());
            if need > 0 && !self.acquire(i, need) {
                if i > 0 {
                    // The youngest sequence waits for older ones to finish.
                    self.preempt(i);
                } else {
                    // Alone, it has every block there is: it cannot grow any more.
                    let mut seq = self.running.remove(i);
                    seq.tokens.truncate(seq.fed);
                    self.finish(seq, Finish::Length);
                }
                continue;
            }
            if n > 1 {
                budget = budget.saturating_sub(n);
            }
            let seq = &mut self.running[i];
            seq.blocks += need;
            seq.planned = n;
            i += 1;
        }
        if self.running.iter().all(|s| s.planned == 0) {
            return;
        }

        // The masks of the grammars whose sequences draw after this step are computed on
        // another thread while the model steps. A sequence decoding greedily with nothing
        // that needs its logits has the model pick its token (on the GPU with the mask
        // applied on the device).
        let mut items: Vec<BatchItem<'_>> = Vec::with_capacity(self.running.len());
        let mut ahead: Vec<&mut Constraint> = Vec::new();
        let mut picks = Vec::with_capacity(self.running.len());
        // Per item, its constraint's place in `ahead`.
        let mut mask_of = Vec::with_capacity(self.running.len());
        for s in self.running.iter_mut().filter(|s| s.planned > 0) {
            let draws = s.fed + s.planned == s.tokens.len();
            picks.push(draws && s.job.picks_largest_logit());
            mask_of.push(None);
            if let (true, Some(c)) = (draws, s.job.constraint.as_deref_mut()) {
                mask_of[items.len()] = Some(ahead.len());
                ahead.push(c);
            }
            items.push(BatchItem {
                session: s.cache.as_mut().expect("running sequences have a cache"),
                tokens: &s.tokens[s.fed..s.fed + s.planned],
            });
        }
        let model = &self.model;
        let results = Constraint::overlap_masks(&mut ahead, |wait| {
            let masks = || {
                let computed = wait();
                mask_of
                    .iter()
                    .map(|k: &Option<usize>| k.and_then(|k| computed.get(k).cloned().flatten()))
                    .collect()
            };
            model.step_picking(&mut items, &picks, &masks)
        });
        drop(items);

        let mut failed = Vec::new();
        let fed = self
            .running
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.planned > 0);
        for ((i, seq), result) in fed.zip(results) {
            let planned = std::mem::take(&mut seq.planned);
            match result {
                Ok(next) => {
                    seq.fed += planned;
                    if seq.fed == seq.tokens.len() {
                        seq.next = Some(next);
                    }
                }
                Err(e) => failed.push((i, e.to_string())),
            }
        }
        for (i, why) in failed.into_iter().rev() {
            let mut seq = self.running.remove(i);
            self.discard(&mut seq);
            seq.job.tell_all(|| Event::Failed(why.clone()));
        }
        let forking: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let seq = &self.running[i];
                seq.next.is_some() && !seq.job.siblings.is_empty()
            })
            .collect();
        for i in forking {
            self.start_siblings(i);
        }
    }

    /// Starts the other choices of running sequence `i`, whose prompt is now fed: each
    /// from a fork of its cache while the batch and the KV blocks have room, the others
    /// from the head of the queue, where they compute the prompt again. A fork is counted
    /// as holding every block it needs, the blocks it shares included.
    fn start_siblings(&mut self, i: usize) {
        let siblings = std::mem::take(&mut self.running[i].job.siblings);
        let mut waiting = Vec::new();
        for (k, events) in siblings.into_iter().enumerate() {
            let parent = &self.running[i];
            let job = parent.job.sibling(k + 1, events);
            let sampler = match Sampler::new(job.sampling.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            let mut seq = Seq::new(job, sampler);
            seq.admitted_before = true;
            seq.cached_tokens = parent.cached_tokens;
            seq.cacheable = parent.cacheable;
            let want = blocks_for(seq.tokens.len() + 1);
            let room = self.running.len() < self.config.max_batch;
            match parent.cache.as_ref() {
                Some(cache) if room && self.pool.try_take(want) => {
                    let fork = cache.fork();
                    seq.fed = fork.tokens().len();
                    if seq.fed == seq.tokens.len() {
                        seq.next = parent.next.clone();
                    }
                    seq.cache = Some(fork);
                    seq.blocks = want;
                    self.running.push(seq);
                }
                _ => waiting.push(seq),
            }
        }
        for seq in waiting.into_iter().rev() {
            self.queue.push_front(seq);
        }
    }

    /// Draws the next token of running sequence `i` and sends its text.
    fn draw(&mut self, i: usize) -> Drawn {
        let context_limit = self.model.info().context_limit;
        let seq = &mut self.running[i];
        let Some(next) = seq.next.take() else {
            return Drawn::Finished(Finish::Length);
        };
        let (token, logits) = match next {
            // Picked by the model, under the grammar's mask where there is one.
            Fed::Token(token) => {
                let checked = match seq.job.constraint.as_mut() {
                    Some(constraint) => {
                        let start = Instant::now();
                        let checked = constraint.check_pick(token);
                        self.stats
                            .grammar_mask
                            .observe(start.elapsed().as_secs_f64());
                        checked.map_err(|e| e.to_string())
                    }
                    None => Ok(token),
                };
                match checked {
                    Ok(token) => (token, None),
                    Err(e) => {
                        let _ = seq.job.events.send(Event::Failed(e));
                        return Drawn::Gone;
                    }
                }
            }
            Fed::Logits(mut logits) => {
                // A grammar masks a copy where log-probabilities (the model's own) are
                // reported.
                let mut masked = None;
                if let Some(constraint) = seq.job.constraint.as_mut() {
                    let mut m = match seq.job.logprobs {
                        Some(_) => logits.clone(),
                        None => std::mem::take(&mut logits),
                    };
                    match constraint.mask(&mut m) {
                        Ok(spent) => self.stats.grammar_mask.observe(spent.as_secs_f64()),
                        Err(e) => {
                            let _ = seq.job.events.send(Event::Failed(e.to_string()));
                            return Drawn::Gone;
                        }
                    }
                    masked = Some(m);
                }
                match seq
                    .sampler
                    .sample(masked.as_deref().unwrap_or(&logits), &seq.tokens)
                {
                    Ok(t) => (t, Some(logits)),
                    Err(e) => {
                        let _ = seq.job.events.send(Event::Failed(e.to_string()));
                        return Drawn::Gone;
                    }
                }
            }
        };
        let now = Instant::now();
        match seq.last_token_at {
            None => self
                .stats
                .ttft
                .observe((now - seq.job.arrived).as_secs_f64()),
            Some(t) => self.stats.inter_token.observe((now - t).as_secs_f64()),
        }
        seq.last_token_at = Some(now);
        // Sequences that report log-probabilities always read their logits back.
        let logprobs = match (seq.job.logprobs, &logits) {
            (Some(top), Some(logits)) => Some(logprobs::logprobs(logits, token, top)),
            _ => None,
        };

        if !seq.job.ignore_eos && self.text.stop_ids().contains(&token) {
            let text = seq.out.release_all();
            if !text.is_empty() {
                let sent = seq.job.events.send(Event::Token(TokenOut {
                    token,
                    text,
                    logprobs: None,
                }));
                if sent.is_err() {
                    return Drawn::Gone;
                }
            }
            return Drawn::Finished(Finish::Stop);
        }
        seq.generated.push(token);
        self.stats.completion_tokens.fetch_add(1, Ordering::Relaxed);
        let mut complete = false;
        if let Some(constraint) = seq.job.constraint.as_mut() {
            if let Err(e) = constraint.commit(token) {
                let _ = seq.job.events.send(Event::Failed(e.to_string()));
                return Drawn::Gone;
            }
            complete = constraint.finished();
        }
        let decoded = self.text.decode(&seq.generated);
        let (text, outcome) = match seq.out.update(decoded) {
            Piece::Stopped(text) => (text, Drawn::Finished(Finish::Stop)),
            Piece::Text(mut text) if complete => {
                text.push_str(&seq.out.release_all());
                (text, Drawn::Finished(Finish::Stop))
            }
            Piece::Text(mut text) => {
                let full = seq.generated.len() >= seq.job.max_tokens || seq.fed >= context_limit;
                if full {
                    text.push_str(&seq.out.release_all());
                    (text, Drawn::Finished(Finish::Length))
                } else {
                    seq.tokens.push(token);
                    (text, Drawn::Continue)
                }
            }
        };
        let sent = seq.job.events.send(Event::Token(TokenOut {
            token,
            text,
            logprobs,
        }));
        if sent.is_err() {
            return Drawn::Gone;
        }
        outcome
    }

    /// Ends a sequence with an answer. Its cache goes to its session, if it has one, before
    /// the answer is sent, so that the session's next turn finds it.
    fn finish(&mut self, mut seq: Seq, finish: Finish) {
        let cache = seq.cache.take();
        match (seq.job.session.as_ref(), cache) {
            (Some(id), Some(cache)) if self.sessions.exists(id) => {
                let shared = seq.pin.map_or(0, |p| p.shared);
                let blocks = blocks_for(seq.fed).saturating_sub(shared).min(seq.blocks);
                self.pool.give_back(seq.blocks - blocks);
                seq.tokens.truncate(seq.fed);
                self.sessions.set_cache(id, seq.fed, blocks);
                self.next_order += 1;
                let idle = Idle {
                    cache,
                    tokens: std::mem::take(&mut seq.tokens),
                    blocks,
                    pin: seq.pin.take(),
                    last_used: self.next_order,
                };
                if let Some(old) = self.idle.insert(id.clone(), idle) {
                    self.drop_idle(old);
                }
            }
            (_, Some(cache)) if self.config.prefix_cache => {
                self.keep_prefix(&mut seq, cache);
                self.discard(&mut seq);
            }
            (_, cache) => {
                seq.cache = cache;
                self.discard(&mut seq);
            }
        }
        let _ = seq.job.events.send(Event::Done(Done {
            finish,
            prompt_tokens: seq.prompt_len,
            cached_tokens: seq.cached_tokens,
            completion_tokens: seq.generated.len(),
            text: seq.out.text().to_owned(),
        }));
    }
}

#[cfg(test)]
mod tests;
