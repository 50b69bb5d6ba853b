//! Stage 1's local state in RocksDB: per edge the last counted (op_id, state, event time),
//! and per input partition the offset the state reflects.
//!
//! Invariant: after recovery, the state of a partition equals what the changelog holds at its
//! committed position. The stage writes state only after its Kafka transaction committed, in
//! one WriteBatch with the partition's mark (offset, emitted-up-to, transaction token); local
//! state is trusted only when its mark names the transaction that Kafka's committed offset
//! names, and otherwise (a crash between the commit and the write, a lost disk, another
//! instance owning the partition meanwhile, a reset) it is rebuilt from the changelog topic,
//! which the same transactions wrote. See `super::recovery`.
//!
//! Keys: `e<item>\0<user>` for edges, `o<partition:i32 BE>` for partition marks,
//! `r<partition:i32 BE>` for how far its changelog has been merged in. Edges expire
//! `horizon` after their event time: filtered on read, removed by a compaction filter.

use std::path::Path;

use rocksdb::compaction_filter::Decision;
use rocksdb::{BlockBasedOptions, Cache, Options, WriteBatch, WriteOptions, DB};

use super::rule::{expired, EdgeVersion};

/// How long past its horizon compaction keeps an edge: far longer than any turn takes, so
/// no turn's clock (read once, at its start) still sees a removed edge as live.
pub const COMPACTION_GRACE_MS: i64 = 3_600_000;
use crate::error::{Error, Result};
use crate::runtime::clock::now_ms;

/// The key of an edge in RocksDB and on the changelog topic.
pub fn edge_key(item_id: &str, user_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + item_id.len() + user_id.len());
    k.push(b'e');
    k.extend_from_slice(item_id.as_bytes());
    k.push(0);
    k.extend_from_slice(user_id.as_bytes());
    k
}

fn offset_key(partition: i32) -> [u8; 5] {
    let p = partition.to_be_bytes();
    [b'o', p[0], p[1], p[2], p[3]]
}

fn restored_key(partition: i32) -> [u8; 5] {
    let p = partition.to_be_bytes();
    [b'r', p[0], p[1], p[2], p[3]]
}

/// How far a partition's changelog has been merged into this store: the next changelog
/// offset to read, and the highest emitted-up-to marker among the records before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub next: i64,
    pub marker: Option<i64>,
}

/// The key of a partition's emitted-up-to marker on the changelog topic (edge keys start
/// with `e`, so no edge can collide with it).
pub const EMITTED_KEY: &[u8] = b"x";

/// What a partition's local state says of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionMark {
    /// The input offset the state reflects (the next record to read).
    pub offset: i64,
    /// Deltas were emitted for every input record below this offset, by whichever instance
    /// owned the partition: input below it re-derives state and emits nothing.
    pub emitted: i64,
    /// The transaction that last committed this partition (also in the committed offset's
    /// metadata): local state is trusted only when the two agree.
    pub token: String,
}

impl PartitionMark {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.token.len());
        b.extend_from_slice(&self.offset.to_be_bytes());
        b.extend_from_slice(&self.emitted.to_be_bytes());
        b.extend_from_slice(self.token.as_bytes());
        b
    }

    /// Also reads the 8-byte offsets of earlier versions (emitted unknown: the offset).
    fn decode(b: &[u8]) -> Option<Self> {
        let offset = i64::from_be_bytes(b.get(..8)?.try_into().ok()?);
        let emitted = match b.get(8..16) {
            Some(e) => i64::from_be_bytes(e.try_into().ok()?),
            None => offset,
        };
        let token = String::from_utf8_lossy(b.get(16..).unwrap_or_default()).into_owned();
        Some(Self {
            offset,
            emitted,
            token,
        })
    }
}

/// 17 bytes: op_id (u64 BE), liked (u8), event time (i64 BE).
pub fn encode_version(v: &EdgeVersion) -> [u8; 17] {
    let mut b = [0u8; 17];
    b[..8].copy_from_slice(&v.op_id.to_be_bytes());
    b[8] = u8::from(v.liked);
    b[9..].copy_from_slice(&v.event_time_ms.to_be_bytes());
    b
}

