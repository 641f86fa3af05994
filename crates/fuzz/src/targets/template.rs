//! Chat templates: compiling and rendering an untrusted template, which must end in bounded
//! time and memory whatever it says (the limits are quench-text's: fuel, output size,
//! memory, wall-clock time; here [`FUZZ_LIMITS`]).

use std::time::Duration;

use quench_text::{ChatTemplate, Message, RenderLimits};

use super::synth::checkpoints;
use crate::Target;

pub fn target() -> Target {
    Target {
        name: "template",
        about: "chat templates (ChatTemplate::new, render, render_serialize with tools) over a fixed conversation",
        seeds,
        dict: &[
            b"{%",
            b"%}",
            b"{{",
            b"}}",
            b"{% for x in range(100000) %}",
            b"{% endfor %}",
            b"{% set ns = namespace(s='ab') %}",
            b"{% set ns.s = ns.s ~ ns.s %}",
            b"{% macro m(s) %}{{ m(s ~ s) }}{% endmacro %}",
            b"{{ m('x') }}",
            b"{% if ",
            b"{% endif %}",
            b"|tojson(indent=99999999)",
            b"|join(', ')",
            b"|replace('a', 'aaaa')",
            b"* 99999999",
            b" ~ ",
            b"loop.index",
            b"messages[0]['content']",
            b"raise_exception('x')",
            b"strftime_now('%Y')",
            b".split()",
            b".strip()",
            b"|length",
            b"recursive",
            b"loop(",
        ],
        format: crate::Format::Text,
        run,
    }
}

/// ChatML (the qwen family's and smollm's shape).
pub(crate) const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Templates that loop, recurse and call macros, the constructs whose cost grows.
const LOOPS: [&str; 3] = [
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% for c in m.content %}{% set ns.n = ns.n + 1 %}{% endfor %}{% set ns.s = ns.s ~ m.role %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% macro show(xs, d) %}{% for x in xs %}[{{ d }}{{ x }}]{% endfor %}{% endmacro %}{% for m in messages %}{{ show(m.content.split(), loop.index) }}{% endfor %}",
    "{{ messages|map(attribute='content')|join('|')|tojson(indent=2) }}{{ (messages|length) * 'ab' }}{{ tools|tojson }}",
];

fn seeds() -> Vec<Vec<u8>> {
    let fixtures: serde_json::Value = serde_json::from_str(include_str!(
        "../../../text/tests/fixtures/chat_templates.json"
    ))
    .expect("the chat template fixtures are JSON");
    let mut sources: Vec<String> = fixtures
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|case| case["template"].as_str().map(str::to_owned))
        .collect();
    for c in checkpoints() {
        let config: serde_json::Value =
            serde_json::from_slice(&c.tokenizer_config).expect("synth writes JSON");
        if let Some(t) = config["chat_template"].as_str() {
            sources.push(t.to_owned());
        }
    }
    sources.push(CHATML.to_owned());
    sources.extend(LOOPS.iter().map(|s| (*s).to_owned()));
    sources.sort();
    sources.dedup();
    sources.into_iter().map(String::into_bytes).collect()
}

fn messages() -> Vec<Message> {
    vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Hi! naïve café 你好 👋"),
        Message::new("assistant", "  Hello.  "),
        Message::new("user", "What's 2+2?\nAnswer briefly."),
    ]
}

/// The fuzzer's render limits: far tighter than the defaults, since a template that is
/// stopped without unwinding (past twice its memory budget, or its deadline) leaves its
/// thread and what it held behind for good, and a fuzz run meets many such templates
/// where a server meets one per model. Real templates over this conversation need a few
/// kilobytes and microseconds.
pub const FUZZ_LIMITS: RenderLimits = RenderLimits {
    fuel: 1_000_000,
    output_bytes: 1 << 20,
    memory_bytes: 2 << 20,
    time: Duration::from_millis(500),
};

/// Compiles `source` and renders it with and without a generation prompt, and with tools.
pub(crate) fn render_all(source: &str) -> Result<(), String> {
    let template = ChatTemplate::new(source, "<s>", "</s>")
        .map_err(|e| e.to_string())?
        .with_limits(FUZZ_LIMITS);
    let messages = messages();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let mut outcome = Ok(());
    for prompt in [false, true] {
        if let Err(e) = template.render(&messages, prompt) {
            outcome = Err(e.to_string());
        }
    }
    if let Err(e) = template.render_serialize(&messages, true, Some(&tools)) {
        outcome = Err(e.to_string());
    }
    outcome
}

fn run(bytes: &[u8]) -> Result<(), String> {
    render_all(super::text(bytes)?)
}
