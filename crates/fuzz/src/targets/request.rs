//! Request bodies of the OpenAI-compatible server, read as each route reads them.

use quench_serve::{check_request, Endpoint};

use crate::Target;

pub fn target() -> Target {
    Target {
        name: "request",
        about: "server request JSON (quench_serve::check_request) for chat, completions, embeddings, tokenize, detokenize",
        seeds,
        dict: &[
            b"\"messages\":[",
            b"{\"role\":\"user\",\"content\":\"hi\"}",
            b"\"content\":[{\"type\":\"text\",\"text\":\"a\"}]",
            b"\"prompt\":[[1,2],[3]]",
            b"\"stop\":[\"a\",\"b\"]",
            b"\"max_tokens\":",
            b"\"temperature\":",
            b"\"logit_bias\":{\"1\":2}",
            b"\"n\":",
            b"\"top_logprobs\":",
            b"\"input\":",
            b"\"tokens\":[",
            b"\"stream_options\":{\"include_usage\":true}",
        ],
        format: crate::Format::Json,
        run,
    }
}

const SEEDS: [&str; 8] = [
    r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"seed":42,"stop":["\n\n"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3}"#,
    r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null},{"role":"developer","content":"x"}],"max_completion_tokens":4,"n":1,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"ignore_eos":true,"session_id":"s1"}"#,
    r#"{"model":"m","prompt":"Once upon a time","max_tokens":8,"logprobs":2,"echo":true,"stop":"."}"#,
    r#"{"prompt":[1,2,3,4294967295],"presence_penalty":0.5,"frequency_penalty":-0.5,"best_of":1,"suffix":null}"#,
    r#"{"prompt":[[7,8]],"tools":[],"tool_choice":"none","response_format":{"type":"text"},"logit_bias":{}}"#,
    r#"{"model":"e","input":["one","two"],"encoding_format":"base64","dimensions":384}"#,
    r#"{"model":"m","prompt":"text","messages":[{"role":"user","content":"hi"}]}"#,
    r#"{"tokens":[0,1,2,65535]}"#,
];

fn seeds() -> Vec<Vec<u8>> {
    SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// Every route reads the body; the outcome is the chat route's.
fn run(bytes: &[u8]) -> Result<(), String> {
    let mut outcome = Ok(());
    for endpoint in Endpoint::ALL {
        let result = check_request(endpoint, bytes);
        if endpoint == Endpoint::Chat {
            outcome = result;
        }
    }
    outcome
}
