//! One module per subcommand of the `likes` binary. Each exposes `run`, returning a report
//! that `main` prints, so tests can call the same code and assert on the report.
//! (The demo, chaos runs, benchmarks and the load generator are tooling: `tools/`.)

pub mod migrate;
pub mod stages;
pub mod topics;
