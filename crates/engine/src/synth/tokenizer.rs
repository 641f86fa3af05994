//! A small byte-level BPE tokenizer for synthetic checkpoints: the 256 byte tokens, a few
//! dozen English merges and the architecture's special tokens, in `tokenizer.json` form,
//! with a `tokenizer_config.json` carrying the chat template.

use serde_json::{json, Map, Value};

use super::shapes::SynthArch;

/// Merges over GPT-2's byte alphabet ('Ġ' is the space byte), in rank order; each result is
/// a token of the vocabulary.
const MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("Ġ", "a"),
    ("h", "e"),
    ("i", "n"),
    ("r", "e"),
    ("o", "n"),
    ("Ġt", "he"),
    ("e", "r"),
    ("Ġ", "s"),
    ("a", "t"),
    ("Ġ", "w"),
    ("Ġ", "o"),
    ("e", "n"),
    ("Ġ", "c"),
    ("i", "t"),
    ("i", "s"),
    ("a", "n"),
    ("o", "r"),
    ("e", "s"),
    ("Ġ", "b"),
    ("e", "d"),
    ("Ġ", "f"),
    ("in", "g"),
    ("Ġ", "p"),
    ("o", "u"),
    ("Ġa", "n"),
    ("a", "l"),
    ("a", "r"),
    ("Ġt", "o"),
    ("Ġ", "m"),
    ("Ġo", "f"),
    ("Ġ", "in"),
    ("Ġ", "d"),
    ("Ġ", "h"),
    ("Ġan", "d"),
];

/// ChatML, with tools as Qwen2.5's template gives them: described in the system turn,
/// calls as `<tool_call>` blocks, results in user turns inside `<tool_response>` tags.
const CHATML_TEMPLATE: &str = concat!(
    "{% if tools %}{{ '<|im_start|>system\\n' }}",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}",
    "{{ '# Tools\\n\\nYou may call one or more functions. Their signatures are inside <tools></tools>:\\n<tools>' }}",
    "{% for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}",
    "{{ '\\n</tools>\\n\\nFor each call, write a JSON object with the function name and arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}",
    "{% endif %}",
    "{% for message in messages %}",
    "{% if tools and loop.first and message['role'] == 'system' %}",
    "{% elif message['role'] == 'assistant' and message['tool_calls'] is defined %}",
    "{{ '<|im_start|>assistant\\n' + message['content'] }}",
    "{% for call in message['tool_calls'] %}{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}",
    "{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + call['function']['arguments'] | tojson + '}\\n</tool_call>' }}",
    "{% endfor %}{{ '<|im_end|>\\n' }}",
    "{% elif message['role'] == 'tool' %}",
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}",
    "{% else %}",
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
    "{% endif %}{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
);

/// Llama 3's header format, with tools as Llama 3.1's template gives them: listed in the
/// system turn, a call as the whole reply `{"name": ..., "parameters": ...}`, results in
/// `ipython` turns.
const LLAMA3_TEMPLATE: &str = concat!(
    "{{ bos_token }}",
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim + '\\n\\n' }}{% endif %}",
    "{{ 'You have access to the functions below. To call one, reply with only a JSON object of the form {\"name\": function name, \"parameters\": dictionary of argument name and its value}.\\n\\n' }}",
    "{% for tool in tools %}{{ tool | tojson(indent=4) + '\\n\\n' }}{% endfor %}{{ '<|eot_id|>' }}",
    "{% endif %}",
    "{% for message in messages %}",
    "{% if tools and loop.first and message['role'] == 'system' %}",
    "{% elif message['role'] == 'assistant' and message['tool_calls'] is defined %}",
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
    "{% for call in message['tool_calls'] %}",
    "{{ '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' + call['function']['arguments'] | tojson + '}' }}",
    "{% endfor %}{{ '<|eot_id|>' }}",
    "{% elif message['role'] == 'tool' %}",
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}",
    "{% else %}",
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}",
    "{% endif %}{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
);

/// The tokenizer files of a synthetic checkpoint.
pub(crate) struct SynthTokenizer {
    pub(crate) tokenizer_json: Value,
    pub(crate) tokenizer_config: Value,
    pub(crate) bos_id: u32,
    pub(crate) eos_id: u32,
    /// Tokens in the vocabulary (ids 0 to len - 1).
    pub(crate) len: usize,
}

/// GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
/// the others for the characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut chars = ['\0'; 256];
    let mut next = 0x100;
    for b in 0..256u32 {
        chars[b as usize] = if printable(b) {
            char::from_u32(b).expect("a Latin-1 code point")
        } else {
            next += 1;
            char::from_u32(next - 1).expect("a code point below U+0200")
        };
    }
    chars
}

pub(crate) fn tokenizer(arch: SynthArch, max_positions: usize) -> SynthTokenizer {
    let mut vocab = Map::new();
    for (b, c) in byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    for (left, right) in MERGES {
        let id = vocab.len();
        vocab.insert(format!("{left}{right}"), json!(id));
    }
    let specials: &[&str] = match arch {
        SynthArch::Llama => &[
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        SynthArch::Qwen2 | SynthArch::Qwen3 => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    };
    let first_special = vocab.len();
    let id_of = |token: &str| {
        first_special
            + specials
                .iter()
                .position(|s| *s == token)
                .expect("a listed special")
    };
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "id": first_special + i, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let (bos, eos, template) = match arch {
        SynthArch::Llama => ("<|begin_of_text|>", "<|eot_id|>", LLAMA3_TEMPLATE),
        SynthArch::Qwen2 | SynthArch::Qwen3 => ("<|endoftext|>", "<|im_end|>", CHATML_TEMPLATE),
    };
    let post_processor = match arch {
        // Llama 3 puts <|begin_of_text|> before every text it tokenizes.
        SynthArch::Llama => json!({
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}}
            ],
            "special_tokens": {bos: {"id": bos, "ids": [id_of(bos)], "tokens": [bos]}}
        }),
        SynthArch::Qwen2 | SynthArch::Qwen3 => json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
            "use_regex": false
        }),
    };
    let merges: Vec<Value> = MERGES
        .iter()
        .map(|(l, r)| json!(format!("{l} {r}")))
        .collect();
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
            "use_regex": true
        },
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true
        },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    });
    let added_decoder: Map<String, Value> = specials
        .iter()
        .map(|s| {
            (
                id_of(s).to_string(),
                json!({"content": s, "lstrip": false, "normalized": false, "rstrip": false,
                       "single_word": false, "special": true}),
            )
        })
        .collect();
    let tokenizer_config = json!({
        "add_bos_token": arch == SynthArch::Llama,
        "add_eos_token": false,
        "added_tokens_decoder": added_decoder,
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_positions,
        "tokenizer_class": "PreTrainedTokenizerFast"
    });
    SynthTokenizer {
        tokenizer_json,
        tokenizer_config,
        bos_id: id_of(bos) as u32,
        eos_id: id_of(eos) as u32,
        len: first_special + specials.len(),
    }
}
