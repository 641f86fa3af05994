//! A memory budget for the thread that renders a chat template.
//!
//! minijinja has fuel (a bound on instructions) but no bound on the size of the values an
//! instruction makes: `{% set s = s ~ s %}` doubles a string per instruction, so forty of
//! them ask for a terabyte. Only the allocator sees every byte, so this module provides one:
//! [`BudgetAllocator`] wraps the system allocator and, on a thread inside a render
//! [`Scope`], counts the bytes the thread holds.
//!
//! - Past the **soft** limit it sets a flag; the template's next output, `{{ }}`, filter or
//!   function call sees it ([`over_budget`]) and fails the render with an error, which
//!   unwinds minijinja normally and frees what it held.
//! - Past the **hard** limit (twice the soft one, for a template that grows without
//!   calling back), and past the render's deadline, the thread stops for good before it
//!   allocates more: it sleeps forever. An allocator may neither fail (Rust aborts on a
//!   failed allocation) nor unwind, so this is the only way to stop it without ending the
//!   process; the caller, which waits on another thread, returns an error and refuses the
//!   template from then on, so each template can strand at most one such thread.
//!
//! A binary opts in with `#[global_allocator] static A: BudgetAllocator = BudgetAllocator;`
//! (the `quench` CLI and `quench-fuzz` do). Without it renders are still bounded in
//! instructions, output and time, but not in memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting what a render thread holds (see the module docs).
pub struct BudgetAllocator;

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether [`BudgetAllocator`] is this process's global allocator (it has allocated).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

#[derive(Clone, Copy)]
struct State {
    /// Bytes this thread holds beyond what it held when the scope began (it may free
    /// memory allocated before, so this can go below zero).
    held: isize,
    soft: isize,
    hard: isize,
    deadline: Instant,
    /// Set (never cleared) once the soft limit is passed.
    over: bool,
    /// Where the thread reports that it has stopped for good; outlives the thread.
    stopped: *const AtomicBool,
}

thread_local! {
    static SCOPE: Cell<Option<State>> = const { Cell::new(None) };
}

/// Sleeps forever: the render thread is abandoned (see the module docs).
fn stop_forever(stopped: *const AtomicBool) -> ! {
    // SAFETY: `Scope::enter`'s caller keeps the flag alive for as long as the thread runs.
    unsafe { (*stopped).store(true, Ordering::Release) };
    loop {
        // `sleep` allocates nothing, so it cannot re-enter the allocator.
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Accounts `grow` more bytes (negative: freed) to the current scope, if any, and stops
/// the thread if that would pass the hard limit or the deadline.
#[inline]
fn account(grow: isize) {
    let Ok(Some(mut s)) = SCOPE.try_with(Cell::get) else {
        return;
    };
    s.held = s.held.saturating_add(grow);
    if grow > 0 {
        if s.held > s.hard || Instant::now() > s.deadline {
            stop_forever(s.stopped);
        }
        s.over |= s.held > s.soft;
    }
    let _ = SCOPE.try_with(|c| c.set(Some(s)));
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping touches only a
// thread-local `Cell` (const-initialized, no destructor, so it never allocates).
unsafe impl GlobalAlloc for BudgetAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        account(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account(layout.size() as isize);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

/// A render's budget on the current thread, from `enter` until dropped.
pub(crate) struct Scope(());

impl Scope {
    /// Starts counting: `soft` bytes before renders fail, twice that (or `deadline`)
    /// before the thread stops for good and sets `stopped`.
    ///
    /// # Safety
    /// `stopped` must stay valid for as long as this thread may run.
    pub(crate) unsafe fn enter(
        soft: usize,
        deadline: Instant,
        stopped: *const AtomicBool,
    ) -> Scope {
        let soft = isize::try_from(soft).unwrap_or(isize::MAX / 2);
        let state = State {
            held: 0,
            soft,
            hard: soft.saturating_mul(2),
            deadline,
            over: false,
            stopped,
        };
        SCOPE.with(|c| c.set(Some(state)));
        Scope(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|c| c.set(None));
    }
}

/// Whether the current thread's render has passed its soft limit.
pub(crate) fn over_budget() -> bool {
    SCOPE
        .try_with(|c| c.get().is_some_and(|s| s.over))
        .unwrap_or(false)
}
