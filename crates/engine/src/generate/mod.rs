//! Generation, the same on every backend: sampling, the loop, stop strings and streamed
//! text.

pub mod constrain;
mod run;
mod sampling;
mod text_stream;

pub use constrain::{ConstrainError, Constraint, Grammars, MaskCost, OutputFormat};
pub use run::{
    generate, generate_constrained, CausalLm, Continuation, Drawn, FinishReason, GenerateOptions,
};
pub use sampling::{
    apply_repetition_penalty, argmax, min_p_filter, top_k_filter, top_p_filter, Candidate, Sampler,
    SamplingParams,
};
pub use text_stream::{Piece, TextStream};
