//! Home regions (docs/multi-region.md): which region writes an item, as this process last read
//! the range table, and whether that read is still young enough to write by.
//!
//! A writer may start a write only while its view is younger than `region.lease`, counted from
//! when it sent the read, on this host's monotonic clock. A move waits out the lease, the
//! write deadline and one CQL timeout after its bump commits, so by the time the new home
//! writes, no write the old home started on its old view is still running. No two hosts'
//! clocks are compared.

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use tracing::warn;

use scylla::client::session::Session;

use crate::config::{RegionSettings, Settings};
use crate::error::{Error, Result};
use crate::hash;
use crate::records::Home;
use crate::store::ranges::{RangeRow, Ranges};

/// The range of an item, among `ranges` (the count `likes region init` wrote).
pub fn range_of(item: &str, ranges: usize) -> i32 {
    hash::partition_for(item.as_bytes(), ranges as u32) as i32
}

/// Where this region stands for one item's write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This region is the home: write, at this epoch, stamped no earlier than when the
    /// range came home here.
    Here(Home),
    /// Another region is the home.
    Elsewhere { range: i32, home: String },
    /// No write may start: the view is too old, or the range is moving here.
    Closed(String),
}

struct View {
    sent: Instant,
    rows: Vec<RangeRow>,
}

/// This process's view of the range table, read again every `region.refresh`.
#[derive(Clone)]
pub struct Routes {
    region: String,
    lease: Duration,
    view: Arc<RwLock<View>>,
}

impl Routes {
    /// Reads the table once (a region with no table yet is refused: `likes region init`
    /// first), then keeps reading it. The reader holds only a weak handle and ends with the
    /// last clone of these routes.
    pub async fn start(
        ranges: Arc<Ranges>,
        settings: &RegionSettings,
        region: &str,
    ) -> Result<Self> {
        let sent = Instant::now();
        let expected = settings.ranges as usize;
        let rows = checked(ranges.all().await?, expected)?;
        if !rows.iter().any(|r| r.home == region)
            && !rows
                .iter()
                .any(|r| r.moving_from.as_deref() == Some(region))
        {
            warn!(
                region,
                "this region is home to no range: every write will be refused here"
            );
        }
        publish(&rows);
        let routes = Self {
            region: region.to_string(),
            lease: settings.lease,
            view: Arc::new(RwLock::new(View { sent, rows })),
        };
        tokio::spawn(refresh(
            Arc::downgrade(&routes.view),
            ranges,
            settings.refresh,
            expected,
        ));
        Ok(routes)
    }

