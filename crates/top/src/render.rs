//! Draws the monitor into a ratatui buffer: GPU tabs, the selected GPU's readings,
//! 60-second history graphs, its processes, and the quench server's metrics.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{
    Block, Borders, LineGauge, Paragraph, Row, Sparkline, Table, Tabs, Widget, Wrap,
};

use crate::app::App;
use crate::format::{self, NA};
use crate::history::{GpuHistory, Series};
use crate::sample::{GpuSample, ProcessKind};

/// Below this size the layout cannot show the readings legibly.
pub const MIN_WIDTH: u16 = 100;
pub const MIN_HEIGHT: u16 = 30;

/// Lines of the readings panel.
const DETAIL_ROWS: u16 = 13;

const HELP: &str = " ←/→ Tab: switch GPU   1/2/3: refresh 0.1/0.5/1 s   q Esc: quit";

/// Draws `app` over `area` of `buf`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "quench top needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT} (this one is {}x{})",
            area.width, area.height
        );
        Paragraph::new(msg)
            .wrap(Wrap { trim: true })
            .render(area, buf);
        return;
    }
    let [header, tabs, main, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(app, header, buf);
    Paragraph::new(HELP)
        .style(Style::new().fg(Color::DarkGray))
        .render(help, buf);
    // Left: the GPU's readings over its processes; right: history graphs over the server.
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(main);
    let [details, processes] =
        Layout::vertical([Constraint::Length(DETAIL_ROWS + 2), Constraint::Fill(1)]).areas(left);
    let [graphs, server] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(10)]).areas(right);
    render_server(app, server, buf);

    let selected = app
        .snapshot
        .as_ref()
        .and_then(|s| s.gpus.get(app.selected).map(|g| (s, g)));
    let Some((snap, gpu)) = selected else {
        let why = app
            .gpu_error
            .as_deref()
            .unwrap_or("waiting for the first reading");
        Paragraph::new(format!("No GPU readings: {why}"))
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" GPU "))
            .render(details, buf);
        Block::bordered()
            .title(" Processes ")
            .render(processes, buf);
        Block::bordered().title(" History ").render(graphs, buf);
        return;
    };
    let titles = snap
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.index, g.name.as_deref().unwrap_or("GPU")));
    Tabs::new(titles)
        .select(app.selected)
        .highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .render(tabs, buf);
    render_details(gpu, details, buf);
    if let Some(h) = app.histories.get(app.selected) {
        render_history(gpu, h, snap.time_unix_ms, graphs, buf);
    }
    render_processes(gpu, processes, buf);
}

fn render_header(app: &App, area: Rect, buf: &mut Buffer) {
    let snap = app.snapshot.as_ref();
    let driver = snap.and_then(|s| s.driver_version.as_deref()).unwrap_or(NA);
    let nvml = snap.and_then(|s| s.nvml_version.as_deref()).unwrap_or(NA);
    let text = format!(
        " quench top │ driver {driver} │ NVML {nvml} │ refresh {} s",
        format::seconds(app.interval)
    );
    Paragraph::new(text)
        .style(Style::new().add_modifier(Modifier::BOLD))
        .render(area, buf);
}

fn ratio(part: Option<f64>, whole: Option<f64>) -> f64 {
    match (part, whole) {
        (Some(p), Some(w)) if w > 0.0 => (p / w).clamp(0.0, 1.0),
        _ => 0.0,
    }
}

fn gauge(label: String, r: f64, color: Color) -> LineGauge<'static> {
    LineGauge::default()
        .label(label)
        .ratio(r)
        .filled_style(Style::new().fg(color))
        .unfilled_style(Style::new().fg(Color::DarkGray))
}

