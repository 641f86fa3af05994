//! `quench serve`: the OpenAI-compatible HTTP server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use quench_serve::scheduler::EngineConfig;
use quench_serve::{ModelSpec, ServeConfig, Server};

use crate::model_args::{CodegenArg, DeviceArg, KvCacheArg, RuntimeArg};

#[derive(Args)]
pub struct ServeArgs {
    /// A model that generates text: a pulled model's name (smollm2), a GGUF file, a Hugging
    /// Face directory, or synthetic:tiny-chat; NAME=MODEL serves it under NAME. Repeat to
    /// serve several.
    #[arg(long = "model", short = 'm', value_name = "MODEL")]
    models: Vec<String>,
    /// A model that embeds text (minilm, a BERT sentence embedder's directory, or
    /// synthetic:tiny-embed); NAME=MODEL serves it under NAME. Repeatable.
    #[arg(long = "embedding-model", value_name = "MODEL")]
    embedding_models: Vec<String>,
    /// Where the text-generating models run (embedding models run on the CPU). On a GPU
    /// the KV cache for `--kv-blocks` is allocated when the model loads.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// With --device cuda: which GPU (as `quench devices` numbers them).
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: u32,
    /// The model cache that pulled names are looked up in (see `quench pull`).
    #[arg(long)]
    cache: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the `listening` log line names it.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// KV cache budget per model, in blocks of 16 positions.
    #[arg(long, default_value_t = 4096)]
    kv_blocks: usize,
    /// Most requests waiting per model; beyond it requests get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Most prompt tokens fed in one step, shared by the requests reading prompts (oldest
    /// first); the streams already decoding draw a token every step regardless.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// On a GPU, where the kernels' machine code comes from.
    #[arg(long, value_enum, default_value = "ptx")]
    codegen: CodegenArg,
    /// On a GPU, which runtime drives it.
    #[arg(long, value_enum, default_value = "cuda")]
    backend: RuntimeArg,
    /// Split each model across N GPUs (from --gpu on), each holding a share of every
    /// layer (its heads, FFN width and vocabulary must divide by N); the ranks' rows meet
    /// in host memory twice a layer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    tensor_parallel: Option<u32>,
    /// Do not keep finished prompts' KV blocks for later requests that start the same way
    /// (the prefix cache; it only ever uses blocks no request needs).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Most positions per sequence (default: the model's context length).
    #[arg(long)]
    context: Option<usize>,
    /// Most sessions kept; beyond it a key's new session forgets the key's own least
    /// recently used one, and one that cannot (no key, nothing of its own) gets 429.
    #[arg(long, default_value_t = 256)]
    max_sessions: usize,
    /// Most sessions one API key holds (without keys, one client address); beyond it the
    /// key's own least recently used session is forgotten, never another client's (without
    /// keys the new session gets 429: one address may be several clients).
    #[arg(long, value_name = "N", default_value_t = 64)]
    sessions_per_client: usize,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, default_value_t = 1 << 20)]
    body_limit: usize,
    /// Seconds a client has to send its request headers.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client has to send its request body (408 beyond).
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Seconds requests in flight get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30.0)]
    shutdown_grace: f64,
    /// Most client connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most connections one client address holds open; a further one is answered 429 and
    /// closed.
    #[arg(long, value_name = "N", default_value_t = 256)]
    connections_per_address: usize,
    /// A host name the server answers to (the `Host` header), besides IP addresses,
    /// localhost and --host; repeatable; `*` answers any. Requests for other names are
    /// refused (403), which stops DNS-rebinding pages.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// An origin (https://app.example.com) whose web pages may call the API; repeatable;
    /// `*` allows every page. Without it only the server's own chat page may.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// On a GPU, multiply bf16 weights with the matrix–vector kernels (8 requests a pass
    /// over the weights) instead of the tensor cores (up to 64 a pass).
    #[arg(long)]
    no_tensor_core_decode: bool,
    /// A key clients must send (`Authorization: Bearer KEY`) on every route but /health
    /// and the chat page; repeat for several. Also read from $QUENCH_API_KEY and from
    /// --api-key-file. Without any, anyone who can reach the address may call.
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A file of API keys, one a line (blank lines and lines starting with # skipped).
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<std::path::PathBuf>,
    /// On a GPU, the element type of the KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    kv_cache: KvCacheArg,
}