    /// The routes of a process that writes shared rows (a writer, the relay, stage 2, the
    /// operations jobs): started when `region.name` is set. Without it, a keyspace with home
    /// regions is refused: such a process would touch every item, its home or not.
    pub async fn for_process(session: &Arc<Session>, settings: &Settings) -> Result<Option<Self>> {
        let ranges = Ranges::prepare(
            session.clone(),
            &settings.cql.keyspace,
            settings.cql.replication.class,
        )
        .await?;
        match &settings.region.name {
            Some(region) => {
                refuse_a_longer_fence(session, settings).await?;
                Ok(Some(
                    Self::start(Arc::new(ranges), &settings.region, region).await?,
                ))
            }
            None => {
                if !ranges.all().await?.is_empty() {
                    return Err(Error::Config(
                        "this keyspace has home regions (`likes region init` ran): set region.name \
                         to this process's region"
                            .into(),
                    ));
                }
                publish_none();
                Ok(None)
            }
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Where a write of `item` may go, now.
    pub fn route(&self, item: &str) -> Route {
        let view = self.view.read().unwrap_or_else(|e| e.into_inner());
        let age = view.sent.elapsed();
        if age >= self.lease {
            return Route::Closed(format!(
                "this region's view of the range table is {age:.1?} old, past its lease of {:?}: \
                 the database has not answered the reads since",
                self.lease
            ));
        }
        let row = &view.rows[range_of(item, view.rows.len()) as usize];
        if row.home != self.region {
            return Route::Elsewhere {
                range: row.range,
                home: row.home.clone(),
            };
        }
        match &row.moving_from {
            Some(from) => Route::Closed(format!(
                "range {} is moving here from {from} (epoch {}); its writes start when the move settles",
                row.range, row.epoch
            )),
            None => Route::Here(Home {
                epoch: row.epoch,
                since_ms: row.home_since.unwrap_or(0),
            }),
        }
    }
}

/// How long a move waits after its bump before the new home may write: a writer's lease,
/// then its write's deadline, then one CQL timeout (a compare-and-set abandoned at its
/// deadline may still run that long).
pub fn fence(settings: &Settings) -> Duration {
    settings.region.lease + settings.api.write_deadline + settings.cql.request_timeout
}

/// A move waits the fence recorded at `likes region init`. A process whose lease, write
/// deadline and CQL timeout add up to more could still be writing when the new home starts,
/// so it is refused at start.
pub async fn refuse_a_longer_fence(session: &Session, settings: &Settings) -> Result<()> {
    let own = fence(settings);
    let recorded = crate::store::recorded::region_fence(session, &settings.cql.keyspace).await?;
    match recorded {
        Some(ms) if (own.as_millis() as i64) > ms => Err(Error::Config(format!(
            "region.lease + api.write_deadline + cql.request_timeout = {own:?} is longer than the \
             fence a move waits ({ms} ms, recorded by `likes region init`): a move would not wait \
             out this process's writes. Shorten them, or run `likes region init` with this \
             configuration to lengthen the fence"
        ))),
        _ => Ok(()),
    }
}

/// The move gauges, from each read of the table: how many ranges are moving and how long
/// the oldest move has been under way. A move that stays between its bump and its settle is
/// `LikesRegionMoveStuck` (k8s/components/monitoring/prometheusrule.yaml).
fn publish(rows: &[RangeRow]) {
    let moving: Vec<&RangeRow> = rows.iter().filter(|r| r.moving_from.is_some()).collect();
    metrics::gauge!("likes_region_ranges_moving").set(moving.len() as f64);
    let now = crate::runtime::clock::now_ms();
    let oldest = moving
        .iter()
        .filter_map(|r| r.moved_at)
        .map(|t| (now - t).max(0))
        .max()
        .unwrap_or(0);
    metrics::gauge!("likes_region_move_oldest_seconds").set(oldest as f64 / 1000.0);
}

/// Both move gauges at zero, for a process with no region (so every process exports them).
pub fn publish_none() {
    publish(&[]);
}

/// The ranges as read, refused unless they are exactly 0..n with n this process's
/// `region.ranges` (a half-written init, or a writer configured for another split).
fn checked(rows: Vec<RangeRow>, n: usize) -> Result<Vec<RangeRow>> {
    if rows.is_empty() {
        return Err(Error::Config(
            "region.name is set but the range table is empty: run `likes region init --home <region>` first".into(),
        ));
    }
    if rows.len() != n || rows.iter().enumerate().any(|(i, r)| r.range != i as i32) {
        return Err(Error::Config(format!(
            "the range table holds {} ranges, and this process expects 0..{n} (region.ranges): \
             run `likes region init` again to finish it, or set region.ranges to the table's count",
            rows.len()
        )));
    }
    Ok(rows)
}

async fn refresh(view: Weak<RwLock<View>>, ranges: Arc<Ranges>, every: Duration, n: usize) {
    loop {
        tokio::time::sleep(every).await;
        if view.strong_count() == 0 {
            return;
        }
        let sent = Instant::now();
        match ranges.all().await.and_then(|rows| checked(rows, n)) {
            Ok(rows) => {
                publish(&rows);
                let Some(view) = view.upgrade() else { return };
                *view.write().unwrap_or_else(|e| e.into_inner()) = View { sent, rows };
            }
            // The old view stays until its lease runs out; writes then fail closed.
            Err(e) => {
                warn!(error = %e, "reading the range table failed; keeping the last view until its lease ends")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(rows: Vec<RangeRow>, age: Duration) -> Routes {
        Routes {
            region: "a".into(),
            lease: Duration::from_secs(3),
            view: Arc::new(RwLock::new(View {
                sent: Instant::now() - age,
                rows,
            })),
        }
    }

    fn row(range: i32, home: &str, moving_from: Option<&str>) -> RangeRow {
        RangeRow {
            range,
            home: home.into(),
            epoch: 7,
            moving_from: moving_from.map(Into::into),
            moved_at: None,
            home_since: None,
            recount_due: false,
        }
    }

    #[test]
    fn a_write_goes_home_only_while_the_view_is_within_its_lease() {
        let item = "item-1";
        let r = range_of(item, 2);
        let mut rows = vec![row(0, "b", None), row(1, "b", None)];
        rows[r as usize] = row(r, "a", None);
        assert_eq!(
            routes(rows.clone(), Duration::ZERO).route(item),
            Route::Here(Home {
                epoch: 7,
                since_ms: 0
            })
        );
        assert!(matches!(
            routes(rows.clone(), Duration::from_secs(3)).route(item),
            Route::Closed(_)
        ));
        rows[r as usize] = row(r, "b", None);
        assert_eq!(
            routes(rows, Duration::ZERO).route(item),
            Route::Elsewhere {
                range: r,
                home: "b".into()
            }
        );
    }

    #[test]
    fn neither_side_writes_a_range_while_it_moves() {
        let rows = vec![row(0, "a", Some("b"))];
        assert!(
            matches!(routes(rows, Duration::ZERO).route("x"), Route::Closed(m) if m.contains("moving here from b"))
        );
        let mut old = routes(vec![row(0, "a", Some("b"))], Duration::ZERO);
        old.region = "b".into();
        assert_eq!(
            old.route("x"),
            Route::Elsewhere {
                range: 0,
                home: "a".into()
            }
        );
    }

    #[test]
    fn a_half_written_table_is_refused() {
        assert!(checked(vec![], 2).is_err());
        assert!(checked(vec![row(0, "a", None), row(2, "a", None)], 2).is_err());
        assert!(checked(vec![row(0, "a", None)], 2).is_err(), "half an init");
        assert!(checked(vec![row(0, "a", None), row(1, "a", None)], 2).is_ok());
    }
}