fn render_details(g: &GpuSample, area: Rect, buf: &mut Buffer) {
    let title = format!(" GPU {} · {} ", g.index, g.name.as_deref().unwrap_or(NA));
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    block.render(area, buf);
    let rows = Layout::vertical([Constraint::Length(1); DETAIL_ROWS as usize]).split(inner);
    let line = |i: usize, text: String, buf: &mut Buffer| {
        if let Some(&r) = rows.get(i) {
            Paragraph::new(text).render(r, buf);
        }
    };
    line(
        0,
        format!("UUID     {}", g.uuid.as_deref().unwrap_or(NA)),
        buf,
    );
    line(
        1,
        format!("PCI bus  {}", g.pci_bus_id.as_deref().unwrap_or(NA)),
        buf,
    );
    let util = g.utilization_gpu_percent.map(f64::from);
    gauge(
        format!(
            "GPU util {:>8}",
            format::opt(g.utilization_gpu_percent, "%")
        ),
        ratio(util, Some(100.0)),
        Color::Green,
    )
    .render(rows[2], buf);
    let mem_util = g.utilization_memory_percent.map(f64::from);
    gauge(
        format!(
            "Mem util {:>8}",
            format::opt(g.utilization_memory_percent, "%")
        ),
        ratio(mem_util, Some(100.0)),
        Color::Cyan,
    )
    .render(rows[3], buf);
    let used = g.memory_used_bytes.map(|b| b as f64);
    let total = g.memory_total_bytes.map(|b| b as f64);
    let memory = match (g.memory_used_bytes, g.memory_total_bytes) {
        (Some(u), Some(t)) => format!("{:.1} / {:.1} GiB", format::gib(u), format::gib(t)),
        (u, t) => format!(
            "{} / {}",
            u.map_or(NA.into(), format::bytes),
            t.map_or(NA.into(), format::bytes)
        ),
    };
    gauge(
        format!("Memory   {memory}"),
        ratio(used, total),
        Color::Magenta,
    )
    .render(rows[4], buf);
    let power = format!(
        "{} / {}",
        format::watts(g.power_draw_watts),
        format::watts(g.power_limit_watts)
    );
    gauge(
        format!("Power    {power}"),
        ratio(g.power_draw_watts, g.power_limit_watts),
        Color::Yellow,
    )
    .render(rows[5], buf);
    line(
        6,
        format!(
            "SM clock {}   memory clock {}",
            format::opt(g.sm_clock_mhz, "MHz"),
            format::opt(g.memory_clock_mhz, "MHz")
        ),
        buf,
    );
    line(
        7,
        format!(
            "Temp     {}   fan {}",
            format::opt(g.temperature_c, "°C"),
            format::opt(g.fan_speed_percent, "%")
        ),
        buf,
    );
    line(
        8,
        format!(
            "PCIe     tx {}   rx {}",
            format::rate(g.pcie_tx_bytes_per_s),
            format::rate(g.pcie_rx_bytes_per_s)
        ),
        buf,
    );
    let nvlink = match g.nvlink_link_count {
        Some(0) => "no links".to_string(),
        Some(n) => format!(
            "{n} link{}   tx {}   rx {}",
            if n == 1 { "" } else { "s" },
            format::rate(g.nvlink_tx_bytes_per_s),
            format::rate(g.nvlink_rx_bytes_per_s)
        ),
        None => NA.to_string(),
    };
    line(9, format!("NVLink   {nvlink}"), buf);
    line(
        10,
        format!(
            "ECC      corrected {} · uncorrected {} (since boot)",
            count(g.ecc_corrected_volatile_count),
            count(g.ecc_uncorrected_volatile_count)
        ),
        buf,
    );
    line(
        11,
        format!(
            "         corrected {} · uncorrected {} (lifetime)",
            count(g.ecc_corrected_aggregate_count),
            count(g.ecc_uncorrected_aggregate_count)
        ),
        buf,
    );
    let xid = match (g.xid_events_count, g.xid_last_code) {
        (Some(0), _) => "none since start".to_string(),
        (Some(n), Some(code)) => format!("{n} since start, last Xid {code}"),
        (Some(n), None) => format!("{n} since start"),
        (None, _) => NA.to_string(),
    };
    line(12, format!("Xid      {xid}"), buf);
}

fn count(v: Option<u64>) -> String {
    v.map_or(NA.to_string(), |v| v.to_string())
}

fn render_history(g: &GpuSample, h: &GpuHistory, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let [util, mem, power] = Layout::vertical([Constraint::Ratio(1, 3); 3]).areas(area);
    let util_title = format!(
        " GPU utilization · now {} · peak {} · last 60 s ",
        format::opt(g.utilization_gpu_percent, "%"),
        peak(&h.utilization_gpu_percent, |v| format!("{v:.0} %"))
    );
    graph(
        &h.utilization_gpu_percent,
        util_title,
        now_ms,
        100.0,
        1.0,
        Color::Green,
        util,
        buf,
    );

    let total_gib = g.memory_total_bytes.map(format::gib);
    let mem_title = format!(
        " Memory used · now {} of {} · last 60 s ",
        g.memory_used_bytes
            .map_or(NA.into(), |b| format!("{:.1} GiB", format::gib(b))),
        total_gib.map_or(NA.into(), |t| format!("{t:.1} GiB"))
    );
    // Memory is graphed in MiB so that small changes still show as a bar.
    let mib = (1u64 << 20) as f64;
    let mem_max = g
        .memory_total_bytes
        .map(|b| b as f64)
        .or(h.memory_used_bytes.max())
        .unwrap_or(1.0);
    graph(
        &h.memory_used_bytes,
        mem_title,
        now_ms,
        mem_max / mib,
        1.0 / mib,
        Color::Magenta,
        mem,
        buf,
    );

    let power_title = format!(
        " Power · now {} · limit {} · last 60 s ",
        format::watts(g.power_draw_watts),
        format::watts(g.power_limit_watts)
    );
    let power_max = g
        .power_limit_watts
        .or(h.power_draw_watts.max())
        .unwrap_or(1.0);
    graph(
        &h.power_draw_watts,
        power_title,
        now_ms,
        power_max,
        1.0,
        Color::Yellow,
        power,
        buf,
    );
}

