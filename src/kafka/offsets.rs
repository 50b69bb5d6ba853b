//! Every read of a log's offsets, typed: a partition's extent (first retained offset and
//! end), the offset of a time, a consumer's position, and a bounded read of a range. The
//! jobs (the cut, replay, rebuild, the recount queue) and the stages' starts all need them;
//! each once had its own `TopicPartitionList` code, and the same "an end may hold only a
//! transaction marker" rule was written twice. Committed positions and their metadata are
//! `group`'s.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};

/// A partition's log: the first offset retention left and the end (the high watermark: the
/// next offset to be written; under transactions, possibly a commit marker's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    pub partition: i32,
    pub low: i64,
    pub high: i64,
}

/// Where a consumer starts reading a partition. Its Debug is in stage 1's restore log line
/// (`start=Offset(453)` / `start=Beginning`), which operators and a test read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Offset(i64),
    /// The first retained record.
    Beginning,
}

/// The partitions of `topic`, in order; a topic the cluster does not know is an error that
/// says which command creates it.
pub fn partitions<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>> {
    let md = c.fetch_metadata(Some(topic), timeout)?;
    let mut out: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if out.is_empty() {
        return Err(Error::Topic {
            topic: topic.to_string(),
            reason: "does not exist (run `likes topics`)".into(),
        });
    }
    out.sort();
    Ok(out)
}

/// One partition's extent.
pub fn extent<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<Extent> {
    let (low, high) = c.fetch_watermarks(topic, partition, timeout)?;
    Ok(Extent {
        partition,
        low,
        high,
    })
}

/// Every partition's extent of `topic`, in partition order.
pub fn extents<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<Extent>> {
    partitions(c, topic, timeout)?
        .into_iter()
        .map(|p| extent(c, topic, p, timeout))
        .collect()
}

/// Per partition, the offset of the first record at or after `ms` (log time), or None when
/// the partition has no record that late.
pub fn at_time<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    partitions: &[i32],
    ms: i64,
    timeout: Duration,
) -> Result<Vec<(i32, Option<i64>)>> {
    let mut q = TopicPartitionList::new();
    for &p in partitions {
        q.add_partition_offset(topic, p, Offset::Offset(ms))?;
    }
    let found = c.offsets_for_times(q, timeout)?;
    Ok(partitions
        .iter()
        .map(|&p| {
            let o = match found.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            (p, o)
        })
        .collect())
}

/// Assigns the consumer `starts` of `topic` (replacing its assignment).
pub fn assign<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    starts: &[(i32, Start)],
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for &(p, s) in starts {
        let o = match s {
            Start::Offset(o) => Offset::Offset(o),
            Start::Beginning => Offset::Beginning,
        };
        tpl.add_partition_offset(topic, p, o)?;
    }
    c.assign(&tpl)?;
    Ok(())
}

/// Moves an assigned partition's fetch position to `offset` (a batch to read again).
pub fn seek<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> Result<()> {
    c.seek(topic, partition, Offset::Offset(offset), timeout)?;
    Ok(())
}

/// The consumer's position on an assigned partition: the offset it reads next (None before
/// its first fetch).
pub fn position<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>> {
    Ok(
        match c
            .position()?
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        },
    )
}

/// Reads partition `p` of `topic` from `from` up to `high` (exclusive), feeding each message
/// to `f` until it returns false. A broker restarting is waited out (bounded by four request
/// timeouts); the end is reached when the position passes `high` even with no record there
/// (transaction markers take offsets too). Returns the offset after the last record fed.
/// Blocks; leaves the consumer unassigned.
pub fn read_range<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    p: i32,
    from: i64,
    high: i64,
    timeout: Duration,
    mut f: impl FnMut(&BorrowedMessage<'_>) -> Result<bool>,
) -> Result<i64> {
    if from >= high {
        return Ok(from);
    }
    assign(c, topic, &[(p, Start::Offset(from))])?;
    let deadline = Instant::now() + timeout * 4;
    let mut next = from;
    loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                next = m.offset() + 1;
                if !f(&m)? || next >= high {
                    break;
                }
            }
            Some(Err(e)) => {
                // A broker restarting (now, or during an earlier wait: the client reports it
                // on its next poll) is waited out; the deadline bounds it.
                let e = Error::from(e);
                if !e.is_retryable() {
                    return Err(e);
                }
                tracing::warn!(error = %e, "reading {topic}: the broker is away; waiting");
            }
            None => {
                if position(c, topic, p)?.is_some_and(|o| o >= high) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::Timeout(
                        timeout * 4,
                        format!("reading {topic} partition {p} up to offset {high}"),
                    ));
                }
            }
        }
    }
    c.unassign()?;
    Ok(next)
}
