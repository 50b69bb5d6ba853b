//! `likes-tools bench`: the benchmarks, each on its own topics and keyspace.
//!
//! - [`topology`]: events through both stages against a plain consumer of the same topic.
//! - [`api`]: the API over loopback against the write path in process and a bare LWT.
//! - [`report`]: all of them plus a sweep of offered load, written to `bench/report.md`
//!   with [`plots`].

pub mod api;
pub mod gen;
mod plots;
pub mod report;
pub mod scrape;
pub mod topology;
