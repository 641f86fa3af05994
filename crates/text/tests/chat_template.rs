//! Chat templates against Python Jinja2 configured as transformers configures it
//! (fixtures/chat_templates.json from scripts/fixtures/text/make_templates.py).

mod common;

use common::{fixture, tests_dir};
use minijinja::Value;
use quench_text::{ChatTemplate, Message, TextError};

/// The fixture cases parsed as minijinja values, so that objects keep their key order
/// (which `tojson` output shows).
fn cases() -> Vec<Value> {
    let raw = std::fs::read_to_string(tests_dir().join("fixtures/chat_templates.json")).unwrap();
    serde_json::from_str(&raw).unwrap()
}

fn text(case: &Value, key: &str) -> Option<String> {
    case.get_attr(key)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
}

#[test]
fn templates_render_like_transformers() {
    let cases = cases();
    for case in &cases {
        let name = text(case, "name").unwrap();
        let source = text(case, "template").unwrap();
        let messages = case.get_attr("messages").unwrap();
        let agp = case.get_attr("add_generation_prompt").unwrap().is_true();
        let tools = case.get_attr("tools").unwrap();
        let tools = (!tools.is_none()).then_some(tools);
        let compiled = ChatTemplate::new(&source, "<s>", "</s>");
        if let Some(line) = case
            .get_attr("syntax_error_line")
            .ok()
            .and_then(|v| v.as_i64())
        {
            match compiled {
                Err(TextError::TemplateSyntax { line: got, .. }) => {
                    assert_eq!(got as i64, line, "{name}: error line")
                }
                other => panic!("{name}: expected a syntax error at line {line}, got {other:?}"),
            }
            continue;
        }
        let rendered = compiled
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .render_serialize(&messages, agp, tools.as_ref());
        match (text(case, "expected"), text(case, "error")) {
            (Some(want), _) => assert_eq!(
                rendered.unwrap_or_else(|e| panic!("{name}: {e}")),
                want,
                "{name}"
            ),
            (None, Some(msg)) => match rendered {
                Err(TextError::TemplateRender(got)) => {
                    assert!(got.contains(&msg), "{name}: {got:?} lacks {msg:?}")
                }
                other => panic!("{name}: expected the error {msg:?}, got {other:?}"),
            },
            _ => panic!("{name}: fixture has neither expected text nor error"),
        }
    }
    assert!(cases.len() >= 20);
    eprintln!("chat templates: {} cases match Jinja2", cases.len());
}

#[test]
fn plain_messages_render_through_the_same_path() {
    let cases = fixture("chat_templates.json");
    let case = &cases[1];
    assert_eq!(case["name"], "smollm2/no_system/agp=False");
    let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
    let t = ChatTemplate::new(case["template"].as_str().unwrap(), "", "").unwrap();
    assert_eq!(
        t.render(&messages, false).unwrap(),
        case["expected"].as_str().unwrap()
    );
}

#[test]
fn smollm2_gguf_template_matches_fixture() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let (_, template) = common::gguf_meta::gguf_vocab(&path);
    let cases = fixture("chat_templates.json");
    assert_eq!(template.as_deref(), cases[0]["template"].as_str());
}
