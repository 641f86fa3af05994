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
            // Tool calling and structured output: the fields, their values, and the
            // JSON Schema keywords their schemas hold.
            b"\"tools\":[",
            b"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}",
            b"\"tool_choice\":",
            b"\"required\"",
            b"\"auto\"",
            b"{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
            b"\"parallel_tool_calls\":false",
            b"\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]",
            b"\"tool_call_id\":\"c\"",
            b"\"response_format\":",
            b"{\"type\":\"json_object\"}",
            b"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{}}}",
            b"{\"type\":\"grammar\",\"grammar\":\"start: \\\"a\\\"\"}",
            b"\"strict\":true",
            b"\"$ref\":\"#/$defs/a\"",
            b"\"anyOf\":[",
            b"\"oneOf\":[",
            b"\"enum\":[",
            b"\"pattern\":\"^a+$\"",
            b"\"additionalProperties\":false",
            b"\"n\":16",
            b"\"n\":17",
            b"\"logit_bias\":{\"0\":-100,\"5\":100}",
        ],
        format: crate::Format::Json,
        run,
    }
}

const SEEDS: [&str; 15] = [
    r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"seed":42,"stop":["\n\n"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3}"#,
    r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null},{"role":"developer","content":"x"}],"max_completion_tokens":4,"n":1,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"ignore_eos":true,"session_id":"s1"}"#,
    r#"{"model":"m","prompt":"Once upon a time","max_tokens":8,"logprobs":2,"echo":true,"stop":"."}"#,
    r#"{"prompt":[1,2,3,4294967295],"presence_penalty":0.5,"frequency_penalty":-0.5,"best_of":1,"suffix":null}"#,
    r#"{"prompt":[[7,8]],"tools":[],"tool_choice":"none","response_format":{"type":"text"},"logit_bias":{}}"#,
    r#"{"model":"e","input":["one","two"],"encoding_format":"base64","dimensions":384}"#,
    r#"{"model":"m","prompt":"text","messages":[{"role":"user","content":"hi"}]}"#,
    r#"{"tokens":[0,1,2,65535]}"#,
    // Tool calling: auto with two tools, a named choice after a call and its result, a
    // required choice with several choices and biases.
    r#"{"model":"m","messages":[{"role":"system","content":"You call tools."},{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"The weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":64},"unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"now","parameters":{}}}],"tool_choice":"auto","parallel_tool_calls":true,"max_tokens":32}"#,
    r#"{"messages":[{"role":"user","content":"Add 2 and 3"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"add","arguments":"{\"a\": 2, \"b\": 3}"}}]},{"role":"tool","tool_call_id":"call_1","name":"add","content":"5"}],"tools":[{"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{"a":{"type":"integer","minimum":0},"b":{"type":"number"}},"required":["a","b"]}}}],"tool_choice":{"type":"function","function":{"name":"add"}},"parallel_tool_calls":false,"stream":true}"#,
    r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"q":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3}}}}}],"tool_choice":"required","n":2,"logit_bias":{"0":-100,"42":12.5,"7":100}}"#,
    // Structured output: a strict schema with $defs, $ref, anyOf, pattern and format and
    // several choices; json_object and a Lark grammar on completions; a loose schema with
    // oneOf beside tools left out.
    r##"{"model":"m","messages":[{"role":"user","content":"Describe a person"}],"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string","pattern":"^[A-Z][a-z]+$"},"age":{"type":"integer","minimum":0,"maximum":150},"pets":{"type":"array","items":{"$ref":"#/$defs/pet"}},"email":{"type":"string","format":"email"},"id":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["name","age"],"additionalProperties":false,"$defs":{"pet":{"type":"object","properties":{"kind":{"enum":["cat","dog"]},"legs":{"const":4}}}}}}},"n":4,"seed":7,"temperature":0.8}"##,
    r#"{"model":"m","prompt":"JSON: ","response_format":{"type":"json_object"},"n":3,"logit_bias":{"1":-50},"max_tokens":24}"#,
    r#"{"prompt":"Answer: ","response_format":{"type":"grammar","grammar":"start: (\"yes\" | \"no\") \", \" NUM\nNUM: /[1-9][0-9]?/"},"max_tokens":8}"#,
    r#"{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"any","schema":{"oneOf":[{"type":"number"},{"type":"boolean"}]}}},"tool_choice":"none","tools":[{"type":"function","function":{"name":"unused"}}]}"#,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds reach the checks of tool calling and structured output: each of their
    /// fields is in some seed that the route it is written for accepts, so mutations start
    /// from inputs that pass those checks.
    #[test]
    fn seeds_reach_tools_and_structured_output() {
        let accepted: Vec<&str> = SEEDS
            .iter()
            .copied()
            .filter(|s| {
                let endpoint = if s.contains("\"messages\"") {
                    Endpoint::Chat
                } else {
                    Endpoint::Completions
                };
                check_request(endpoint, s.as_bytes()).is_ok()
            })
            .collect();
        for field in [
            "\"tools\":[{",
            "\"tool_choice\":\"auto\"",
            "\"tool_choice\":\"required\"",
            "\"tool_choice\":{\"type\":\"function\"",
            "\"tool_choice\":\"none\"",
            "\"parallel_tool_calls\":false",
            "\"tool_calls\":[{",
            "\"tool_call_id\"",
            "\"type\":\"json_object\"",
            "\"type\":\"json_schema\"",
            "\"strict\":true",
            "\"$ref\"",
            "\"type\":\"grammar\"",
            "\"n\":2",
            "\"n\":4",
            "\"logit_bias\":{\"0\":-100",
        ] {
            assert!(
                accepted.iter().any(|s| s.contains(field)),
                "no accepted seed holds {field}"
            );
        }
    }
}
