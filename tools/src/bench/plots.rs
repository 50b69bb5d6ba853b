//! The report's PNG plots: the sweep's staleness, latency and admitted writes against offered
//! load with its latency CDF, and the overload benchmark's goodput.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::overload::OverloadReport;
use super::stats::mmm;
use super::sweep::LevelRun;

/// Registers a TrueType font for the plots' text (plotters draws text with ab_glyph, pure
/// Rust, so the build needs no fontconfig; a font file must exist at run time).
fn register_font() -> Result<()> {
    const CANDIDATES: [&str; 4] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = std::env::var("LIKES_PLOT_FONT")
        .ok()
        .into_iter()
        .chain(CANDIDATES.iter().map(|s| s.to_string()))
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            anyhow!(
                "the plots need a TrueType font: install fonts-dejavu-core or set LIKES_PLOT_FONT"
            )
        })?;
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(&path)
            .map_err(|e| anyhow!(format!("{path}: {e}")))?
            .into_boxed_slice(),
    );
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!(format!("{path} is not a usable TrueType font")))?;
    Ok(())
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!(format!("drawing a plot: {e:?}"))
}

/// Median points of a figure against offered load, with the min–max as a band of dots.
fn line_plot(
    path: &Path,
    title: &str,
    y_label: &str,
    sweep: &[Vec<LevelRun>],
    f: fn(&LevelRun) -> f64,
    diagonal: bool,
) -> Result<()> {
    let pts: Vec<(f64, (f64, f64, f64))> = sweep
        .iter()
        .filter_map(|runs| Some((runs.first()?.offered_per_s, mmm(runs.iter().map(f)))))
        .collect();
    let x_max = pts.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let y_max = pts
        .iter()
        .map(|p| p.1 .2)
        .filter(|v| v.is_finite())
        .fold(if diagonal { x_max } else { 0.0 }, f64::max)
        .max(1e-3)
        * 1.1;
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("offered writes/s")
        .y_desc(y_label)
        .draw()
        .map_err(plot_err)?;
    if diagonal {
        chart
            .draw_series(LineSeries::new(
                [(0.0, 0.0), (x_max, x_max)],
                &RGBColor(180, 180, 180),
            ))
            .map_err(plot_err)?
            .label("achieved = offered")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RGBColor(180, 180, 180)));
    }
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.1 .0)),
            BLUE.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label("median")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(pts.iter().flat_map(|p| {
            [p.1 .1, p.1 .2]
                .into_iter()
                .filter(|v| v.is_finite())
                .map(move |v| Circle::new((p.0, v), 3, RED.filled()))
        }))
        .map_err(plot_err)?
        .label("min / max")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, RED.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

pub(super) fn sweep_plots(dir: &Path, sweep: &[Vec<LevelRun>]) -> Result<()> {
    register_font()?;
    line_plot(
        &dir.join("sweep-throughput.png"),
        "Admitted vs offered writes/s (whole system, admission on)",
        "admitted writes/s",
        sweep,
        |r| r.admitted_per_s,
        true,
    )?;
    line_plot(
        &dir.join("sweep-staleness.png"),
        "Staleness p99 at the sink vs offered load",
        "staleness p99, s",
        sweep,
        |r| r.staleness_p99_s,
        false,
    )?;
    line_plot(
        &dir.join("sweep-latency.png"),
        "Admitted writes' p99 at the client vs offered load",
        "admitted p99, ms",
        sweep,
        |r| r.client_p99_ms,
        false,
    )?;
    // The latency CDF of each level's median run (by p99).
    let cdf_path = dir.join("sweep-latency-cdf.png");
    let root = BitMapBackend::new(&cdf_path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let x_max = sweep
        .iter()
        .flat_map(|runs| runs.iter().flat_map(|r| r.cdf.iter().map(|p| p.0)))
        .fold(1.0, f64::max)
        .max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Admitted writes' latency CDF by offered load (log scale)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((0.1..x_max * 1.2).log_scale(), 0.0..1.0)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("latency from the scheduled send, ms")
        .y_desc("share of requests")
        .draw()
        .map_err(plot_err)?;
    for (k, runs) in sweep.iter().enumerate() {
        let mut sorted: Vec<&LevelRun> = runs.iter().collect();
        sorted.sort_by(|a, b| a.client_p99_ms.total_cmp(&b.client_p99_ms));
        let Some(run) = sorted.get(sorted.len() / 2) else {
            continue;
        };
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(
                run.cdf.iter().map(|&(ms, q)| (ms.max(0.1), q)),
                color.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!("{:.0}/s", run.offered_per_s))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// The overload plot: goodput (left axis, in capacities) and the accepted writes' p99 at the
/// server (right axis, ms) against the offered load in capacities; medians as lines, each
/// round as a dot, the goals as grey lines.
pub(super) fn overload_plot(path: &Path, report: &OverloadReport) -> Result<()> {
    register_font()?;
    let levels = super::overload::FACTORS;
    let per_level = |f: fn(f64, &super::overload::Level) -> f64| -> Vec<(f64, Vec<f64>)> {
        levels
            .iter()
            .enumerate()
            .map(|(k, x)| {
                let ys = report
                    .rounds
                    .iter()
                    .filter_map(|r| r.levels.get(k).map(|l| f(r.capacity_per_s, l)))
                    .filter(|v| v.is_finite())
                    .collect();
                (*x, ys)
            })
            .collect()
    };
    let goodput = per_level(|cap, l| l.goodput_per_s / cap);
    let p99 = per_level(|_, l| l.accepted_server_p99_ms);
    let top = |pts: &[(f64, Vec<f64>)], floor: f64| {
        pts.iter()
            .flat_map(|p| p.1.iter().copied())
            .fold(floor, f64::max)
            * 1.15
    };
    let x_max = levels.iter().copied().fold(1.0, f64::max) + 0.5;
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Overload: goodput and accepted p99 vs offered load",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .right_y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, 0.0..top(&goodput, 1.0))
        .map_err(plot_err)?
        .set_secondary_coord(0.0..x_max, 0.0..top(&p99, 150.0));
    chart
        .configure_mesh()
        .x_desc("offered writes, in capacities")
        .y_desc("goodput, in capacities")
        .draw()
        .map_err(plot_err)?;
    chart
        .configure_secondary_axes()
        .y_desc("accepted writes' p99 at the server, ms")
        .draw()
        .map_err(plot_err)?;
    let grey = RGBColor(170, 170, 170);
    chart
        .draw_series(LineSeries::new([(0.0, 0.9), (x_max, 0.9)], grey))
        .map_err(plot_err)?
        .label("goals: goodput 0.9, p99 150 ms")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey));
    chart
        .draw_secondary_series(LineSeries::new([(0.0, 150.0), (x_max, 150.0)], grey))
        .map_err(plot_err)?;
    let median = |ys: &[f64]| mmm(ys.iter().copied()).0;
    chart
        .draw_series(LineSeries::new(
            goodput.iter().map(|p| (p.0, median(&p.1))),
            BLUE.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label("goodput (median; dots: rounds)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(goodput.iter().flat_map(|p| {
            p.1.iter()
                .map(move |v| Circle::new((p.0, *v), 3, BLUE.filled()))
        }))
        .map_err(plot_err)?;
    chart
        .draw_secondary_series(LineSeries::new(
            p99.iter().map(|p| (p.0, median(&p.1))),
            RED.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label("accepted p99, ms (right axis)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .draw_secondary_series(p99.iter().flat_map(|p| {
            p.1.iter()
                .map(move |v| Circle::new((p.0, *v), 3, RED.filled()))
        }))
        .map_err(plot_err)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
