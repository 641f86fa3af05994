//! quench-serve: an OpenAI-compatible HTTP server for quench models.
//!
//! - [`backend`]: what the server needs from a model ([`backend::CausalBackend`],
//!   [`backend::EmbeddingBackend`]), implemented for quench-cpu's decoder and encoder.
//! - [`engine`]: one thread per causal model running continuous batching over a KV block
//!   budget, with chunked prefill, preemption and session caches.
//! - [`sessions`]: conversations the server remembers between requests.
//! - [`synthetic`]: tiny random models for trying the server and testing it.
//! - [`server`]: [`Server::start`] loads the models and listens; [`Server::run`] serves
//!   until asked to stop, then shuts down gracefully.

mod api;
pub mod backend;
pub mod engine;
pub mod loaded;
pub mod log;
pub mod metrics;
pub mod server;
pub mod sessions;
pub mod synthetic;
pub mod text;

pub use server::{ModelSource, ModelSpec, ServeConfig, ServeError, Server};
