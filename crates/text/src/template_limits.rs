//! Rendering a chat template within limits: a template comes from a model file, which is as
//! untrusted as any download, so one render may run at most so many instructions (fuel),
//! write so much output, hold so much memory (see [`crate::render_budget`]) and take so
//! long. The render runs on a thread of its own, which the caller waits for until the
//! deadline; a render that passes a limit is an error naming the limit.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use minijinja::{Environment, Error, ErrorKind, Value};

use crate::render_budget::{over_budget, Scope};

/// Bounds on one render of a chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// Template instructions (minijinja fuel).
    pub fuel: u64,
    /// Bytes of rendered text.
    pub output_bytes: usize,
    /// Bytes the render may hold at once; enforced only where
    /// [`BudgetAllocator`](crate::BudgetAllocator) is the global allocator.
    pub memory_bytes: usize,
    /// Wall-clock time.
    pub time: Duration,
}

impl Default for RenderLimits {
    /// Far above what real templates need (a thousand-message chat renders in well under a
    /// million instructions and a few megabytes), far below what hurts a machine.
    fn default() -> Self {
        RenderLimits {
            fuel: 5_000_000,
            output_bytes: 32 << 20,
            memory_bytes: 256 << 20,
            time: Duration::from_secs(2),
        }
    }
}

/// Why a render failed: an error of the template's, or a limit passed.
pub(crate) enum Failure {
    Render(Error),
    Limit(String),
}

/// The render's output, refusing to grow past the output limit or once the memory budget
/// has been passed (every piece of output, literal text included, passes through here).
struct CappedWriter {
    out: Vec<u8>,
    cap: usize,
}

impl io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.cap {
            return Err(io::Error::other("output limit"));
        }
        if over_budget() {
            return Err(io::Error::other("memory limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Fails the render once its memory budget has been passed: called by the formatter and
/// by quench's filters and functions, so that a template that builds a huge value stops
/// at its next `{{ }}` or call.
pub(crate) fn check_budget() -> Result<(), Error> {
    if over_budget() {
        return Err(Error::new(ErrorKind::InvalidOperation, "memory limit"));
    }
    Ok(())
}

fn mib(bytes: usize) -> String {
    format!("{} MiB", bytes >> 20)
}

/// Names the limit a failed render passed, if it passed one.
fn classify(e: Error, limits: &RenderLimits, over: bool) -> Failure {
    if over || e.to_string().contains("memory limit") {
        return Failure::Limit(format!(
            "rendering needed more than {} of memory (the limit for one render)",
            mib(limits.memory_bytes)
        ));
    }
    match e.kind() {
        ErrorKind::OutOfFuel => Failure::Limit(format!(
            "rendering ran past {} template instructions (the limit for one render)",
            limits.fuel
        )),
        ErrorKind::WriteFailure => Failure::Limit(format!(
            "rendering wrote more than {} (the limit for one render)",
            mib(limits.output_bytes)
        )),
        _ => Failure::Render(e),
    }
}

/// Renders `name` from `env` with `ctx` within `limits`. `Err(Limit)` for a render that
/// passed a limit; when the render thread had to be abandoned (`abandoned` is then true)
/// the template must not be rendered again.
pub(crate) fn render(
    env: Arc<Environment<'static>>,
    name: &'static str,
    ctx: Value,
    limits: RenderLimits,
    abandoned: &mut bool,
) -> Result<String, Failure> {
    let started = Instant::now();
    let deadline = started + limits.time;
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let (tx, rx) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("chat-template".to_owned())
        // minijinja's recursion limit (500) is validated for a main thread's stack.
        .stack_size(64 << 20)
        .spawn(move || {
            // SAFETY: `flag` is owned by this closure, so it lives as long as the thread.
            let scope = unsafe { Scope::enter(limits.memory_bytes, deadline, Arc::as_ptr(&flag)) };
            // A panic is carried to the caller's thread and resumed there, so that it is
            // not hidden from whoever catches panics there (the fuzzer does).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut out = CappedWriter {
                    out: Vec::new(),
                    cap: limits.output_bytes,
                };
                let result = env
                    .get_template(name)
                    .and_then(|t| t.render_captured_to(ctx, &mut out).map(|_| ()));
                let over = over_budget();
                result
                    .map(|()| out.out)
                    .map_err(|e| classify(e, &limits, over))
            }));
            drop(scope);
            let _ = tx.send(result);
        })
        .map_err(|e| Failure::Limit(format!("cannot start the render thread: {e}")))?;
    loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(result) => {
                let _ = thread.join();
                let result = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                return result.and_then(|bytes| {
                    // Every piece written was a `&str`.
                    String::from_utf8(bytes).map_err(|_| {
                        Failure::Limit("rendering wrote bytes that are not UTF-8".to_owned())
                    })
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                *abandoned = true;
                return Err(Failure::Limit(
                    "the render thread ended without a result".to_owned(),
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // The thread stops for good at its hard memory limit, or when it allocates past
        // the deadline: which one it was is told by the clock.
        let late = started.elapsed() > limits.time;
        if stopped.load(Ordering::Acquire) && !late {
            *abandoned = true;
            return Err(Failure::Limit(format!(
                "rendering needed more than {} of memory (the limit for one render)",
                mib(limits.memory_bytes)
            )));
        }
        if late {
            *abandoned = true;
            return Err(Failure::Limit(format!(
                "rendering took longer than {} s (the limit for one render)",
                limits.time.as_secs_f64()
            )));
        }
    }
}
