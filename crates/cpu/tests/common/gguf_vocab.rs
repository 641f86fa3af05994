//! Fills quench-text's `GgufVocab` from a GGUF file's `tokenizer.ggml.*` metadata.

use quench_models::GgufFile;
use quench_text::{GgufVocab, Tokenizer};

pub fn gguf_tokenizer(file: &GgufFile) -> Tokenizer {
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    let id = |k: &str| file.get_u32(&key(k)).ok();
    let flag = |k: &str| file.get_bool(&key(k)).ok();
    let vocab = GgufVocab {
        model: file.get_str(&key("model")).unwrap().to_owned(),
        pre: file.get_str(&key("pre")).ok().map(str::to_owned),
        tokens: file.get_str_array(&key("tokens")).unwrap().to_vec(),
        scores: file.get_f32_array(&key("scores")).ok().map(<[f32]>::to_vec),
        token_types: file
            .get_i32_array(&key("token_type"))
            .ok()
            .map(<[i32]>::to_vec),
        merges: file
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
    };
    Tokenizer::from_gguf_vocab(&vocab).unwrap()
}
