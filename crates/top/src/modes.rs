//! The ways `quench top` runs: one JSON reading, a stream of JSON lines, one frame as
//! text, or the interactive terminal monitor.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::app::{App, Key};
use crate::json;
use crate::render;
use crate::server::{ServerPoller, ServerSample};
use crate::source::{SampleSource, SourceError};

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("terminal: {0}")]
    Terminal(std::io::Error),
    #[error("cannot write the output: {0}")]
    Output(std::io::Error),
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn poll_server(server: &mut Option<ServerPoller>) -> Option<ServerSample> {
    server.as_mut().and_then(|s| s.poll(now_unix_ms()))
}

/// One reading as JSON. Rates (NVLink, server counters) need two readings, so this
/// reads twice, `window` apart, and reports the second.
pub fn json_once(
    source: &mut dyn SampleSource,
    server: &mut Option<ServerPoller>,
    window: Duration,
) -> Result<serde_json::Value, TopError> {
    source.sample()?;
    poll_server(server);
    std::thread::sleep(window);
    let snap = source.sample()?;
    let srv = poll_server(server);
    Ok(json::report(&snap, srv.as_ref()))
}

/// Streams one JSON line per reading, every `interval`, `count` lines (or until
/// stopped, or a reading fails).
pub fn watch(
    source: &mut dyn SampleSource,
    server: &mut Option<ServerPoller>,
    interval: Duration,
    count: Option<u64>,
    out: &mut dyn Write,
) -> Result<(), TopError> {
    let mut written = 0u64;
    let mut next = Instant::now();
    while count.is_none_or(|c| written < c) {
        let snap = source.sample()?;
        let srv = poll_server(server);
        let line = json::report(&snap, srv.as_ref()).to_string();
        writeln!(out, "{line}")
            .and_then(|_| out.flush())
            .map_err(TopError::Output)?;
        written += 1;
        next += interval;
        if count.is_none_or(|c| written < c) {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
    Ok(())
}

/// One frame of the monitor as text, `width`×`height`, from `readings` readings
/// `interval` apart (so the history graphs and rates have something to show).
pub fn frame_text(
    source: Result<&mut dyn SampleSource, SourceError>,
    server: &mut Option<ServerPoller>,
    interval: Duration,
    readings: usize,
    width: u16,
    height: u16,
) -> String {
    let mut app = App::new(interval);
    app.server_url = server.as_ref().map(|s| s.url().to_string());
    match source {
        Ok(src) => {
            for i in 0..readings.max(1) {
                if i > 0 {
                    std::thread::sleep(interval);
                }
                app.update(src.sample());
                app.set_server(poll_server(server));
            }
        }
        Err(e) => {
            app.update(Err(e));
            app.set_server(poll_server(server));
        }
    }
    render::frame_text(&app, width, height)
}

/// The interactive monitor, until q or Esc. Without GPU readings it still runs and
/// says why, next to the server's metrics.
pub fn tui(
    source: Result<&mut dyn SampleSource, SourceError>,
    server: &mut Option<ServerPoller>,
    interval: Duration,
) -> Result<(), TopError> {
    let mut terminal = ratatui::try_init().map_err(TopError::Terminal)?;
    let result = tui_loop(&mut terminal, source, server, interval);
    ratatui::restore();
    result
}

fn tui_loop(
    terminal: &mut ratatui::DefaultTerminal,
    mut source: Result<&mut dyn SampleSource, SourceError>,
    server: &mut Option<ServerPoller>,
    interval: Duration,
) -> Result<(), TopError> {
    let mut app = App::new(interval);
    app.server_url = server.as_ref().map(|s| s.url().to_string());
    if let Err(e) = &source {
        app.update(Err(e.clone()));
    }
    let mut next_reading = Instant::now();
    while !app.quit {
        if Instant::now() >= next_reading {
            if let Ok(src) = source.as_mut() {
                app.update(src.sample());
            }
            app.set_server(poll_server(server));
            next_reading = Instant::now() + app.interval;
        }
        terminal
            .draw(|f| render::render(&app, f.area(), f.buffer_mut()))
            .map_err(TopError::Terminal)?;
        let wait = next_reading.saturating_duration_since(Instant::now());
        if event::poll(wait).map_err(TopError::Terminal)? {
            if let Event::Key(k) = event::read().map_err(TopError::Terminal)? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                let before = app.interval;
                match k.code {
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        app.quit = true
                    }
                    KeyCode::Left => app.handle_key(Key::Left),
                    KeyCode::Right => app.handle_key(Key::Right),
                    KeyCode::Tab => app.handle_key(Key::Tab),
                    KeyCode::BackTab => app.handle_key(Key::BackTab),
                    KeyCode::Esc => app.handle_key(Key::Esc),
                    KeyCode::Char(c) => app.handle_key(Key::Char(c)),
                    _ => {}
                }
                if app.interval != before {
                    next_reading = Instant::now();
                }
            }
        }
    }
    Ok(())
}
