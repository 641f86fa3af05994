//! config.json: parsed and validated, then turned into a model config as loading does.

use quench_models::arch::ModelConfig;
use quench_models::HfConfig;

use super::synth::checkpoints;
use crate::Target;

pub fn target() -> Target {
    Target {
        name: "config",
        about: "config.json (HfConfig::from_json), then ModelConfig::from_hf_config and the RoPE scaling",
        seeds,
        dict: &[
            b"\"hidden_size\":",
            b"\"num_attention_heads\":",
            b"\"num_key_value_heads\":",
            b"\"head_dim\":",
            b"\"rope_scaling\":",
            b"\"eos_token_id\":[",
            b"\"architectures\":[\"",
            b"\"tie_word_embeddings\":",
            b"\"rope_type\":\"llama3\"",
        ],
        format: crate::Format::Json,
        run,
    }
}

/// The published config of Llama 3.1 8B (its RoPE scaling is what matters here).
const LLAMA31: &str = r#"{"architectures":["LlamaForCausalLM"],"attention_bias":false,"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":131072,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":false,"torch_dtype":"bfloat16","vocab_size":128256}"#;

/// A BERT encoder's config (all-MiniLM-L6-v2's numbers).
const BERT: &str = r#"{"architectures":["BertModel"],"attention_probs_dropout_prob":0.1,"hidden_act":"gelu","hidden_size":384,"intermediate_size":1536,"layer_norm_eps":1e-12,"max_position_embeddings":512,"model_type":"bert","num_attention_heads":12,"num_hidden_layers":6,"pad_token_id":0,"type_vocab_size":2,"vocab_size":30522}"#;

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = checkpoints().iter().map(|c| c.config.clone()).collect();
    seeds.push(LLAMA31.as_bytes().to_vec());
    seeds.push(BERT.as_bytes().to_vec());
    // BERT with the head size given, as some converters write it.
    seeds.push(
        BERT.replacen("\"hidden_size\"", "\"head_dim\":32,\"hidden_size\"", 1)
            .into_bytes(),
    );
    seeds
}

fn run(bytes: &[u8]) -> Result<(), String> {
    let config = HfConfig::from_json(super::text(bytes)?).map_err(|e| e.to_string())?;
    let _ = (
        config.architecture(),
        config.num_kv_heads(),
        config.head_dim(),
    );
    config.llama3_rope_scaling().map_err(|e| e.to_string())?;
    ModelConfig::from_hf_config(&config).map_err(|e| e.to_string())?;
    Ok(())
}
