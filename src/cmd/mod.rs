//! The subcommands of the `likes` binary that are not operations jobs: the schema and the
//! topics, the effective configuration, a dev token, and the long-running stages. Each owns
//! its flags (`Args`) and its work, and returns what it prints ([`crate::ops::Done`]), so
//! tests call the same code and assert on the report; `main` only dispatches.
//! (The demo, chaos runs, benchmarks and the load generator are tooling: `tools/`.)

pub mod config;
pub mod migrate;
pub mod stages;
pub mod token;
pub mod topics;
