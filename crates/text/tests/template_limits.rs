//! Untrusted chat templates render in bounded time and memory: each limit of
//! `RenderLimits` stops a template built to pass it, with an error that names the limit.

use std::time::{Duration, Instant};

use quench_text::{BudgetAllocator, ChatTemplate, Message, RenderLimits, TextError};

// The memory limit is enforced by the allocator, as in the quench binary.
#[global_allocator]
static ALLOC: BudgetAllocator = BudgetAllocator;

fn limits() -> RenderLimits {
    RenderLimits {
        memory_bytes: 32 << 20,
        ..RenderLimits::default()
    }
}

fn render(source: &str, limits: RenderLimits) -> (ChatTemplate, Result<String, TextError>) {
    let template = ChatTemplate::new(source, "<s>", "</s>")
        .expect("compiles")
        .with_limits(limits);
    let started = Instant::now();
    let result = template.render(&[Message::new("user", "hi")], true);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{source}: took {:?}",
        started.elapsed()
    );
    (template, result)
}

fn limit_error(source: &str, limits: RenderLimits, names: &str) -> ChatTemplate {
    let (template, result) = render(source, limits);
    match result {
        Err(TextError::TemplateLimit(reason)) => {
            assert!(reason.contains(names), "{source}: {reason}")
        }
        other => panic!("{source}: expected a limit naming {names:?}, got {other:?}"),
    }
    template
}

#[test]
fn doubling_a_string_without_output_stops_at_the_memory_limit_and_the_template_is_refused_after() {
    // Forty doublings ask for 2^41 bytes; nothing calls back into quench on the way, so
    // the render thread is stopped at the hard limit (twice the budget).
    let source = format!(
        "{{% set s = 'ab' %}}{}{{{{ s|length }}}}",
        "{% set s = s ~ s %}".repeat(40)
    );
    let template = limit_error(&source, limits(), "32 MiB of memory");
    match template.render(&[Message::new("user", "hi")], true) {
        Err(TextError::TemplateLimit(reason)) => assert!(reason.contains("refused"), "{reason}"),
        other => panic!("expected the template to be refused, got {other:?}"),
    }
}

#[test]
fn doubling_in_a_loop_that_writes_stops_at_the_soft_limit() {
    let source = "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{{ i }}{% endfor %}";
    let template = limit_error(source, limits(), "32 MiB of memory");
    // Stopped gracefully (the render unwound), so the template may be rendered again.
    let again = template.render(&[], false);
    assert!(
        matches!(&again, Err(TextError::TemplateLimit(r)) if !r.contains("refused")),
        "{again:?}"
    );
}

#[test]
fn recursive_macros_that_double_stop_at_the_memory_limit() {
    let source = "{% macro m(s, n) %}{% if n > 0 %}{{ m(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ m('ab', 80) }}";
    limit_error(source, limits(), "32 MiB of memory");
}

#[test]
fn a_quadratic_loop_runs_out_of_fuel() {
    let source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    limit_error(source, limits(), "template instructions");
}

#[test]
fn output_past_the_limit_is_refused() {
    let source = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
    let small = RenderLimits {
        output_bytes: 1 << 20,
        ..limits()
    };
    limit_error(source, small, "wrote more than 1 MiB");
}

#[test]
fn a_slow_render_is_stopped_at_the_deadline() {
    // Each step copies 8 MB: slow, within the memory budget, few instructions.
    let source =
        "{% set s = 'a' * 8000000 %}{% for i in range(100000) %}{% set t = s ~ i %}{% endfor %}";
    let quick = RenderLimits {
        time: Duration::from_millis(200),
        ..limits()
    };
    limit_error(source, quick, "longer than 0.2 s");
}

#[test]
fn a_huge_tojson_indent_is_refused_by_name() {
    let (_, result) = render("{{ messages|tojson(indent=1000000000) }}", limits());
    let message = result.expect_err("refused").to_string();
    assert!(
        message.contains("indent 1000000000 is wider than 64"),
        "{message}"
    );
}

#[test]
fn real_templates_render_within_the_limits() {
    let (_, result) = render(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        limits(),
    );
    assert_eq!(result.expect("renders"), "<|im_start|>user\nhi<|im_end|>\n");
}

#[test]
fn deeply_nested_templates_compile_and_render_on_a_small_stack() {
    // minijinja's parser refuses nesting past 150 levels; what it accepts must not run a
    // thread with a 2 MiB stack (tokio's, libtest's) out of stack.
    let depth = 149;
    let sources = [
        format!("{{{{ {}1{} }}}}", "(".repeat(depth), ")".repeat(depth)),
        format!("{{{{ {}1{} }}}}", "[".repeat(depth), "]".repeat(depth)),
        format!(
            "{}x{}",
            "{% if true %}".repeat(depth),
            "{% endif %}".repeat(depth)
        ),
        format!("{{{{ {}1 }}}}", "not ".repeat(depth)),
        format!("{{{{ 1{} }}}}", " ~ 1".repeat(2000)),
    ];
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            for source in &sources {
                if let Ok(t) = ChatTemplate::new(source, "", "") {
                    let _ = t.render(&[], false);
                }
            }
        })
        .expect("spawns");
    worker.join().expect("no stack overflow");
}