fn seconds(name: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|_| format!("--{name} {s} is not a number of seconds"))
}

/// The keys from --api-key, $QUENCH_API_KEY and --api-key-file, in that order.
fn api_keys(a: &ServeArgs) -> Result<Vec<String>, String> {
    let mut keys = a.api_keys.clone();
    if let Ok(k) = std::env::var("QUENCH_API_KEY") {
        keys.push(k.trim().to_owned());
    }
    if let Some(path) = &a.api_key_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--api-key-file {}: {e}", path.display()))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(keys)
}

/// A model as given on the command line: `[NAME=]MODEL`, where MODEL is a pulled model's
/// name (served under that name), a path, or a built-in synthetic model.
fn model_spec(given: &str, cache: Option<&Path>) -> Result<ModelSpec, String> {
    let (name, model) = match given.split_once('=') {
        Some((name, model)) if !name.is_empty() && !name.contains('/') => (Some(name), model),
        _ => (None, given),
    };
    if model.starts_with("synthetic:") {
        return given.parse();
    }
    let path = crate::cmd_pull::resolve(Some(model), model, cache)?;
    let pulled = !Path::new(model).exists();
    let name = name.or(pulled.then_some(model));
    let spec = match name {
        Some(name) => format!("{name}={}", path.display()),
        None => path.display().to_string(),
    };
    spec.parse()
}

pub fn run(a: &ServeArgs) -> Result<(), String> {
    let specs = |given: &[String]| -> Result<Vec<ModelSpec>, String> {
        given
            .iter()
            .map(|g| model_spec(g, a.cache.as_deref()))
            .collect()
    };
    let config = ServeConfig {
        models: specs(&a.models)?,
        embedding_models: specs(&a.embedding_models)?,
        host: a.host.clone(),
        port: a.port,
        engine: EngineConfig {
            max_batch: a.max_batch,
            kv_blocks: a.kv_blocks,
            queue: a.queue,
            prefill_chunk: a.prefill_chunk,
            prefix_cache: !a.no_prefix_cache,
        },
        device: match a.device {
            DeviceArg::Cpu => quench_engine::Device::Cpu,
            DeviceArg::Cuda => quench_engine::Device::Cuda,
        },
        gpu: a.gpu,
        context: a.context,
        max_sessions: a.max_sessions,
        sessions_per_client: a.sessions_per_client,
        body_limit: a.body_limit,
        header_timeout: seconds("header-timeout", a.header_timeout)?,
        body_timeout: seconds("body-timeout", a.body_timeout)?,
        shutdown_grace: seconds("shutdown-grace", a.shutdown_grace)?,
        max_connections: a.max_connections,
        connections_per_address: a.connections_per_address,
        allowed_hosts: a.allowed_hosts.clone(),
        cors_origins: a.cors_origins.clone(),
        tensor_core_decode: !a.no_tensor_core_decode,
        kv_cache: a.kv_cache.into(),
        codegen: a.codegen.into(),
        runtime: a.backend.into(),
        tensor_parallel: a.tensor_parallel.map(|n| n as usize),
        api_keys: api_keys(a)?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let served = runtime.block_on(async {
        let server = Server::start(config).await.map_err(|e| e.to_string())?;
        server.run(shutdown_signal()).await;
        Ok(())
    });
    // The last pieces of work cancelled at the deadline are not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// Completes at the first SIGTERM or Ctrl-C; a second one ends the process at once.
async fn shutdown_signal() {
    signal().await;
    tokio::spawn(async {
        signal().await;
        quench_serve::log::line(
            "warn",
            "a second signal: stopping at once, requests in flight cut off",
            serde_json::json!({}),
        );
        std::process::exit(130);
    });
}

/// Completes at SIGTERM or Ctrl-C.
async fn signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
