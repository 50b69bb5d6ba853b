//! `likes-tools bench`: the benchmarks, each on its own topics and keyspace.
//!
//! - [`topology`]: events through both stages against the fastest plain consumer of the same
//!   topic and a Kafka Streams exactly-once peer of the same topology ([`peer`]).
//! - [`ab`]: two builds of the API side by side (ABBA), for a change to the write path.
//! - [`api`]: the API over loopback against the write path in process and a bare LWT.
//! - [`overload`]: the API at 2× and 4× its capacity under the adaptive write limit, and its
//!   writes through a broker outage ([`outage`]) and a Cassandra slowed by pauses
//!   ([`slowdown`]).
//! - [`restore`]: stage 1's restore of a large changelog against a bare read of it.
//! - [`import`]: `likes import` of a large file against bare inserts of the same rows.
//! - [`sweep`]: offered load through the whole system as deployed, ¼× to 4× capacity, each
//!   level until the pipeline has applied it, with the design's goals per level.
//! - [`report`]: all of them, written to `bench/report.md` with [`plots`].

pub mod ab;
pub mod api;
pub mod api_costs;
pub mod gen;
pub mod harness;
pub mod import;
pub mod outage;
pub mod overload;
pub mod peer;
mod plots;
pub mod recovery;
pub mod report;
pub mod restore;
pub mod scrape;
pub mod slowdown;
pub mod stats;
pub mod sweep;
pub mod topology;

/// `likes-tools bench overload`'s plot, `overload-<stamp>.png` beside the run's JSON (a
/// missing plot is a warning: the figures are in the JSON).
pub fn plot_overload(report: &overload::OverloadReport) {
    let plot = report.written.with_extension("png");
    match plots::overload_plot(&plot, report) {
        Ok(()) => eprintln!("bench overload: plot written to {}", plot.display()),
        Err(e) => eprintln!("bench overload: no plot: {e:#}"),
    }
}

/// `likes-tools bench sweep`'s files: `sweep.md` and its plots beside it (here, so the sweep
/// and the plots, which draw its levels, do not import each other).
pub fn write_sweep(
    report: &sweep::SweepReport,
    out: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let path = report.write(out)?;
    plots::sweep_plots(out, &report.levels)?;
    Ok(path)
}