pub fn decode_version(b: &[u8]) -> Option<EdgeVersion> {
    if b.len() != 17 {
        return None;
    }
    Some(EdgeVersion {
        op_id: u64::from_be_bytes(b[..8].try_into().ok()?),
        liked: b[8] == 1,
        event_time_ms: i64::from_be_bytes(b[9..].try_into().ok()?),
    })
}

/// The RocksDB-backed edge store of one stage-1 process.
pub struct EdgeStore {
    db: DB,
    horizon_ms: i64,
}

impl EdgeStore {
    /// Opens (or creates) the store in `dir`. `cache_bytes` bounds the block cache, which,
    /// with the write buffers, bounds memory whatever the number of edges.
    pub fn open(dir: &Path, horizon_ms: i64, cache_bytes: usize) -> Result<Self> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(32 << 20);
        opts.set_max_write_buffer_number(2);
        opts.set_max_open_files(256);
        // RocksDB's default, said here because the state relies on it: a damaged WAL tail is
        // cut at the last whole batch, never half-applied. The WAL replayed at open is bounded
        // by the memtables it backs (2 × 32 MiB): a flushed memtable retires its WAL.
        opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        // Said, not defaulted: RocksDB's default is Snappy where Snappy is linked, none where it
        // is not. The bundled build links no Snappy, so stage 1 always ran uncompressed; the
        // prebuilt library links it, and the default made its restores 0.76x as fast (make
        // bench-rocksdb). Uncompressed keeps every build the same store (docs/building.md).
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        // Most lookups are of edges never seen (first likes): a memtable bloom filter answers
        // those without walking the skip list.
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.05);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(cache_bytes));
        table.set_bloom_filter(10.0, false);
        // Filters and indexes stay out of the block cache: they are small (~10 bits a key) and
        // read on every lookup, and when the cache evicted them each lookup re-read and
        // re-checksummed a whole filter block (seen as most of stage 1's CPU at 3M edges).
        table.set_cache_index_and_filter_blocks(false);
        opts.set_block_based_table_factory(&table);
        // Compaction runs on its own threads and clock; a turn reads with the clock of its
        // start. Removing only what was expired `COMPACTION_GRACE_MS` ago keeps an edge until
        // no turn can still read it as live (see `rule::expired`).
        opts.set_compaction_filter("likes-edge-ttl", move |_level, key: &[u8], value: &[u8]| {
            if key.first() == Some(&b'e') {
                if let Some(v) = decode_version(value) {
                    if expired(v.event_time_ms, now_ms() - COMPACTION_GRACE_MS, horizon_ms) {
                        return Decision::Remove;
                    }
                }
            }
            Decision::Keep
        });
        let db = DB::open(&opts, dir)
            .map_err(|e| Error::State(format!("open {}: {e}", dir.display())))?;
        Ok(Self { db, horizon_ms })
    }

    /// The remembered version of an edge, unless it has expired by `now` (Unix ms; passed
    /// in because reading the clock per lookup showed up in the profile).
    pub fn get(&self, key: &[u8], now: i64) -> Result<Option<EdgeVersion>> {
        let v = self.db.get_pinned(key).map_err(Error::from)?;
        Ok(v.and_then(|b| decode_version(&b))
            .filter(|v| !expired(v.event_time_ms, now, self.horizon_ms)))
    }

    /// The input offset partition `p`'s state reflects, if any.
    pub fn offset(&self, partition: i32) -> Result<Option<i64>> {
        Ok(self.mark(partition)?.map(|m| m.offset))
    }

    /// What partition `p`'s local state says of itself, if it has any.
    pub fn mark(&self, partition: i32) -> Result<Option<PartitionMark>> {
        let v = self.db.get(offset_key(partition)).map_err(Error::from)?;
        Ok(v.and_then(|b| PartitionMark::decode(&b)))
    }

    /// Writes edges and partition marks atomically (one WriteBatch, through the WAL but not
    /// synced: see [`unsynced`]).
    pub fn commit<'a>(
        &self,
        edges: impl IntoIterator<Item = (&'a [u8], &'a EdgeVersion)>,
        marks: impl IntoIterator<Item = (i32, &'a PartitionMark)>,
    ) -> Result<()> {
        // Sorted: the memtable's skip list then inserts each key next to the last one
        // (its sequential-insert hint) instead of searching from the top every time.
        let mut edges: Vec<_> = edges.into_iter().collect();
        edges.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut batch = WriteBatch::default();
        for (k, v) in edges {
            batch.put(k, encode_version(v));
        }
        for (p, m) in marks {
            batch.put(offset_key(p), m.encode());
        }
        // Edges and the marks they reflect share every batch, so a crash that loses writes
        // loses both together; the partition's mark then disagrees with Kafka's and recovery
        // rebuilds it from the changelog. Durability lives in Kafka; the WAL (see `unsynced`)
        // only spares a killed process that rebuild.
        self.db.write_opt(batch, &unsynced()).map_err(Error::from)
    }

    /// Merges a changelog entry: keeps whichever version has the higher op_id.
    pub fn merge_restored(
        &self,
        batch: &mut WriteBatch,
        key: &[u8],
        v: &EdgeVersion,
    ) -> Result<()> {
        match self.get(key, now_ms())? {
            Some(have) if have.op_id >= v.op_id => {}
            _ => batch.put(key, encode_version(v)),
        }
        Ok(())
    }

    /// Where a restore of `partition` may resume: the store holds the merge of every
    /// changelog record before `next` (the merge keeps the highest op_id, so merging the
    /// records from `next` on gives what merging them all would).
    pub fn restored(&self, partition: i32) -> Result<Option<Restored>> {
        let v = self.db.get(restored_key(partition)).map_err(Error::from)?;
        Ok(v.and_then(|b| {
            let next = i64::from_be_bytes(b.get(..8)?.try_into().ok()?);
            let marker = i64::from_be_bytes(b.get(8..16)?.try_into().ok()?);
            Some(Restored {
                next,
                marker: (marker >= 0).then_some(marker),
            })
        }))
    }

    /// Adds a restore position to a batch of [`Self::merge_restored`] records (written with
    /// them, atomically).
    pub fn put_restored(&self, batch: &mut WriteBatch, partition: i32, r: Restored) {
        let mut v = r.next.to_be_bytes().to_vec();
        v.extend_from_slice(&r.marker.unwrap_or(-1).to_be_bytes());
        batch.put(restored_key(partition), v);
    }

    /// Forgets a restore position (the changelog it named is not this one).
    pub fn forget_restored(&self, partition: i32) -> Result<()> {
        self.db.delete(restored_key(partition)).map_err(Error::from)
    }

    /// Writes a batch built by [`Self::merge_restored`].
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        self.db.write_opt(batch, &unsynced()).map_err(Error::from)
    }

    /// RocksDB's own memory by kind (memtables, block cache, table readers' indexes and
    /// filters), in bytes: what the state costs, apart from the allocator's overhead.
    pub fn memory(&self) -> [(&'static str, u64); 3] {
        let prop = |name: &str| self.db.property_int_value(name).ok().flatten().unwrap_or(0);
        [
            ("memtables", prop("rocksdb.cur-size-all-mem-tables")),
            ("block_cache", prop("rocksdb.block-cache-usage")),
            ("table_readers", prop("rocksdb.estimate-table-readers-mem")),
        ]
    }

    /// Flushes memtables to disk (on a clean stop, so the next start need not restore).
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map_err(Error::from)
    }
}

