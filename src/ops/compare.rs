//! `likes compare`: the old counter's counts (a file of item, count) against this one's at a
//! cut, for the shadow period before a cutover (docs/adoption.md, "Cutting over"). A table of
//! the items that differ, largest first, and gauges for a dashboard over days.

use std::collections::HashMap;
use std::path::Path;

use super::cut::{self, Pipeline};
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Differs {
    pub item: String,
    pub old: i64,
    pub new: i64,
}

impl Differs {
    pub fn diff(&self) -> i64 {
        self.new - self.old
    }
}

#[derive(Debug, Default)]
pub struct CompareReport {
    pub cut: i64,
    pub compared: usize,
    /// Largest |difference| first.
    pub differ: Vec<Differs>,
    /// Items of the file another region homes (compared there).
    pub elsewhere: usize,
    /// Rows shown in the table.
    pub show: usize,
}

impl CompareReport {
    pub fn abs_sum(&self) -> i64 {
        self.differ.iter().map(|d| d.diff().abs()).sum()
    }

    pub fn max_abs(&self) -> i64 {
        self.differ.first().map_or(0, |d| d.diff().abs())
    }

    /// Prometheus text format, for a textfile collector.
    pub fn gauges(&self) -> Vec<super::gauges::Gauge> {
        vec![
            (
                "likes_compare_items",
                "Items compared with the old counter",
                self.compared as i64,
            ),
            (
                "likes_compare_differing_items",
                "Items whose count differs from the old counter's",
                self.differ.len() as i64,
            ),
            (
                "likes_compare_abs_diff_sum",
                "Sum over items of |new count - old count|",
                self.abs_sum(),
            ),
            (
                "likes_compare_max_abs_diff",
                "The largest |new count - old count| of one item",
                self.max_abs(),
            ),
            (
                "likes_compare_cut_ms",
                "The cut the counts were taken at (Unix ms)",
                self.cut,
            ),
        ]
    }
}

impl std::fmt::Display for CompareReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.differ.is_empty() {
            writeln!(
                f,
                "{:<40} {:>12} {:>12} {:>10}",
                "item", "old", "new", "new-old"
            )?;
            for d in self.differ.iter().take(self.show) {
                writeln!(
                    f,
                    "{:<40} {:>12} {:>12} {:>+10}",
                    d.item,
                    d.old,
                    d.new,
                    d.diff()
                )?;
            }
            if self.differ.len() > self.show {
                writeln!(
                    f,
                    "... and {} more (--show N)",
                    self.differ.len() - self.show
                )?;
            }
        }
        write!(
            f,
            "{} items compared at cut {}: {} differ, sum of |new-old| {}, largest {}{}",
            self.compared,
            self.cut,
            self.differ.len(),
            self.abs_sum(),
            self.max_abs(),
            if self.elsewhere > 0 {
                format!(
                    "; {} items homed in another region left to it",
                    self.elsewhere
                )
            } else {
                String::new()
            }
        )
    }
}

/// The old counts: `item,count` per line (comma or tab), a header line allowed.
pub fn read_counts(path: &Path) -> Result<HashMap<String, i64>> {
    let text =
        std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(2, [',', '\t']);
        let item = parts.next().unwrap_or("").trim().trim_matches('"');
        let count = parts.next().unwrap_or("").trim().trim_matches('"');
        match count.parse::<i64>() {
            Ok(c) => {
                if out.insert(item.to_string(), c).is_some() {
                    return Err(Error::Input(format!(
                        "{} line {}: item {item:?} twice",
                        path.display(),
                        n + 1
                    )));
                }
            }
            // The first line may name the columns.
            Err(_) if n == 0 => {}
            Err(_) => {
                return Err(Error::Input(format!(
                    "{} line {}: {line:?} is not item,count",
                    path.display(),
                    n + 1
                )))
            }
        }
    }
    Ok(out)
}

pub async fn run(p: &Pipeline, old: HashMap<String, i64>, show: usize) -> Result<CompareReport> {
    let all: Vec<String> = old.keys().cloned().collect();
    let here = p.homed_here(all.clone())?;
    let k = cut::choose();
    tracing::info!(
        items = here.len(),
        cut = k,
        "compare: waiting for the pipeline to pass the cut"
    );
    p.wait_past(k, true).await?;
    let new = p.counts_at(&here, k).await?;
    let mut differ: Vec<Differs> = here
        .iter()
        .filter_map(|item| {
            let (o, n) = (old[item], new.get(item).copied().unwrap_or(0));
            (o != n).then(|| Differs {
                item: item.clone(),
                old: o,
                new: n,
            })
        })
        .collect();
    differ.sort_by(|a, b| {
        b.diff()
            .abs()
            .cmp(&a.diff().abs())
            .then(a.item.cmp(&b.item))
    });
    Ok(CompareReport {
        cut: k,
        compared: here.len(),
        differ,
        elsewhere: all.len() - here.len(),
        show,
    })
}

/// Compare the old counter's counts (a file of item,count) with this one's at a cut:
/// a table of the items that differ, largest first, and gauges.
///
/// Examples:
///   likes compare --old old-counts.csv
///   likes compare --old old-counts.csv --metrics-file /var/lib/node_exporter/likes_compare.prom
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// item,count per line (comma or tab; a header line allowed).
    #[arg(long)]
    pub old: std::path::PathBuf,
    /// Items shown in the table (the largest differences).
    #[arg(long, default_value_t = 20)]
    pub show: usize,
    #[command(flatten)]
    pub gauges: super::gauges::Outputs,
    /// Exit 1 when any item differs.
    #[arg(long)]
    pub fail_on_diff: bool,
}

/// `likes compare`.
pub async fn command(args: Args, ctx: &super::Ctx) -> Result<super::Done> {
    let counts = read_counts(&args.old)?;
    let report = super::retrying("compare", ctx.settings.ops.wait_timeout, || async {
        let p = Pipeline::connect(&ctx.settings, &ctx.topology).await?;
        run(&p, counts.clone(), args.show).await
    })
    .await?;
    let published = args.gauges.publish("likes_compare", &report.gauges()).await;
    let differ = report.differ.len();
    Ok(super::Done::report(report)
        .failing_on(published)
        .failing_if(
            args.fail_on_diff && differ > 0,
            format!("{differ} items differ from the old counter"),
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_counts_read_with_or_without_a_header_and_refuse_garbage() {
        let dir = std::env::temp_dir().join(format!("likes-cmp-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("old.csv");
        std::fs::write(&p, "item,count\ni1,5\ni2\t7\n\n").unwrap();
        let c = read_counts(&p).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c["i2"], 7);
        std::fs::write(&p, "i1,5\ni2,x\n").unwrap();
        assert!(read_counts(&p).unwrap_err().to_string().contains("line 2"));
    }

    #[test]
    fn the_report_puts_the_largest_difference_first_in_its_gauges() {
        let r = CompareReport {
            cut: 1000,
            compared: 3,
            differ: vec![
                Differs {
                    item: "a".into(),
                    old: 1,
                    new: 5,
                },
                Differs {
                    item: "b".into(),
                    old: 3,
                    new: 2,
                },
            ],
            elsewhere: 0,
            show: 20,
        };
        assert_eq!((r.abs_sum(), r.max_abs()), (5, 4));
        assert!(
            super::super::gauges::render(&r.gauges()).contains("likes_compare_differing_items 2")
        );
        assert!(r
            .to_string()
            .contains("3 items compared at cut 1000: 2 differ"));
    }
}
