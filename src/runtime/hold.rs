//! Fail points a test holds (docs/testing.md, "Fail points"), in async code.
//!
//! A test holds a moment by blocking the thread that reached it. On a runtime worker that is
//! a trap: the task in that worker's LIFO slot is not stolen by the others, and it may be the
//! CQL connection's or the very task the test waits on; a held batchGet failed 1 run in 6 that
//! way. Evaluated here, the point blocks a thread of the blocking pool instead.

/// Evaluates fail point `name` off the runtime's workers; nothing without the feature, and
/// no hop to the blocking pool unless a test configured the point (the write path passes
/// here on every compare-and-set of a debug build).
pub async fn point(name: &'static str) {
    #[cfg(feature = "failpoints")]
    if fail::list().iter().any(|(n, _)| n == name) {
        let _ = tokio::task::spawn_blocking(move || fail::fail_point!(name)).await;
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