fn peak(s: &Series, show: impl Fn(f64) -> String) -> String {
    s.max().map_or(NA.to_string(), show)
}

/// One history graph: the window cut into one bar per column, scaled to `max`.
#[allow(clippy::too_many_arguments)]
fn graph(
    s: &Series,
    title: String,
    now_ms: u64,
    max: f64,
    scale: f64,
    color: Color,
    area: Rect,
    buf: &mut Buffer,
) {
    let block = Block::new().borders(Borders::ALL).title(title);
    let width = block.inner(area).width as usize;
    let bars: Vec<Option<u64>> = s
        .buckets(now_ms, width)
        .into_iter()
        .map(|b| b.map(|v| (v * scale).round().max(0.0) as u64))
        .collect();
    Sparkline::default()
        .block(block)
        .data(bars)
        .max(max.ceil().max(1.0) as u64)
        .style(Style::new().fg(color))
        .render(area, buf);
}

fn render_processes(g: &GpuSample, area: Rect, buf: &mut Buffer) {
    let block = Block::bordered().title(" Processes ");
    let Some(procs) = &g.processes else {
        Paragraph::new("the driver does not list processes here")
            .block(block)
            .render(area, buf);
        return;
    };
    if procs.is_empty() {
        Paragraph::new("no processes on this GPU")
            .block(block)
            .render(area, buf);
        return;
    }
    let rows = procs.iter().map(|p| {
        let kind = match p.kind {
            ProcessKind::Compute => "C",
            ProcessKind::Graphics => "G",
            ProcessKind::ComputeGraphics => "C+G",
        };
        Row::new([
            p.pid.to_string(),
            kind.to_string(),
            p.name.clone().unwrap_or_else(|| NA.to_string()),
            p.used_memory_bytes.map_or(NA.to_string(), format::bytes),
        ])
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(4),
        Constraint::Fill(1),
        Constraint::Length(11),
    ];
    Table::new(rows, widths)
        .header(
            Row::new(["PID", "TYPE", "NAME", "GPU MEMORY"])
                .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(block)
        .render(area, buf);
}

fn render_server(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(s) = &app.server else {
        let url = app
            .server_url
            .as_deref()
            .unwrap_or(crate::server::DEFAULT_URL);
        Paragraph::new(format!(
            "no quench server answers at {url} (choose one with --server URL)"
        ))
        .wrap(Wrap { trim: true })
        .block(Block::bordered().title(" quench server "))
        .render(area, buf);
        return;
    };
    let block = Block::bordered().title(format!(" quench server · {} ", s.url));
    if let Some(e) = &s.error {
        Paragraph::new(e.as_str())
            .wrap(Wrap { trim: true })
            .block(block)
            .render(area, buf);
        return;
    }
    let fig = |v: Option<f64>| v.map_or(NA.to_string(), format::number);
    let mut lines = vec![Line::from(format!(
        "tokens/s {}   prompt tokens/s {}   queue {}   KV blocks {} / {}",
        s.tokens_per_s.map_or(NA.to_string(), |v| format!("{v:.1}")),
        s.prompt_tokens_per_s
            .map_or(NA.to_string(), |v| format!("{v:.1}")),
        fig(s.queue_depth),
        fig(s.kv_blocks_used),
        fig(s.kv_blocks_total)
    ))
    .style(Style::new().add_modifier(Modifier::BOLD))];
    for m in &s.metrics {
        let labels: Vec<String> = m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let name = if labels.is_empty() {
            m.name.clone()
        } else {
            format!("{}{{{}}}", m.name, labels.join(","))
        };
        let rate = m
            .rate_per_s
            .map_or(String::new(), |r| format!("  ({r:.1}/s)"));
        lines.push(Line::from(format!(
            "{name} {}{rate}",
            format::number(m.value)
        )));
    }
    Paragraph::new(lines).block(block).render(area, buf);
}

/// The buffer as plain text, one line per row, trailing spaces trimmed.
pub fn buffer_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut row = String::new();
        for x in area.left()..area.right() {
            row.push_str(buf[(x, y)].symbol());
        }
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out
}

/// One frame of `app` at `width`×`height`, as text.
pub fn frame_text(app: &App, width: u16, height: u16) -> String {
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    render(app, area, &mut buf);
    buffer_text(&buf)
}
