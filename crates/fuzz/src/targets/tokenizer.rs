//! tokenizer.json: the whole build (model, normalizer, pre-tokenizer, added tokens, post
//! processor, decoder), then encoding and decoding with what was built.

use quench_text::Tokenizer;

use super::synth::checkpoints;
use crate::Target;

pub fn target() -> Target {
    Target {
        name: "tokenizer",
        about: "tokenizer.json (Tokenizer::from_tokenizer_json_str), then encode, decode and streamed decode",
        seeds,
        dict: &[
            b"\"type\":\"BPE\"",
            b"\"type\":\"WordPiece\"",
            b"\"type\":\"Split\"",
            b"\"type\":\"Sequence\"",
            b"\"pattern\":{\"Regex\":\"",
            b"(a*)*b",
            b"\\\\p{L}+",
            b"\"merges\":[",
            b"\"added_tokens\":[",
            b"\"special\":true",
            b"\"ids\":[",
            b"\"unk_token\":",
        ],
        format: crate::Format::Json,
        run,
    }
}

/// A BERT-shaped tokenizer.json (WordPiece, BertNormalizer, [CLS]/[SEP] template).
const WORDPIECE: &str = r###"{"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":0,"content":"[PAD]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":1,"content":"[UNK]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":2,"content":"[CLS]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":3,"content":"[SEP]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true},
"pre_tokenizer":{"type":"BertPreTokenizer"},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}}],"pair":[],"special_tokens":{"[CLS]":{"id":"[CLS]","ids":[2],"tokens":["[CLS]"]},"[SEP]":{"id":"[SEP]","ids":[3],"tokens":["[SEP]"]}}},
"decoder":{"type":"WordPiece","prefix":"##","cleanup":true},
"model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100,
"vocab":{"[PAD]":0,"[UNK]":1,"[CLS]":2,"[SEP]":3,"hello":4,"world":5,"##s":6,"!":7,",":8,"the":9,"cafe":10,"na":11,"##ive":12,"你":13,"好":14}}}"###;

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = checkpoints().iter().map(|c| c.tokenizer.clone()).collect();
    seeds.push(WORDPIECE.as_bytes().to_vec());
    // Real shapes (their first 1000 merges, by scripts/fixtures/text): Llama 3's split pattern
    // and Sequence pre-tokenizer, Qwen 2's with NFC, SmolLM's with Digits.
    for fixture in [
        include_str!("../../../text/tests/fixtures/bpe_llama3.tokenizer.json"),
        include_str!("../../../text/tests/fixtures/bpe_qwen2.tokenizer.json"),
        include_str!("../../../text/tests/fixtures/bpe_smollm.tokenizer.json"),
    ] {
        seeds.push(fixture.as_bytes().to_vec());
    }
    seeds
}

/// Texts that reach the pre-tokenizer's and normalizer's corners: specials, accents, CJK,
/// emoji, whitespace runs, digits, an invalid-looking byte token.
const TEXTS: [&str; 4] = [
    "Hello, world! <|im_start|>user\n[CLS] naïve café 你好 👋",
    "   leading   and trailing \t\n  ",
    "12345 67 x<0xFF>y don't WE'LL",
    "",
];

/// Encodes and decodes; errors are fine, panics are not.
pub(crate) fn exercise(tokenizer: &Tokenizer) {
    let n = tokenizer.vocab_size() as u32;
    for text in TEXTS {
        for special in [false, true] {
            if let Ok(ids) = tokenizer.encode(text, special) {
                let _ = tokenizer.decode(&ids, special);
            }
        }
    }
    let edges = [0, 1, n.saturating_sub(1), n, u32::MAX];
    for skip in [false, true] {
        let _ = tokenizer.decode(&edges, skip);
        let mut stream = tokenizer.decode_stream(skip);
        for id in edges {
            let _ = stream.step(id);
        }
        let _ = stream.finish();
    }
    for id in edges {
        let _ = (tokenizer.id_to_token(id), tokenizer.is_special(id));
    }
    let _ = (
        tokenizer.bos_id(),
        tokenizer.eos_id(),
        tokenizer.token_to_id("a"),
    );
}

fn run(bytes: &[u8]) -> Result<(), String> {
    let tokenizer =
        Tokenizer::from_tokenizer_json_str(super::text(bytes)?).map_err(|e| e.to_string())?;
    exercise(&tokenizer);
    Ok(())
}
