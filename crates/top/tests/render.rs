//! The terminal view, drawn from scripted readings onto ratatui's test backend.

mod common;

use std::time::Duration;

use quench_top::fake::FakeSource;
use quench_top::render::{self, buffer_text};
use quench_top::server::ServerTracker;
use quench_top::{prom, App, GpuSample, Key, SampleSource, SourceError};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const W: u16 = 160;
const H: u16 = 48;

fn draw(app: &App) -> String {
    let mut term = Terminal::new(TestBackend::new(W, H)).expect("test backend");
    term.draw(|f| render::render(app, f.area(), f.buffer_mut()))
        .expect("draw");
    buffer_text(term.backend().buffer())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Feeds `n` readings one second apart from a fake source into a fresh app.
fn app_with(readings: Vec<quench_top::Snapshot>) -> App {
    let mut app = App::new(Duration::from_secs(1));
    let n = readings.len();
    let mut src = FakeSource::new(readings);
    for _ in 0..n {
        app.update(src.sample());
    }
    app
}

#[test]
fn shows_the_selected_gpus_readings_with_units() {
    let mut rng = common::rng("shows_the_selected_gpus_readings_with_units");
    let g0 = common::full_gpu(&mut rng, 0);
    let g1 = common::full_gpu(&mut rng, 1);
    let app = app_with(vec![common::snapshot(
        1_000_000,
        vec![g0.clone(), g1.clone()],
    )]);
    let screen = draw(&app);
    eprintln!("{screen}");
    let name = g0.name.clone().unwrap();
    let expect = [
        format!("GPU 0 · {name}"),
        format!("0 {name}"),
        format!("1 {}", g1.name.as_deref().unwrap()),
        g0.uuid.clone().unwrap(),
        g0.pci_bus_id.clone().unwrap(),
        format!(
            "GPU util {:>8}",
            format!("{} %", g0.utilization_gpu_percent.unwrap())
        ),
        format!(
            "Mem util {:>8}",
            format!("{} %", g0.utilization_memory_percent.unwrap())
        ),
        format!(
            "{:.1} / {:.1} GiB",
            gib(g0.memory_used_bytes.unwrap()),
            gib(g0.memory_total_bytes.unwrap())
        ),
        format!("SM clock {} MHz", g0.sm_clock_mhz.unwrap()),
        format!("memory clock {} MHz", g0.memory_clock_mhz.unwrap()),
        format!(
            "{:.1} W / {:.1} W",
            g0.power_draw_watts.unwrap(),
            g0.power_limit_watts.unwrap()
        ),
        format!("{} °C", g0.temperature_c.unwrap()),
        format!("fan {} %", g0.fan_speed_percent.unwrap()),
        format!("{} link", g0.nvlink_link_count.unwrap()),
        format!(
            "corrected {} · uncorrected {} (since boot)",
            g0.ecc_corrected_volatile_count.unwrap(),
            g0.ecc_uncorrected_volatile_count.unwrap()
        ),
        format!(
            "{} since start, last Xid {}",
            g0.xid_events_count.unwrap(),
            g0.xid_last_code.unwrap()
        ),
        "driver 580.159.03".to_string(),
        "refresh 1 s".to_string(),
        "last 60 s".to_string(),
    ];
    for e in &expect {
        assert!(screen.contains(e.as_str()), "screen lacks {e:?}");
    }
    for p in g0.processes.as_ref().unwrap() {
        let row = screen
            .lines()
            .find(|l| l.contains(&format!("│{:<8} ", p.pid)))
            .unwrap_or_else(|| panic!("no row for pid {}", p.pid));
        assert!(row.contains(p.name.as_deref().unwrap()), "row {row:?}");
    }
    // The second GPU's details are not on screen until it is selected.
    assert!(!screen.contains(g1.uuid.as_deref().unwrap()));
}

#[test]
fn keys_switch_gpu_change_refresh_and_quit() {
    let mut rng = common::rng("keys_switch_gpu_change_refresh_and_quit");
    let gpus: Vec<GpuSample> = (0..3).map(|i| common::full_gpu(&mut rng, i)).collect();
    let mut app = app_with(vec![common::snapshot(5_000, gpus.clone())]);
    for (key, selected) in [
        (Key::Right, 1),
        (Key::Tab, 2),
        (Key::Right, 0),
        (Key::Left, 2),
        (Key::BackTab, 1),
    ] {
        app.handle_key(key);
        assert_eq!(app.selected, selected, "after {key:?}");
        let screen = draw(&app);
        assert!(
            screen.contains(gpus[selected].uuid.as_deref().unwrap()),
            "GPU {selected} not shown after {key:?}"
        );
    }
    for (c, ms, shown) in [
        ('1', 100, "refresh 0.1 s"),
        ('3', 1000, "refresh 1 s"),
        ('2', 500, "refresh 0.5 s"),
    ] {
        app.handle_key(Key::Char(c));
        assert_eq!(app.interval, Duration::from_millis(ms));
        assert!(draw(&app).contains(shown));
    }
    assert!(!app.quit);
    app.handle_key(Key::Char('x'));
    assert!(!app.quit);
    app.handle_key(Key::Char('q'));
    assert!(app.quit);
    let mut app2 = app_with(vec![common::snapshot(5_000, gpus)]);
    app2.handle_key(Key::Esc);
    assert!(app2.quit);
}

/// Utilization 0 for the first half minute, then 100: the graph's right half is full
/// bars and its left half has none.
#[test]
fn history_graph_follows_the_readings() {
    let mut rng = common::rng("history_graph_follows_the_readings");
    let base = common::full_gpu(&mut rng, 0);
    let t0 = 10_000_000u64;
    let readings: Vec<_> = (0..=60)
        .map(|s| {
            let mut g = base.clone();
            g.utilization_gpu_percent = Some(if s < 30 { 0 } else { 100 });
            common::snapshot(t0 + s * 1000, vec![g])
        })
        .collect();
    let app = app_with(readings);
    let screen = draw(&app);
    let lines: Vec<&str> = screen.lines().collect();
    let title_row = lines
        .iter()
        .position(|l| l.contains(" GPU utilization · now 100 % · peak 100 %"))
        .expect("utilization graph title");
    // The first row inside the graph: the tallest bars reach it.
    let top: Vec<char> = lines[title_row + 1].chars().collect();
    let start = lines[title_row]
        .find("┌")
        .map(|b| lines[title_row][..b].chars().count())
        .expect("graph border");
    let graph: String = top[start + 1..].iter().take_while(|&&c| c != '│').collect();
    let width = graph.chars().count();
    assert!(width > 40, "graph too narrow: {graph:?}");
    let (left, right) = graph.split_at(graph.char_indices().nth(width / 2 - 2).unwrap().0);
    assert!(!left.contains('█'), "left half should be empty: {left:?}");
    assert!(
        right.trim_end().chars().skip(4).all(|c| c == '█'),
        "right half should be full: {right:?}"
    );
}

#[test]
fn missing_readings_show_as_not_available() {
    let app = app_with(vec![common::snapshot(1_000, vec![common::empty_gpu(0)])]);
    let screen = draw(&app);
    for e in [
        "GPU 0 · n/a",
        "GPU util      n/a",
        "SM clock n/a",
        "Temp     n/a",
        "NVLink   n/a",
        "Xid      n/a",
        "does not list processes",
    ] {
        assert!(screen.contains(e), "screen lacks {e:?}:\n{screen}");
    }
    assert!(
        !screen.contains(" 0 %") && !screen.contains("0 MHz") && !screen.contains("0.0 W"),
        "a missing reading drawn as 0:\n{screen}"
    );
}

#[test]
fn without_nvml_it_says_why() {
    let mut app = App::new(Duration::from_secs(1));
    let err = SourceError::LibraryNotLoaded {
        library: "libnvidia-ml.so.1".into(),
        reason: "libnvidia-ml.so.1: cannot open shared object file".into(),
    };
    let mut src = FakeSource::scripted([Err(err)]);
    app.update(src.sample());
    let screen = draw(&app);
    // The reason wraps inside its panel.
    assert!(
        screen.contains("No GPU readings: cannot load the NVIDIA management library"),
        "{screen}"
    );
    assert!(
        screen.contains("libnvidia-ml.so.1: cannot open shared object file (is the NVIDIA"),
        "{screen}"
    );
    assert!(
        screen.contains("no quench server answers at http://127.0.0.1:8080/metrics"),
        "{screen}"
    );
}

#[test]
fn server_metrics_show_beside_the_gpu() {
    let mut rng = common::rng("server_metrics_show_beside_the_gpu");
    let mut app = app_with(vec![common::snapshot(
        2_000,
        vec![common::full_gpu(&mut rng, 0)],
    )]);
    let mut tracker = ServerTracker::new();
    let text = |tokens: u64| {
        format!(
            "# TYPE quench_completion_tokens_total counter\nquench_completion_tokens_total{{model=\"m\"}} {tokens}\n\
             # TYPE quench_queue_depth gauge\nquench_queue_depth{{model=\"m\"}} 3\n\
             # TYPE quench_kv_blocks_used gauge\nquench_kv_blocks_used{{model=\"m\"}} 17\n\
             # TYPE quench_kv_blocks_total gauge\nquench_kv_blocks_total{{model=\"m\"}} 512\n"
        )
    };
    tracker.observe(
        "http://h:1/metrics",
        1_000,
        &prom::parse(&text(100)).unwrap(),
    );
    let s = tracker.observe(
        "http://h:1/metrics",
        3_000,
        &prom::parse(&text(350)).unwrap(),
    );
    app.set_server(Some(s));
    let screen = draw(&app);
    for e in [
        "quench server · http://h:1/metrics",
        "tokens/s 125.0",
        "queue 3",
        "KV blocks 17 / 512",
        "quench_completion_tokens_total{model=m} 350  (125.0/s)",
    ] {
        assert!(screen.contains(e), "screen lacks {e:?}:\n{screen}");
    }
}

#[test]
fn a_small_terminal_is_told_its_size() {
    let app = App::new(Duration::from_secs(1));
    let text = render::frame_text(&app, 60, 20);
    assert!(
        text.contains("at least 100x30") && text.contains("60x20"),
        "{text}"
    );
}
