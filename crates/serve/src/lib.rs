//! quench-serve: an OpenAI-compatible HTTP server for quench models.
//!
//! - [`scheduler`]: one thread per causal model driving quench-engine's
//!   [`quench_engine::CausalModel`] on any device: continuous batching over a KV block
//!   budget, with chunked prefill, preemption and session caches.
//! - [`backend`]: what the server needs from an embedding model.
//! - [`text`]: a causal model's text side (tokenizer, chat template, stop tokens).
//! - [`sessions`]: conversations the server remembers between requests.
//! - [`keys`]: API keys; who a request comes from.
//! - [`server`]: [`Server::start`] loads the models and listens; [`Server::run`] serves
//!   until asked to stop, then shuts down gracefully.

mod api;
pub mod backend;
mod connections;
pub mod keys;
pub mod log;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod sessions;
pub mod text;

pub use api::{check_request, Endpoint};
pub use server::{ModelSource, ModelSpec, ServeConfig, ServeError, Server};
