//! What the backends check about the handles they gave out and about open captures, and
//! the streams and graphs of those that record launches themselves.

use std::collections::BTreeMap;

use crate::abi::KernelAbi;
use crate::alloc_table::Allocations;
use crate::checks::{check_launch, DeviceLimits};
use crate::error::RtError;
use crate::executor::{Arg, GraphId, KernelId, Launch, StreamId};

/// Entry `id` of a table of handles (`None`: released), or the error naming it unknown.
pub(crate) fn lookup<T: Copy>(
    table: &[Option<T>],
    kind: &'static str,
    id: u32,
) -> Result<T, RtError> {
    table
        .get(id as usize)
        .copied()
        .flatten()
        .ok_or(RtError::UnknownHandle {
            kind,
            id: id as u64,
        })
}

/// Kernel `k` of `kernels`, or the error naming it unknown.
pub(crate) fn kernel<T>(kernels: &[T], k: KernelId) -> Result<&T, RtError> {
    kernels.get(k.0 as usize).ok_or(RtError::UnknownHandle {
        kind: "kernel",
        id: k.0 as u64,
    })
}

/// Refuses `what`, an operation that cannot be part of a graph, while one of the streams
/// `capturing` is recording one.
pub(crate) fn refuse_during_capture(
    mut capturing: impl Iterator<Item = u32>,
    what: &str,
) -> Result<(), RtError> {
    match capturing.next() {
        Some(s) => Err(RtError::Capture {
            message: format!("{what} is not allowed while stream {s} is capturing"),
        }),
        None => Ok(()),
    }
}

/// A launch as issued: what a capture records and a replay issues again.
#[derive(Clone)]
pub(crate) struct Recorded {
    pub kernel: KernelId,
    pub launch: Launch,
    pub args: Vec<Arg>,
}

/// Streams, open captures and captured graphs, for the backends that record launches
/// themselves rather than through a driver's graphs.
pub(crate) struct Recorder {
    /// Streams `0..streams` exist; 0 is [`StreamId::DEFAULT`].
    streams: u32,
    captures: BTreeMap<u32, Vec<Recorded>>,
    graphs: Vec<Option<Vec<Recorded>>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            streams: 1,
            captures: BTreeMap::new(),
            graphs: vec![],
        }
    }

    pub fn check_stream(&self, s: StreamId) -> Result<(), RtError> {
        if s.0 < self.streams {
            Ok(())
        } else {
            Err(RtError::UnknownHandle {
                kind: "stream",
                id: s.0 as u64,
            })
        }
    }

    pub fn create_stream(&mut self) -> StreamId {
        self.streams += 1;
        StreamId(self.streams - 1)
    }

    /// Refuses `what` while any stream is capturing.
    pub fn refuse_during_capture(&self, what: &str) -> Result<(), RtError> {
        refuse_during_capture(self.captures.keys().copied(), what)
    }

    /// Refuses an event on `stream` while it captures.
    pub fn check_event_stream(&self, stream: StreamId) -> Result<(), RtError> {
        self.check_stream(stream)?;
        if self.captures.contains_key(&stream.0) {
            return Err(RtError::Capture {
                message: format!(
                    "cannot record an event on stream {} while it is capturing",
                    stream.0
                ),
            });
        }
        Ok(())
    }

    /// Checks a launch of kernel `kernel` against its interface `abi`, the device's limits
    /// and the live allocations `allocs`; records it if `stream` is capturing, otherwise
    /// hands it back to be run now.
    pub fn launch(
        &mut self,
        abi: &KernelAbi,
        allocs: &Allocations,
        kernel: KernelId,
        launch: &Launch,
        args: &[Arg],
        stream: StreamId,
    ) -> Result<Option<Recorded>, RtError> {
        check_launch(abi, launch, args, &DeviceLimits::SM90, allocs)?;
        self.check_stream(stream)?;
        let r = Recorded {
            kernel,
            launch: *launch,
            args: args.to_vec(),
        };
        match self.captures.get_mut(&stream.0) {
            Some(rec) => {
                rec.push(r);
                Ok(None)
            }
            None => Ok(Some(r)),
        }
    }

    pub fn begin(&mut self, stream: StreamId) -> Result<(), RtError> {
        self.check_stream(stream)?;
        if self.captures.contains_key(&stream.0) {
            return Err(RtError::Capture {
                message: format!("stream {} is already capturing", stream.0),
            });
        }
        self.captures.insert(stream.0, vec![]);
        Ok(())
    }

    pub fn end(&mut self, stream: StreamId) -> Result<GraphId, RtError> {
        self.check_stream(stream)?;
        let rec = self
            .captures
            .remove(&stream.0)
            .ok_or_else(|| RtError::Capture {
                message: format!("stream {} is not capturing", stream.0),
            })?;
        self.graphs.push(Some(rec));
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    /// The launches of graph `g`.
    pub fn graph(&self, g: GraphId) -> Result<&[Recorded], RtError> {
        self.graphs
            .get(g.0 as usize)
            .and_then(|launches| launches.as_deref())
            .ok_or(RtError::UnknownHandle {
                kind: "graph",
                id: g.0 as u64,
            })
    }

    /// Where `stream` is capturing, nests graph `g`'s launches in its capture and says
    /// so; otherwise the graph is to run now.
    pub fn replay_into_capture(&mut self, g: GraphId, stream: StreamId) -> Result<bool, RtError> {
        self.check_stream(stream)?;
        let launches = self.graph(g)?;
        if !self.captures.contains_key(&stream.0) {
            return Ok(false);
        }
        let launches = launches.to_vec();
        if let Some(rec) = self.captures.get_mut(&stream.0) {
            rec.extend(launches);
        }
        Ok(true)
    }

    /// The launches of graph `g` to run now on `stream`; none if `stream` is capturing,
    /// which nests them in its capture instead.
    pub fn replay(&mut self, g: GraphId, stream: StreamId) -> Result<Vec<Recorded>, RtError> {
        if self.replay_into_capture(g, stream)? {
            Ok(vec![])
        } else {
            Ok(self.graph(g)?.to_vec())
        }
    }

    pub fn release(&mut self, g: GraphId) -> Result<(), RtError> {
        match self.graphs.get_mut(g.0 as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(RtError::UnknownHandle {
                kind: "graph",
                id: g.0 as u64,
            }),
        }
    }
}