/// Written to the WAL, not synced: a killed process's batches are in the OS's page cache
/// and the next open replays them, so after kill -9 the marks still name the committed
/// transactions and the state is kept (issue 26: without the WAL every kill -9 lost the
/// memtable, up to 64 MiB of edges, and stage 1 rebuilt from the changelog: 10 s of no
/// progress under the bench's load). A lost machine may lose the unsynced tail: the WAL
/// replays whole batches up to a point (RocksDB's point-in-time recovery), marks and edges
/// stay together, and recovery rebuilds from the changelog as before. Syncing would buy
/// nothing Kafka does not already hold.
fn unsynced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(false);
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own: two tests starting in the same millisecond once shared one,
    /// and the second failed on RocksDB's lock.
    fn tmp() -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!(
            "likes-state-{}-{}-{n}",
            std::process::id(),
            now_ms()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn versions_and_offsets_survive_reopen_and_expire() {
        let dir = tmp();
        let h = 7 * 24 * 3600 * 1000;
        let fresh = EdgeVersion {
            op_id: 3,
            liked: true,
            event_time_ms: now_ms(),
        };
        let old = EdgeVersion {
            op_id: 1,
            liked: true,
            event_time_ms: now_ms() - h - 1000,
        };
        let (k1, k2) = (edge_key("i", "u1"), edge_key("i", "u2"));
        {
            let s = EdgeStore::open(&dir, h, 8 << 20).unwrap();
            let mark = PartitionMark {
                offset: 1234,
                emitted: 2000,
                token: "t1".into(),
            };
            s.commit(
                [(k1.as_slice(), &fresh), (k2.as_slice(), &old)],
                [(4, &mark)],
            )
            .unwrap();
        }
        let s = EdgeStore::open(&dir, h, 8 << 20).unwrap();
        assert_eq!(s.get(&k1, now_ms()).unwrap(), Some(fresh));
        assert_eq!(s.get(&k2, now_ms()).unwrap(), None, "past the horizon");
        assert_eq!(s.offset(4).unwrap(), Some(1234));
        assert_eq!(s.mark(4).unwrap().unwrap().emitted, 2000);
        assert_eq!(s.mark(4).unwrap().unwrap().token, "t1");
        assert_eq!(s.offset(5).unwrap(), None);

        let mut b = WriteBatch::default();
        s.merge_restored(&mut b, &k1, &EdgeVersion { op_id: 2, ..fresh })
            .unwrap();
        s.write(b).unwrap();
        assert_eq!(
            s.get(&k1, now_ms()).unwrap().unwrap().op_id,
            3,
            "older changelog entry loses"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn compaction_never_removes_an_edge_a_turn_still_reads_as_live() {
        // A turn reads the clock once at its start; compaction runs meanwhile, later. An edge
        // whose horizon falls between the two must not vanish for that turn: the turn would
        // see "nothing remembered" while the edge is not yet expired by its clock, and count
        // an unlike as 0 instead of -1.
        let dir = tmp();
        let h = 60_000;
        let turn_now = now_ms() - 1000;
        let liked = EdgeVersion {
            op_id: 1,
            liked: true,
            event_time_ms: turn_now - h + 500,
        };
        let k = edge_key("i", "u");
        let s = EdgeStore::open(&dir, h, 8 << 20).unwrap();
        s.commit([(k.as_slice(), &liked)], [(0, &PartitionMark::default())])
            .unwrap();
        s.flush().unwrap();
        s.db.compact_range::<&[u8], &[u8]>(None, None);
        let unlike = crate::dedupe::rule::Flip {
            op_id: 2,
            liked: false,
            event_time_ms: turn_now,
            prev_event_time_ms: liked.event_time_ms,
            earlier_event_times_ms: [0; crate::records::EARLIER_FLIPS],
            home_since_ms: 0,
        };
        let remembered = s.get(&k, turn_now).unwrap();
        let verdict = crate::dedupe::rule::apply(remembered, unlike, turn_now, h);
        assert!(
            matches!(
                verdict,
                crate::dedupe::rule::Verdict::Apply { delta: -1, .. }
            ),
            "the unlike of a counted like must take it back: {verdict:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn version_encoding_round_trips() {
        let v = EdgeVersion {
            op_id: u64::MAX - 1,
            liked: false,
            event_time_ms: -5,
        };
        assert_eq!(decode_version(&encode_version(&v)), Some(v));
        assert_eq!(decode_version(b"short"), None);
    }
}
