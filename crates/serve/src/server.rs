//! Starting and stopping the server: load the models, listen, serve connections with read
//! timeouts, and shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;

use crate::api::{router, AppState, BodyLimits, ClientAddr, OriginPolicy, ServedModel};
use crate::connections::{self, PerAddress};
use crate::keys::ApiKeys;
use crate::log::{self, RequestIds};
use crate::metrics::Metrics;
use crate::scheduler::{EngineConfig, EngineHandle};
use crate::sessions::SessionStore;
use crate::text::TextSide;
use quench_engine::synth::{tiny_chat_model, tiny_embedding_model};
use quench_engine::CausalModel;

/// Where a model comes from: `PATH` (a GGUF file or a Hugging Face directory),
/// `NAME=PATH` to serve it under NAME, or one of the built-in synthetic models
/// `synthetic:tiny-chat` and `synthetic:tiny-embed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The name clients use in `model`.
    pub name: String,
    pub source: ModelSource,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    Path(PathBuf),
    TinyChat,
    TinyEmbed,
}

impl std::str::FromStr for ModelSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, source) = match s.split_once('=') {
            Some((name, source)) if !name.is_empty() && !name.contains('/') => {
                (Some(name.to_owned()), source)
            }
            _ => (None, s),
        };
        let source = match source {
            "synthetic:tiny-chat" => ModelSource::TinyChat,
            "synthetic:tiny-embed" => ModelSource::TinyEmbed,
            other if other.starts_with("synthetic:") => {
                return Err(format!(
                    "{other}: unknown synthetic model (there are synthetic:tiny-chat and \
                     synthetic:tiny-embed)"
                ))
            }
            "" => return Err("empty model path".into()),
            path => ModelSource::Path(PathBuf::from(path)),
        };
        let name = name.unwrap_or_else(|| match &source {
            ModelSource::TinyChat => "tiny-chat".into(),
            ModelSource::TinyEmbed => "tiny-embed".into(),
            ModelSource::Path(p) => {
                let p = p.as_path();
                let stem = if p.is_dir() {
                    p.file_name()
                } else {
                    p.file_stem()
                };
                stem.map_or_else(
                    || p.display().to_string(),
                    |s| s.to_string_lossy().into_owned(),
                )
            }
        });
        Ok(ModelSpec { name, source })
    }
}

/// Everything `quench serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Models that generate text.
    pub models: Vec<ModelSpec>,
    /// Models that embed text.
    pub embedding_models: Vec<ModelSpec>,
    pub host: String,
    /// 0 picks a free port (the log line `listening` says which).
    pub port: u16,
    pub engine: EngineConfig,
    /// Where the text-generating models run (embedding models run on the CPU).
    pub device: quench_engine::Device,
    /// With a GPU device: which one (the driver's ordinal).
    pub gpu: u32,
    /// Most positions one sequence may hold (capped at the model's own context).
    pub context: Option<usize>,
    pub max_sessions: usize,
    /// Most sessions one API key holds (without keys, one client address); beyond it the
    /// key's own least recently used session is forgotten.
    pub sessions_per_client: usize,
    pub body_limit: usize,
    /// Time a client has to send a request's headers.
    pub header_timeout: Duration,
    /// Time a client has to send a request's body.
    pub body_timeout: Duration,
    /// At shutdown, how long requests in flight may take to finish before they are cancelled.
    pub shutdown_grace: Duration,
    /// Most connections open at once; further clients wait to be accepted.
    pub max_connections: usize,
    /// Most connections one client address holds open; a further one is answered 429 and
    /// closed.
    pub connections_per_address: usize,
    /// Host names answered besides IP addresses, `localhost` and the bound name (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// Origins whose web pages may call the API (CORS); none: only the server's own pages.
    pub cors_origins: Vec<String>,
    /// On a GPU, multiply bf16 weights on the tensor cores at every decode step (the
    /// weights read once for up to 64 requests' rows); off, the matrix–vector kernels,
    /// 8 rows a pass. Other weight formats take the matrix–vector kernels either way.
    pub tensor_core_decode: bool,
    /// On a GPU, the element type of the KV cache.
    pub kv_cache: quench_engine::KvCache,
    /// On a GPU, where the kernels' machine code comes from.
    pub codegen: quench_engine::Codegen,
    /// On a GPU, which runtime drives it.
    pub runtime: quench_engine::Runtime,
    /// On GPUs: split each model across this many, from `gpu` on
    /// ([`quench_engine::gpu::TensorParallel`]); `None`: one GPU.
    pub tensor_parallel: Option<usize>,
    /// Keys a client must present (`Authorization: Bearer KEY`); none: anyone may call.
    pub api_keys: Vec<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            models: Vec::new(),
            embedding_models: Vec::new(),
            host: "127.0.0.1".into(),
            port: 8080,
            engine: EngineConfig::default(),
            device: quench_engine::Device::Cpu,
            gpu: 0,
            context: None,
            max_sessions: 256,
            sessions_per_client: 64,
            api_keys: Vec::new(),
            body_limit: 1 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            max_connections: 1024,
            connections_per_address: 256,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            tensor_core_decode: true,
            kv_cache: quench_engine::KvCache::F16,
            codegen: quench_engine::Codegen::Ptx,
            runtime: quench_engine::Runtime::Cuda,
            tensor_parallel: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load model {name:?}: {reason}")]
    Load { name: String, reason: String },
    #[error("{0}")]
    Config(String),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
}

