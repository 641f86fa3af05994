//! The tokenizer a GGUF file stores: its `tokenizer.ggml.*` metadata, read into
//! quench-text's [`GgufVocab`] (which builds the tokenizer from it).

use quench_text::GgufVocab;

use super::GgufFile;
use crate::error::ModelError;

impl GgufFile {
    /// The `tokenizer.ggml.*` metadata: the model and tokens are required, the rest
    /// optional.
    pub fn tokenizer_vocab(&self) -> Result<GgufVocab, ModelError> {
        let key = |k: &str| format!("tokenizer.ggml.{k}");
        let id = |k: &str| self.get_u32(&key(k)).ok();
        let flag = |k: &str| self.get_bool(&key(k)).ok();
        Ok(GgufVocab {
            model: self.get_str(&key("model"))?.to_owned(),
            pre: self.get_str(&key("pre")).ok().map(str::to_owned),
            tokens: self.get_str_array(&key("tokens"))?.to_vec(),
            scores: self.get_f32_array(&key("scores")).ok().map(<[f32]>::to_vec),
            token_types: self
                .get_i32_array(&key("token_type"))
                .ok()
                .map(<[i32]>::to_vec),
            merges: self
                .get_str_array(&key("merges"))
                .ok()
                .map(<[String]>::to_vec),
            bos_id: id("bos_token_id"),
            eos_id: id("eos_token_id"),
            unk_id: id("unknown_token_id"),
            pad_id: id("padding_token_id"),
            sep_id: id("seperator_token_id"),
            cls_id: id("cls_token_id"),
            add_bos: flag("add_bos_token"),
            add_eos: flag("add_eos_token"),
            add_space_prefix: flag("add_space_prefix"),
        })
    }
}
