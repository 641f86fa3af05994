//! What the server needs from an embedding model: one vector per text. (Text models are
//! driven through quench-engine's [`quench_engine::CausalModel`] by the scheduler.)

use quench_engine::EmbeddingModel;

/// A failure of the model itself (not of the request that asked for it).
#[derive(Debug, thiserror::Error)]
#[error("the model failed: {0}")]
pub struct BackendError(pub String);

/// One text's embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedded {
    pub vector: Vec<f32>,
    /// Tokens the model read.
    pub tokens: usize,
}

/// A model that maps each text to one embedding vector.
pub trait EmbeddingBackend: Send + Sync + 'static {
    fn dimensions(&self) -> usize;
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, BackendError>;
}

impl EmbeddingBackend for EmbeddingModel {
    fn dimensions(&self) -> usize {
        EmbeddingModel::dimensions(self)
    }

    /// Texts longer than the model reads are cut, as sentence-transformers cuts them.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, BackendError> {
        let out = EmbeddingModel::embed(self, texts).map_err(|e| BackendError(e.to_string()))?;
        Ok(out
            .into_iter()
            .map(|e| Embedded {
                vector: e.vector,
                tokens: e.tokens,
            })
            .collect())
    }
}
