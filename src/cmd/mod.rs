//! One module per subcommand of the `likes` binary. Each exposes `run`, returning a report
//! that `main` prints, so tests can call the same code and assert on the report.

pub mod bench;
pub mod bench_api;
pub mod bench_report;
pub mod demo;
pub mod loadgen;
pub mod migrate;
pub mod replay;
pub mod stages;
pub mod topics;