/// A server that is listening and has its models loaded.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
    config: ServeConfig,
}

impl Server {
    /// Binds the address first (so that a busy port is reported before a long load), then
    /// loads every model and starts their engine threads.
    pub async fn start(config: ServeConfig) -> Result<Server, ServeError> {
        if config.models.is_empty() && config.embedding_models.is_empty() {
            return Err(ServeError::Config("no model to serve: pass --model".into()));
        }
        let mut names: Vec<&str> = config
            .models
            .iter()
            .chain(&config.embedding_models)
            .map(|m| m.name.as_str())
            .collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ServeError::Config(format!(
                "two models are named {:?}; name them apart with NAME=PATH",
                w[0]
            )));
        }
        if config.engine.kv_blocks == 0 || config.engine.max_batch == 0 {
            return Err(ServeError::Config(
                "--kv-blocks and --max-batch must be at least 1".into(),
            ));
        }
        let keys = ApiKeys::new(&config.api_keys).map_err(ServeError::Config)?;
        let origins = OriginPolicy::new(
            &config.allowed_hosts,
            &config.cors_origins,
            &config.host,
            machine_name().as_deref(),
        )
        .map_err(ServeError::Config)?;
        let addr = format!("{}:{}", config.host, config.port);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;

        let sessions = SessionStore::new(config.max_sessions, config.sessions_per_client);
        let mut models = Vec::new();
        for spec in &config.models {
            let started = Instant::now();
            let loaded = load_causal(spec, &config, &sessions).await?;
            log::line(
                "info",
                "model loaded",
                json!({"model": spec.name, "kind": "chat", "device": format!("{:?}", config.device).to_lowercase(),
                       "context": loaded.engine().map(|e| e.context_limit()),
                       "ms": started.elapsed().as_millis() as u64}),
            );
            models.push(Arc::new(loaded));
        }
        for spec in &config.embedding_models {
            let started = Instant::now();
            models.push(Arc::new(load_embedding(spec, &config).await?));
            log::line(
                "info",
                "model loaded",
                json!({"model": spec.name, "kind": "embedding", "ms": started.elapsed().as_millis() as u64}),
            );
        }
        let state = Arc::new(AppState {
            models,
            sessions,
            metrics: Arc::new(Metrics::default()),
            limits: BodyLimits {
                max_bytes: config.body_limit,
                timeout: config.body_timeout,
            },
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            request_ids: RequestIds::default(),
            keys,
            origins,
        });
        Ok(Server {
            listener,
            state,
            config,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes; then stops accepting, lets requests in flight
    /// finish within the grace period (cancelling the rest) and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listener,
            state,
            config,
        } = self;
        let app = router(state.clone());
        let graceful = GracefulShutdown::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(config.header_timeout);
        if let Ok(addr) = listener.local_addr() {
            log::line(
                "info",
                "listening",
                json!({"address": addr.to_string(), "port": addr.port()}),
            );
            if !addr.ip().is_loopback() && state.keys.is_empty() {
                log::line(
                    "warn",
                    "listening beyond this machine without an API key: anyone who can reach \
                     the address can use the models (pass --api-key)",
                    json!({"address": addr.to_string()}),
                );
            }
        }
        tokio::pin!(shutdown);
        let connections = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
        let per_address = PerAddress::new(config.connections_per_address);
        loop {
            // At the connection limit, wait for one to close before accepting another.
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = &mut shutdown => break,
            };
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors and the like: wait a little.
                            log::line("error", "accept failed", json!({"error": e.to_string()}));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Some(place) = per_address.enter(peer.ip()) else {
                        tokio::spawn(refuse(stream, per_address.limit()));
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let app = tower::Layer::layer(&axum::Extension(ClientAddr(peer.ip())), app.clone());
                    let service = TowerToHyperService::new(app);
                    let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                    tokio::spawn(async move {
                        let _ = conn.await;
                        drop((permit, place));
                    });
                }
                _ = &mut shutdown => break,
            }
        }
        drop(listener);
        state.draining.store(true, Ordering::Release);
        log::line(
            "info",
            "shutting down",
            json!({"grace_ms": config.shutdown_grace.as_millis() as u64}),
        );
        let deadline = Instant::now() + config.shutdown_grace;
        // The engines finish what runs by the deadline and cancel what is left then.
        let engines = state.clone();
        let engines = tokio::task::spawn_blocking(move || {
            for m in &engines.models {
                if let Some(engine) = m.engine() {
                    engine.shutdown(deadline);
                }
            }
        });
        // Until every request in flight is answered or the deadline passes, connections stay
        // open: a request on a kept-alive one is answered 503 (and its connection closed).
        while state.metrics.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Embeddings still in flight stop at their next piece.
        state.stopping.store(true, Ordering::Release);
        let _ = engines.await;
        // Idle connections close now, busy ones after their response; streams cancelled at
        // the deadline end at once, so leave a moment for their last bytes.
        let _ = tokio::time::timeout(Duration::from_secs(2), graceful.shutdown()).await;
        log::line("info", "stopped", json!({}));
    }
}

