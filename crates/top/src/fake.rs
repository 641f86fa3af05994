//! A scripted sample source: hands out the snapshots it was given, in order. Tests
//! drive the renderers with it; nothing here touches a GPU.

use std::collections::VecDeque;

use crate::sample::Snapshot;
use crate::source::{SampleSource, SourceError};

pub struct FakeSource {
    script: VecDeque<Result<Snapshot, SourceError>>,
}

impl FakeSource {
    pub fn new(snapshots: impl IntoIterator<Item = Snapshot>) -> Self {
        FakeSource {
            script: snapshots.into_iter().map(Ok).collect(),
        }
    }

    /// A source whose readings (or failures) follow `script`.
    pub fn scripted(script: impl IntoIterator<Item = Result<Snapshot, SourceError>>) -> Self {
        FakeSource {
            script: script.into_iter().collect(),
        }
    }
}

impl SampleSource for FakeSource {
    fn sample(&mut self) -> Result<Snapshot, SourceError> {
        self.script
            .pop_front()
            .unwrap_or(Err(SourceError::Exhausted))
    }
}
