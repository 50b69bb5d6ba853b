//! What the two stages' consumers share: the consumer itself, subscribed under the stage's
//! group as a static member; its rebalance events, kept in the order they happened; and the
//! committed offsets of the partitions newly assigned, where each stage resumes.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use tracing::{info, warn};

use super::{client_error, librdkafka_log, record_lag, stage_consumer_config};
use crate::config::Settings;
use crate::error::Result;

/// One rebalance event: partitions assigned or revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Assign(Vec<i32>),
    Revoke(Vec<i32>),
}

/// Rebalance events, in the order they happened, for the stage loop to act on between
/// batches (callbacks run inside `poll`, when no batch is in flight). Order matters: two
/// generations completing inside one poll (revoke all, assign A, revoke A, assign B) must
/// leave the stage owning B, not A and B.
#[derive(Default)]
pub struct Assignments {
    changes: Mutex<Vec<Change>>,
}

impl Assignments {
    /// Takes the events since the last take, oldest first.
    pub fn take(&self) -> Vec<Change> {
        std::mem::take(&mut *self.changes.lock().unwrap())
    }

    /// True when no rebalance happened since the last take.
    pub fn is_empty(&self) -> bool {
        self.changes.lock().unwrap().is_empty()
    }

    fn push(&self, change: Change) {
        self.changes.lock().unwrap().push(change);
    }
}

/// Applies rebalance events in order: `revoke` is called for every revoked partition, and
/// the partitions assigned and not revoked again afterwards are returned, to be taken up.
pub fn newly_assigned(changes: Vec<Change>, mut revoke: impl FnMut(i32)) -> Vec<i32> {
    let mut assigned: Vec<i32> = Vec::new();
    for c in changes {
        match c {
            Change::Assign(ps) => {
                for p in ps {
                    if !assigned.contains(&p) {
                        assigned.push(p);
                    }
                }
            }
            Change::Revoke(ps) => {
                for p in ps {
                    revoke(p);
                    assigned.retain(|&q| q != p);
                }
            }
        }
    }
    assigned
}

/// The consumer context of a stage: records rebalances and publishes consumer lag.
pub struct StageContext {
    pub stage: &'static str,
    pub assignments: Arc<Assignments>,
    /// Fetch positions librdkafka reset because the committed offset was out of range.
    pub offset_resets: Arc<std::sync::atomic::AtomicU64>,
}

impl ClientContext for StageContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        record_lag(self.stage, &statistics);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        // librdkafka resets a fetch position that is out of range (records deleted by
        // retention before the stage read them, or a recreated topic) to the earliest
        // record, and says so only in a warning. Records were skipped: make it loud, and
        // count it for an alert.
        let serious = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if fac == "OFFSET" && message.contains("offset reset") && serious {
            metrics::counter!(crate::runtime::metrics::OFFSET_RESETS, "stage" => self.stage)
                .increment(1);
            self.offset_resets
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(stage = self.stage, detail = message,
                "committed offset out of range: the stage jumped to the earliest record, and the records in between were never read (counts may be short; reconcile the affected items)");
            return;
        }
        librdkafka_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(error, reason);
    }
}

impl ConsumerContext for StageContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let parts = |tpl: &TopicPartitionList| -> Vec<i32> {
            tpl.elements().iter().map(|e| e.partition()).collect()
        };
        match rebalance {
            Rebalance::Assign(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "assigned");
                self.assignments.push(Change::Assign(parts(tpl)));
            }
            Rebalance::Revoke(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "revoked");
                self.assignments.push(Change::Revoke(parts(tpl)));
            }
            Rebalance::Error(e) => warn!(stage = self.stage, error = %e, "rebalance error"),
        }
    }
}

/// A stage's input: its consumer, subscribed to `topic`, and the rebalance events its
/// context records.
pub struct StageConsumer {
    pub consumer: BaseConsumer<StageContext>,
    pub assignments: Arc<Assignments>,
    pub topic: String,
    timeout: Duration,
}

impl StageConsumer {
    /// Creates the consumer of `stage` (a static member `member` of `group`) and subscribes
    /// it to `topic`. `offset_resets` counts fetch positions librdkafka reset.
    pub fn subscribe(
        settings: &Settings,
        stage: &'static str,
        (group, member): (&str, &str),
        topic: String,
        offset_resets: Arc<AtomicU64>,
    ) -> Result<Self> {
        let assignments = Arc::new(Assignments::default());
        let consumer: BaseConsumer<StageContext> =
            stage_consumer_config(&settings.kafka, group, member).create_with_context(
                StageContext {
                    stage,
                    assignments: assignments.clone(),
                    offset_resets,
                },
            )?;
        consumer.subscribe(&[&topic])?;
        Ok(Self {
            consumer,
            assignments,
            topic,
            timeout: settings.kafka.request_timeout,
        })
    }

    /// Applies the rebalance events since the last call in order (`revoke` for each revoked
    /// partition) and returns the partitions newly assigned with their committed positions.
    /// Blocks on the group coordinator.
    pub fn take_assigned(&self, revoke: impl FnMut(i32)) -> Result<Vec<super::group::Position>> {
        let assigned = newly_assigned(self.assignments.take(), revoke);
        if assigned.is_empty() {
            return Ok(Vec::new());
        }
        super::group::committed(&self.consumer, &self.topic, &assigned, self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalance_events_apply_in_order() {
        // Two generations inside one poll: the stage ends owning the second's partitions,
        // and every partition it held is revoked first.
        let mut revoked = Vec::new();
        let take = newly_assigned(
            vec![
                Change::Revoke(vec![0, 1]),
                Change::Assign(vec![0, 1, 2]),
                Change::Revoke(vec![0, 1, 2]),
                Change::Assign(vec![2, 3]),
            ],
            |p| revoked.push(p),
        );
        assert_eq!(take, vec![2, 3]);
        assert_eq!(revoked, vec![0, 1, 0, 1, 2]);
        // Unordered lists (revokes, then assigns) would have taken up 0 and 1 as well.
    }
}
