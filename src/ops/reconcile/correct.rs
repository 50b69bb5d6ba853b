//! Reconciliation: drift corrected through the pipeline, never by overwrite (docs/design.md,
//! "Corrections, erasure, replay").
//!
//! At a cut K (see `cut`) each item's difference LIKED edges − count is exact. It is sent as
//! a Correction record into `likes.deltas`, keyed by the item, so stage 2 applies it in its
//! window through the fence, serialized with the live deltas. Each correction names the last
//! correction the recount saw on the row (`after_snapshot_time_ms`) and its own cut, and
//! stage 2 applies it only while the row still has that one (the correction fence):
//!
//! - a correction sent twice (a producer retry, a re-run that sends the same record) is
//!   refused the second time, the row having moved on to its cut;
//! - a re-run after a kill waits until the pipeline has passed its own, later cut, so the
//!   first run's correction is on the row before the recount, which then finds no drift;
//! - two runs at once: the later cut's correction was computed without the earlier one, and
//!   is refused if the earlier one lands first; a correction whose cut is not after the row's
//!   last correction's is refused too (its recount could not take that later correction out
//!   of its count at the cut). Either way the refused run recounts the item at a later cut.
//!
//! A replay of `likes.deltas` re-reads a correction in its original window: the window fence
//! skips it. A correction that takes a count below zero is kept as the true sum by the sink
//! (served as 0) and counted in `likes_count_clamps_total`, which alerts.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::{info, warn};

use crate::error::Result;
use crate::ops::cut::{self, Pipeline};
use crate::records;

/// One correction and what became of it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub item: String,
    pub delta: i64,
    pub id: String,
    /// Some(true) applied, Some(false) refused by the correction fence, None not sent (dry run).
    pub applied: Option<bool>,
}

#[derive(Debug, Default)]
pub struct ReconcileReport {
    pub cuts: Vec<i64>,
    pub checked: usize,
    pub corrections: Vec<Sent>,
    /// Items still unsettled after every attempt: (item, user whose edge kept flipping), the
    /// user empty when the item's corrections were refused at every cut.
    pub in_flight: Vec<(String, String)>,
    pub dry_run: bool,
}

impl std::fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.corrections {
            let verdict = match c.applied {
                Some(true) => "applied",
                Some(false) => {
                    "refused (another correction landed first; recounted at a later cut)"
                }
                None => "not sent (--dry-run)",
            };
            writeln!(f, "{:<32} {:>+8}  {}  {verdict}", c.item, c.delta, c.id)?;
        }
        for (item, user) in &self.in_flight {
            if user.is_empty() {
                writeln!(
                    f,
                    "{item:<32} its corrections were refused at every cut (another run kept landing first); run again"
                )?;
            } else {
                writeln!(
                    f,
                    "{item:<32} in flight: {user}'s edge flipped twice since each cut; run again"
                )?;
            }
        }
        write!(
            f,
            "{} items checked at cut(s) {:?}; {} corrections{}; {} in flight",
            self.checked,
            self.cuts,
            self.corrections.len(),
            if self.dry_run {
                " (dry run: none sent)"
            } else {
                ""
            },
            self.in_flight.len()
        )
    }
}

/// Attempts per item that is in flight at a cut.
const ATTEMPTS: usize = 3;

pub async fn run(
    p: &Pipeline,
    items: Vec<String>,
    dry_run: bool,
    reason: &str,
) -> Result<ReconcileReport> {
    run_after(p, items, dry_run, reason, i64::MIN).await
}

/// [`run`] with every cut past `after` (ms): the recount queue's cuts must follow every flip
/// it read, whose time a writer's clock ahead may have put past the job's own now.
pub async fn run_after(
    p: &Pipeline,
    items: Vec<String>,
    dry_run: bool,
    reason: &str,
    after: i64,
) -> Result<ReconcileReport> {
    let mut report = ReconcileReport {
        dry_run,
        ..Default::default()
    };
    let producer: FutureProducer = crate::kafka::producer_config(&p.settings.kafka).create()?;
    let topic = p.settings.topic(&p.topology.topics.deltas.name);
    let mut todo = items;
    for attempt in 1..=ATTEMPTS {
        let k = cut::choose_after(after);
        // What the rows' correction fence records for this run: the cut, plus a
        // millisecond drawn per run, so two runs within one second do not share it.
        let tag = k + rand::random_range(1..1000);
        report.cuts.push(k);
        info!(
            cut = k,
            items = todo.len(),
            attempt,
            "reconcile: waiting for the pipeline to pass the cut"
        );
        p.wait_past(k, true).await?;
        // Fault-test hook: another run overtakes this one between its cut and its recount.
        fail::fail_point!("reconcile-after-wait");
        let views = p.items_at(&todo, k).await?;
        let mut again = Vec::new();
        let mut sent = Vec::new();
        for v in views {
            let Some(drift) = v.drift() else {
                again.push((v.item.clone(), v.recount.clone().err().unwrap_or_default()));
                continue;
            };
            report.checked += 1;
            if drift == 0 {
                continue;
            }
            let id = format!("{}@{tag}", v.item);
            let c = Sent {
                item: v.item.clone(),
                delta: -drift,
                id: id.clone(),
                applied: None,
            };
            if !dry_run {
                let correction = records::Correction {
                    id: id.clone(),
                    delta: -drift,
                    cut_ms: tag,
                    after_ms: v.row.and_then(|r| r.last_correction).unwrap_or(0),
                };
                let record = records::correction_value(&v.item, &correction, reason);
                producer
                    .send(
                        FutureRecord::to(&topic)
                            .key(v.item.as_bytes())
                            .payload(&record),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| e)?;
                info!(item = %v.item, delta = -drift, %id, count_at_cut = v.count_at_cut(), edges_at_cut = ?v.recount, "correction sent");
                fail::fail_point!("reconcile-after-send", |_| Err(
                    crate::error::Error::Injected("reconcile-after-send")
                ));
            }
            sent.push(c);
        }
        if !dry_run && !sent.is_empty() {
            // Verify: once stage 2 has passed them, each row names its correction's cut.
            p.wait_counted().await?;
            for c in &mut sent {
                let row = p.count_row(&c.item).await?;
                let applied = row.and_then(|r| r.last_correction) == Some(tag);
                if !applied {
                    // Another run's correction landed first (or one from a later cut): this
                    // recount is stale. The item is recounted at the next, later cut.
                    warn!(item = %c.item, id = %c.id, "correction refused by the correction fence; recounting the item at a later cut");
                    again.push((c.item.clone(), String::new()));
                }
                c.applied = Some(applied);
            }
        }
        report.corrections.extend(sent);
        if again.is_empty() || attempt == ATTEMPTS {
            report.in_flight = again;
            break;
        }
        info!(
            items = again.len(),
            "items in flight at the cut; trying them at a later cut"
        );
        todo = again.into_iter().map(|a| a.0).collect();
    }
    Ok(report)
}
