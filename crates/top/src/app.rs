//! The monitor's state: the latest readings, their history, the GPU on screen and the
//! refresh interval; keys change it. No terminal here, so tests drive it directly.

use std::time::Duration;

use crate::history::GpuHistory;
use crate::sample::Snapshot;
use crate::server::ServerSample;
use crate::source::SourceError;

/// The refresh intervals keys 1, 2 and 3 choose.
pub const REFRESH_CHOICES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_millis(1000),
];

/// A key press, as the monitor understands it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Left,
    Right,
    Tab,
    BackTab,
    Esc,
    Char(char),
}

pub struct App {
    pub selected: usize,
    pub interval: Duration,
    pub snapshot: Option<Snapshot>,
    /// Why there are no GPU readings (no NVML, no GPU, a failed read).
    pub gpu_error: Option<String>,
    pub server: Option<ServerSample>,
    /// Where server metrics are read from, shown while nothing answers there.
    pub server_url: Option<String>,
    pub histories: Vec<GpuHistory>,
    pub quit: bool,
}

impl App {
    pub fn new(interval: Duration) -> Self {
        App {
            selected: 0,
            interval,
            snapshot: None,
            gpu_error: None,
            server: None,
            server_url: None,
            histories: Vec::new(),
            quit: false,
        }
    }

    /// Takes a reading (or the reason there is none) into the state and history.
    pub fn update(&mut self, reading: Result<Snapshot, SourceError>) {
        match reading {
            Ok(snap) => {
                if self.histories.len() != snap.gpus.len() {
                    self.histories
                        .resize_with(snap.gpus.len(), GpuHistory::default);
                }
                for (h, g) in self.histories.iter_mut().zip(&snap.gpus) {
                    h.push(snap.time_unix_ms, g);
                }
                self.selected = self.selected.min(snap.gpus.len().saturating_sub(1));
                self.gpu_error = None;
                self.snapshot = Some(snap);
            }
            Err(e) => {
                self.gpu_error = Some(e.to_string());
                self.snapshot = None;
            }
        }
    }

    pub fn set_server(&mut self, server: Option<ServerSample>) {
        self.server = server;
    }

    fn gpu_count(&self) -> usize {
        self.snapshot.as_ref().map_or(0, |s| s.gpus.len())
    }

    pub fn handle_key(&mut self, key: Key) {
        let n = self.gpu_count();
        match key {
            Key::Char('q') | Key::Esc => self.quit = true,
            Key::Right | Key::Tab if n > 0 => self.selected = (self.selected + 1) % n,
            Key::Left | Key::BackTab if n > 0 => self.selected = (self.selected + n - 1) % n,
            Key::Char(c @ '1'..='3') => self.interval = REFRESH_CHOICES[c as usize - '1' as usize],
            _ => {}
        }
    }
}
