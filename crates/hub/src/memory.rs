//! A global allocator that counts live heap bytes, for the tools and tests that say what
//! a list or a peer costs in memory (`examples/list_memory.rs`, `examples/conn_memory.rs`,
//! `tests/list_memory.rs`). The figures are exact and do not depend on the machine, unlike
//! resident memory, which also counts what the allocator keeps. Install it in a binary
//! with `#[global_allocator] static A: swarmtodo_hub::memory::Counting = swarmtodo_hub::memory::Counting;`
//! and read [`live`] around what is measured; the product never installs it.
//!
//! [`limit_heap_arenas`] is what the product does set: how many arenas glibc's allocator
//! may keep.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes allocated and not yet freed, passing every call to the system
/// allocator unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only the sizes are
// counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes counted by [`Counting`] (0 when it is not the global allocator).
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Limits glibc's allocator to [`HEAP_ARENAS_MAX`](crate::limits::HEAP_ARENAS_MAX) arenas
/// (a no-op on other allocators). Call it first thing, before the threads start: an
/// arena is made for a thread that finds the others busy, and never goes.
pub fn limit_heap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let max = libc::c_int::try_from(crate::limits::HEAP_ARENAS_MAX).unwrap_or(1);
        // SAFETY: mallopt only sets a parameter of the allocator; M_ARENA_MAX is one
        // glibc knows, and any positive value is valid.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, max) };
        if ok != 1 {
            tracing::debug!("the allocator kept its arenas as they were");
        }
    }
}