/// Answers a connection past its address's limit with 429 and closes it: the answer, then
/// the end of the stream, then whatever the client still sends is read (for at most a
/// second) so that closing does not reset the connection before the client has read it.
async fn refuse(mut stream: tokio::net::TcpStream, limit: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer = connections::refusal(limit);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    })
    .await;
}

/// This machine's host name, which a server bound to every interface answers to.
fn machine_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

async fn load_causal(
    spec: &ModelSpec,
    config: &ServeConfig,
    sessions: &Arc<SessionStore>,
) -> Result<ServedModel, ServeError> {
    let fail = |reason: String| ServeError::Load {
        name: spec.name.clone(),
        reason,
    };
    let (spec2, context, device) = (spec.clone(), config.context, config.device);
    let (tensor_core_decode, kv_cache, codegen, runtime, gpu, tensor_parallel) = (
        config.tensor_core_decode,
        config.kv_cache,
        config.codegen,
        config.runtime,
        config.gpu,
        config.tensor_parallel,
    );
    let max_batch = config.engine.max_batch;
    // On a GPU the KV cache is allocated up front: as many whole contexts as the block
    // budget holds, rounded up so that the device has every block the scheduler counts.
    let gpu_sessions = (config.engine.kv_blocks * crate::scheduler::blocks::BLOCK_TOKENS).div_ceil(
        context
            .unwrap_or(quench_engine::gpu::DEFAULT_CONTEXT)
            .max(1),
    );
    let loaded = tokio::task::spawn_blocking(move || -> Result<Arc<CausalModel>, String> {
        match &spec2.source {
            ModelSource::TinyChat if device != quench_engine::Device::Cpu => {
                Err("synthetic:tiny-chat runs on the CPU only; leave out --device".into())
            }
            ModelSource::TinyChat => Ok(Arc::new(tiny_chat_model(1).map_err(|e| e.to_string())?)),
            ModelSource::TinyEmbed => {
                Err("synthetic:tiny-embed makes embeddings; pass it with --embedding-model".into())
            }
            ModelSource::Path(path) => {
                let options = quench_engine::LoadOptions {
                    device,
                    gpu,
                    context_limit: context,
                    sessions: Some(gpu_sessions.max(1)),
                    max_batch: Some(max_batch),
                    tensor_core_decode,
                    kv_cache,
                    codegen,
                    runtime,
                    tensor_parallel,
                    ..Default::default()
                };
                let model = quench_engine::load(path, &options).map_err(|e| e.to_string())?;
                match model {
                    quench_engine::Model::Causal(m) => Ok(Arc::new(m)),
                    quench_engine::Model::Embedding(_) => Err(format!(
                        "{} makes embeddings; pass it with --embedding-model",
                        path.display()
                    )),
                }
            }
        }
    })
    .await
    .map_err(|e| fail(e.to_string()))?
    .map_err(fail)?;
    if !loaded.info().widened.is_empty() {
        // A type without a GPU kernel runs expanded to f16: slower than its size says.
        log::line(
            "warn",
            "tensors expanded to f16",
            json!({"model": spec.name, "stored_types": quench_engine::gpu::Widened::counts(&loaded.info().widened)}),
        );
    }
    let engine_config = config.engine.clone();
    let text: Arc<dyn TextSide> = loaded.clone();
    let engine = EngineHandle::start(
        &spec.name,
        loaded,
        text.clone(),
        engine_config,
        sessions.clone(),
    )
    .map_err(ServeError::Thread)?;
    Ok(ServedModel::causal(spec.name.clone(), engine, text))
}

async fn load_embedding(spec: &ModelSpec, config: &ServeConfig) -> Result<ServedModel, ServeError> {
    let fail = |reason: String| ServeError::Load {
        name: spec.name.clone(),
        reason,
    };
    let (spec2, context) = (spec.clone(), config.context);
    let model = tokio::task::spawn_blocking(
        move || -> Result<Arc<dyn crate::backend::EmbeddingBackend>, String> {
            match &spec2.source {
                ModelSource::TinyEmbed => Ok(Arc::new(
                    tiny_embedding_model(1).map_err(|e| e.to_string())?,
                )),
                ModelSource::TinyChat => {
                    Err("synthetic:tiny-chat generates text; pass it with --model".into())
                }
                ModelSource::Path(path) => {
                    let options = quench_engine::LoadOptions {
                        context_limit: context,
                        ..Default::default()
                    };
                    match quench_engine::load(path, &options).map_err(|e| e.to_string())? {
                        quench_engine::Model::Embedding(m) => Ok(Arc::new(m)),
                        quench_engine::Model::Causal(_) => Err(format!(
                            "{} generates text; pass it with --model",
                            path.display()
                        )),
                    }
                }
            }
        },
    )
    .await
    .map_err(|e| fail(e.to_string()))?
    .map_err(fail)?;
    Ok(ServedModel::embedding(spec.name.clone(), model))
}
