//! One module per subcommand of the `likes` binary. Each exposes `run`, returning a report
//! that `main` prints, so tests can call the same code and assert on the report.

pub mod bench;
pub mod bench_api;
pub mod bench_report;
pub mod chaos;
pub mod demo;
pub mod loadgen;
pub mod migrate;
pub mod replay;
pub mod stages;
pub mod topics;

/// The folder of `make up`'s data, logs and pid files, found as stack/stack.sh finds it.
pub fn stack_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    std::env::var_os("LIKES_STACK_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("LIKES_CACHE").map(|c| PathBuf::from(c).join("stack")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/likes/stack")))
}
