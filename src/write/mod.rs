//! The write path of like and unlike, shared by the API, retractions and the erase job (no
//! HTTP here: `api/` parses requests and turns [`WriteError`] into answers). It follows docs/design.md's three layers of write idempotency, in one Paxos round
//! ("One Paxos round per write"), and its outbox.
//!
//! 1. The row: one row per (item, user).
//! 2. The conditional write: the edge flips only if its state differs, by compare-and-set on
//!    the op_id the request saw; a real flip bumps op_id by one, a no-op keeps it.
//! 3. The request key: the same compare-and-set stores the key with its answer on the edge row
//!    (`recent_keys`, see [`crate::store::request_keys`]), so there is no moment where the flip applied
//!    and its answer is lost. A key the row remembers replays its answer and writes nothing (a
//!    like whose answer was lost, retried after an unlike, cannot re-like); the same key for
//!    the other operation is a 422. Concurrent requests with one key race on the CAS: one
//!    wins, the others re-read and replay its answer.
//!
//! Before the CAS an outbox entry is written (with the user's side of a like, in one batch);
//! after the event is published it is deleted, behind the answer and batched ([`clears`]).
//! A crash in between leaves the entry, and `likes relay` publishes the edge's current state.

pub mod cas_done;
pub mod clears;
pub mod erased_check;
pub mod erased_set;
pub mod spent;

use std::sync::Arc;
use std::time::Duration;

use scylla::client::session::Session;
use serde::Serialize;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::hash;
use crate::records::Home;
use crate::region::{Route, Routes};
use crate::runtime::clock::now_ms;
use crate::schema::v1::{ClientPlatform, Source};
use crate::store::edges::{Cas, Edge, EdgeRow};
use crate::store::events::Events;
use crate::store::outbox::{outbox_minute, outbox_shard};
use crate::store::request_keys::{self, Remembered};
use crate::store::Stores;
use crate::topology::Topology;

/// The answer of a write, stored under its request key and replayed verbatim.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WriteAnswer {
    pub item_id: String,
    pub user_id: String,
    pub liked: bool,
    /// Whether this request flipped the edge (false: it already was in that state).
    pub changed: bool,
    pub op_id: i64,
}

/// Why a write did not answer; each says who must act.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The request key was used on this edge for the other operation: the caller's mistake.
    #[error("this request key was used for a different request")]
    KeyReused,
    /// The account is being erased or was: its sessions write nothing more.
    #[error("the account {user} is being erased or was erased (erasure {erasure}): its sessions can no longer write")]
    Erased { user: String, erasure: String },
    /// The write may or may not have flipped the edge; the same key settles it.
    #[error("{0}; retry with the same key")]
    RetryWithSameKey(String),
    /// Another region is the item's home (docs/multi-region.md): this one does not write it.
    #[error("item {item} is in range {range}, whose home is region {home}; this is region {region}, which does not write it")]
    NotHome {
        item: String,
        range: i32,
        home: String,
        region: String,
    },
    /// This host's clock is off the database's past `cql.max_clock_skew` (cql/clock.rs): it
    /// stamps nothing until it is back; retry shortly (another pod may take it).
    #[error("this pod's clock is off: {0}")]
    ClockOff(String),
    /// No write of the item may start here now (a range moving here, or a view of the range
    /// table past its lease); retry shortly.
    #[error("writes of this item are closed here for now: {0}")]
    RangeClosed(String),
    /// A dependency (CQL, Kafka) failed; the same key settles it too.
    #[error("a dependency failed: {0}")]
    Dependency(#[from] Error),
}

impl From<scylla::errors::ExecutionError> for WriteError {
    fn from(e: scylla::errors::ExecutionError) -> Self {
        WriteError::Dependency(e.into())
    }
}

/// One like or unlike, as its sender asked it.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    pub user: &'a str,
    pub item: &'a str,
    pub liked: bool,
    /// The sender's request key (namespaced by `source` when stored: an operator's keys never
    /// meet a user's).
    pub key: &'a str,
    pub source: Source,
    pub platform: ClientPlatform,
}

impl<'a> Write<'a> {
    /// A user's request through the API, no platform said.
    pub fn by_user(user: &'a str, item: &'a str, liked: bool, key: &'a str) -> Self {
        Self {
            user,
            item,
            liked,
            key,
            source: Source::Api,
            platform: ClientPlatform::Unspecified,
        }
    }
}

/// Item and user ids: 1-128 of `[A-Za-z0-9_-:]`. `#` and `.` stay out: `#` separates the
/// bucket in event keys and `.` the fields of session tokens.
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'))
}

/// [`valid_id`] as a command-line value parser (`--user`): every command checks an id the
/// same way, with the same words.
pub fn id_arg(id: &str) -> std::result::Result<String, String> {
    if valid_id(id) {
        Ok(id.to_string())
    } else {
        Err("an id is 1-128 characters of A-Z a-z 0-9 _ - :".into())
    }
}

/// A publish error that a later publish by the relay may not meet: the broker away or slow,
/// or the producer's own queue full or timed out while it is.
/// A flip's event left to the relay: counted, and said at debug (a broker outage defers
/// every write's; the relay's backlog and its alerts are where that pages).
fn deferred(reason: &'static str, item: &str, user: &str, op_id: i64, why: &str) {
    metrics::counter!(crate::runtime::metrics::API_PUBLISHES_DEFERRED, "reason" => reason)
        .increment(1);
    tracing::debug!(%item, %user, op_id, %why, "event left to the relay");
}

fn broker_away(e: &Error) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    e.is_retryable()
        // The producer dropped with the ack still owed (the process stopping): the relay has it.
        || matches!(e, Error::Kafka(rdkafka::error::KafkaError::Canceled))
        || matches!(e, Error::Kafka(k) if matches!(
            k.rdkafka_error_code(),
            Some(C::QueueFull | C::MessageTimedOut)
        ))
}

/// What a write needs: the edge, outbox and erasure tables, and the events topic.
#[derive(Clone)]
pub struct Writer {
    store: Arc<Stores>,
    events: Events,
    buckets: u32,
    /// Bounds how long an outbox entry can belong to a request whose CAS is still to land.
    deadline: Duration,
    /// How long an event's ack may take before its publish counts as deferred to the relay
    /// (the answer never waits for it).
    publish_wait: Duration,
    /// With `region.name` set: which items this region writes (docs/multi-region.md).
    routes: Option<Routes>,
    /// The outbox entries this writer is done with, deleted in batches behind the answers.
    clears: clears::Clears,
    /// The answered writes whose events' acks are still owed (each clears its entry).
    acks: tokio_util::task::TaskTracker,
    /// Whether an account was erased, asked for many writes at once.
    erased_check: erased_check::ErasedCheck,
    /// This host's clock against the database's, checked again while the writer runs.
    clock: crate::cql::clock::ClockWatch,
    max_clock_skew: Duration,
    /// Stage 1's dedupe horizon: a flip well inside it may be published again (a duplicate
    /// stage 1 drops), an older one never.
    horizon: Duration,
    /// The relay's minimum entry age: a flip younger than this has its own entry still.
    relay_min_age: Duration,
}

impl Writer {
    /// Connects its own CQL session, stores and producer, after the start checks every writer
    /// makes (the keyspace's bucket count, this host's clock); the API and the erase job both
    /// start here.
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<(Self, Arc<Session>)> {
        let session = crate::cql::connect(&settings.cql).await?;
        crate::store::recorded::check_buckets(&session, &settings.cql.keyspace, topology).await?;
        crate::cql::clock::check(&session, settings.cql.max_clock_skew).await?;
        let store = Arc::new(Stores::prepare(&session, &settings.cql.keyspace).await?);
        store.outbox.init_floors().await?;
        let routes = Routes::for_process(&session, settings).await?;
        // Loaded before the writer exists, so before the pod serves.
        let erased = match settings.api.erased_refresh {
            d if d.is_zero() => None,
            d => Some(
                erased_set::ErasedSet::start(store.clone(), d, settings.cql.max_clock_skew).await?,
            ),
        };
        // A refusal's series exist from the start, so a rule's increase() sees the first one.
        for reason in ["not_home", "range_closed", "clock_off"] {
            metrics::counter!("likes_api_writes_refused_total", "reason" => reason).increment(0);
        }
        for reason in ["timeout", "error"] {
            metrics::counter!(crate::runtime::metrics::API_PUBLISHES_DEFERRED, "reason" => reason)
                .increment(0);
        }
        let writer = Self {
            events: Events::connect(settings, topology)?,
            buckets: topology.buckets,
            deadline: settings.api.write_deadline,
            publish_wait: settings.api.publish_wait,
            routes,
            clears: clears::Clears::spawn(store.clone()),
            acks: tokio_util::task::TaskTracker::new(),
            erased_check: erased_check::ErasedCheck::spawn(store.clone(), erased),
            clock: crate::cql::clock::ClockWatch::spawn(
                session.clone(),
                settings.cql.max_clock_skew,
                settings.cql.clock_check_every,
            ),
            max_clock_skew: settings.cql.max_clock_skew,
            horizon: topology.dedupe_ttl,
            relay_min_age: settings.api.relay_min_age,
            store,
        };
        Ok((writer, session))
    }

    /// Waits up to `within` for the acks owed to the writes answered so far, then sends the
    /// clears they queued: before a process that wrote exits, so that the relay does not
    /// publish those events again, and for whoever must find every answered write's event on
    /// the log. False if acks were still owed at `within` (their entries wait for the relay).
    pub async fn settle(&self, within: Duration) -> bool {
        self.acks.close();
        let all = tokio::time::timeout(within, self.acks.wait()).await.is_ok();
        self.acks.reopen();
        self.clears.flush().await;
        all
    }

    /// An erasure this process recorded: its writes refuse the account from now on (the
    /// other pods' sets learn it within `api.erased_refresh`).
    pub fn note_erased(&self, user: &str) {
        self.erased_check.note(user);
    }

    /// How long an event's ack may take before its publish counts as deferred.
    pub fn publish_wait(&self) -> Duration {
        self.publish_wait
    }

    pub fn store(&self) -> &Arc<Stores> {
        &self.store
    }

    pub fn events(&self) -> &Events {
        &self.events
    }

    /// This writer's view of the range table (None without home regions): the relay beside
    /// it publishes only what this region homes.
    pub fn routes(&self) -> Option<&Routes> {
        self.routes.as_ref()
    }

    /// The whole write path of one request.
    pub async fn write(&self, w: &Write<'_>) -> std::result::Result<WriteAnswer, WriteError> {
        let Write {
            user,
            item,
            liked,
            key,
            source,
            platform,
        } = *w;
        // Only the item's home region writes it, and only on a view of the range table within
        // its lease; the rest fails closed before anything is written.
        let mut home = Home::default();
        if let Some(routes) = &self.routes {
            match routes.route(item) {
                Route::Here(h) => home = h,
                Route::Elsewhere { range, home } => {
                    metrics::counter!("likes_api_writes_refused_total", "reason" => "not_home")
                        .increment(1);
                    return Err(WriteError::NotHome {
                        item: item.to_string(),
                        range,
                        home,
                        region: routes.region().to_string(),
                    });
                }
                Route::Closed(why) => {
                    metrics::counter!("likes_api_writes_refused_total", "reason" => "range_closed")
                        .increment(1);
                    return Err(WriteError::RangeClosed(why));
                }
            }
        }
        // A clock past the bound would stamp an outbox entry the relay may judge stale while
        // this request's compare-and-set is still in flight (docs/exactness.md, "The clock
        // bound"): nothing is written until it is back.
        if let Some(why) = self.clock.refusal(self.max_clock_skew) {
            metrics::counter!("likes_api_writes_refused_total", "reason" => "clock_off")
                .increment(1);
            return Err(WriteError::ClockOff(why.to_string()));
        }
        // Chaos self-test (`likes-tools chaos --api-failpoints api-lose-write=...`): answers
        // a flip it never makes, the bug the history check must report (docs/testing.md).
        fail::fail_point!("api-lose-write", |_| Ok(WriteAnswer {
            item_id: item.to_string(),
            user_id: user.to_string(),
            liked,
            changed: true,
            op_id: 1,
        }));
        // A range's flips are stamped no earlier than when it came home here: stage 1 leaves
        // the flips before that to the previous home (docs/multi-region.md).
        let now = now_ms().max(home.since_ms);
        let req = Request {
            user,
            item,
            liked,
            platform,
            key: request_keys::stored(source, key),
            bucket: hash::bucket_of(user, self.buckets) as i32,
            now,
            started: std::time::Instant::now(),
            epoch: self.routes.as_ref().map(|_| home.epoch),
            spent: spent::Spent::default(),
        };
        let s = &*self.store;
        let shard = outbox_shard(now);
        let minute = outbox_minute(now);
        let entry = format!("{:016x}", rand::random::<u64>());
        // The outbox entry and the user's side of a like go before the CAS (the erasure walk
        // may see an extra edge, never miss one), after the check that the account may still
        // write: with the pod's set of erased accounts, beside the read that aims the CAS
        // (two waits: that, then the CAS); without it, after the check and the read.
        let until_cas = async {
            if let Some(ms) = injected_delay_ms() {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            // The read that aims the compare-and-set: a like of a row already there (a like
            // again after an unlike, a second device) then sends the one statement that fits,
            // not an `INSERT` that fails and a second Paxos round (issue 57: four requests and
            // two rounds before). A keyed retry finds its key here and sends no
            // compare-and-set at all.
            let peek =
                async { Ok::<_, WriteError>(s.edges.peek_row(item, req.bucket, user).await?) };
            // One request for both: the database's cost of a write is per request as much
            // as per row (docs/design.md, "The database cost of a write").
            let put = async {
                if liked {
                    let by_user = s.edges.index_for_user_statement();
                    s.outbox
                        .put_with_user_side(by_user, (shard, minute), item, user, &entry, now)
                        .await?;
                } else {
                    s.outbox
                        .put((shard, minute), item, user, &entry, now)
                        .await?;
                }
                Ok::<_, WriteError>(())
            };
            // Sessions are stateless tokens: one can outlive its account. A user whose
            // erasure was requested writes nothing more (the erasure's own unlikes are
            // operators'). The pod's set answers for all but the accounts in it.
            if source != Source::Api || self.erased_check.known_clear(user) {
                // Nothing to wait for before writing: the entry goes beside the read.
                let (seen, ()) = tokio::try_join!(peek, put)?;
                req.spent.wait(2, 0);
                return Ok((self.cas(&req, seen).await?, true));
            }
            let refuse_erased = async {
                match self.erased_check.erased(user).await? {
                    Some(id) => Err(WriteError::Erased {
                        user: user.to_string(),
                        erasure: id,
                    }),
                    None => Ok(()),
                }
            };
            let ((), seen) = tokio::try_join!(refuse_erased, peek)?;
            req.spent.wait(2, 0);
            // A keyed retry whose key the row holds is answered from it (a key on the row was
            // written by a committed compare-and-set: final): no entry, no statement.
            let found = seen
                .as_ref()
                .and_then(|row| request_keys::lookup(&row.keys, &req.key, req.now));
            if let Some(r) = found {
                if r.liked != req.liked {
                    return Err(WriteError::KeyReused);
                }
                return Ok((Outcome::Replay(seen.map(|row| row.edge), r), false));
            }
            put.await?;
            req.spent.wait(1, 0);
            Ok((self.cas(&req, seen).await?, true))
        };
        // The deadline bounds how long this request may still send a CAS (the relay waits
        // longer than it plus one CQL timeout); a CAS already sent may land later still, which
        // the relay's row fence makes fail (docs/exactness.md, "The row fence").
        let (outcome, entry_written) = match tokio::time::timeout(self.deadline, until_cas).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(WriteError::RetryWithSameKey(format!(
                    "the write did not finish its compare-and-set within its deadline ({:?})",
                    self.deadline
                )))
            }
        };
        let answer = |r: Remembered| WriteAnswer {
            item_id: item.to_string(),
            user_id: user.to_string(),
            liked: r.liked,
            changed: r.changed,
            op_id: r.op_id,
        };
        // From here the answer is on the edge row: whatever fails, a retry replays it.
        fail::fail_point!("api-after-cas", |_| Err(WriteError::RetryWithSameKey(
            "injected: right after the compare-and-set".into()
        )));
        match outcome {
            Outcome::Replay(edge, r) => {
                req.spent.record(spent::Kind::KeyedRetry);
                // Nothing was written: the entry has nothing to stand for. The request that
                // wrote the key may have given up before its event (its answer lost) and its
                // entry be gone since: its flip goes out again.
                self.republish("replay", item, user, edge.as_ref(), source, home);
                if entry_written {
                    self.clears.clear((shard, minute), item, user, &entry);
                }
                Ok(answer(r))
            }
            Outcome::Flipped(edge, r) => {
                req.spent.record(match (liked, edge.prev_at_ms) {
                    (true, 0) => spent::Kind::FirstLike,
                    (true, _) => spent::Kind::LikeOfRow,
                    (false, _) => spent::Kind::Unlike,
                });
                // A failed publish leaves the outbox entry for the relay.
                fail::fail_point!("api-after-flip-before-produce", |_| Err(
                    WriteError::RetryWithSameKey(
                        "injected: after the flip, before the produce".into()
                    )
                ));
                // The flip and its answer are durable on the edge row, and the outbox entry
                // stands for the event: the answer does not wait for the broker (issue 45: the
                // ack's wait was the write's tail: p99 0.71x without it at 150/s). The event is
                // handed to the producer here, in this request's order; its ack, in the
                // background, clears the entry. No ack within api.publish_wait, or a broker
                // error, counts the publish as deferred, and the relay publishes the event
                // once the entry is api.relay_min_age old, unless a late ack clears it first
                // (issue 43, hole 7c). A broker outage delays counts, never writes
                // (docs/design.md, "Publishing without losing an event"); a late or repeated
                // event is a duplicate stage 1 drops by op_id.
                cas_done::reached();
                match self.events.enqueue(item, user, &edge, source, home) {
                    Ok(ack) => {
                        let (clears, at, wait) =
                            (self.clears.clone(), (shard, minute), self.publish_wait);
                        let (it, us, en) = (item.to_string(), user.to_string(), entry.clone());
                        let op_id = edge.op_id;
                        self.acks.spawn(async move {
                            crate::runtime::hold::point("api-before-ack").await;
                            let mut ack = std::pin::pin!(ack);
                            let acked = match tokio::time::timeout(wait, &mut ack).await {
                                Ok(acked) => acked,
                                Err(_) => {
                                    deferred(
                                        "timeout",
                                        &it,
                                        &us,
                                        op_id,
                                        "no ack within api.publish_wait",
                                    );
                                    // The send goes on: its late ack clears the entry, so no
                                    // relay publishes the flip again.
                                    if ack.await.is_ok() {
                                        metrics::counter!("likes_api_publishes_acked_late_total")
                                            .increment(1);
                                        clears.clear(at, &it, &us, &en);
                                    }
                                    return;
                                }
                            };
                            match acked {
                                Ok(()) => clears.clear(at, &it, &us, &en),
                                Err(e) if broker_away(&e) => {
                                    deferred("error", &it, &us, op_id, &e.to_string())
                                }
                                // A topic gone or a record refused: no later publish fares
                                // better. The write was answered; the entry waits for the relay,
                                // whose backlog alerts (LikesRelayBacklogNearHorizon).
                                Err(e) => {
                                    deferred("error", &it, &us, op_id, &e.to_string());
                                    tracing::error!(item = %it, user = %us, op_id, error = %e, "the broker refused a flip's event: it stays in the outbox");
                                }
                            }
                        });
                    }
                    // The producer's queue is full, or the client is failing: the relay has it.
                    Err(e) => deferred("error", item, user, edge.op_id, &e.to_string()),
                }
                Ok(answer(r))
            }
            Outcome::Kept(edge, r) => {
                req.spent.record(spent::Kind::NoOp);
                // Nothing of this request's to publish; a failed clear leaves an entry the
                // relay deletes unpublished once it has fenced the row. The flip this request
                // found may be one whose own request never published it: out it goes again.
                fail::fail_point!("api-before-outbox-clear", |_| Err(
                    WriteError::RetryWithSameKey(
                        "injected: before the outbox entry is cleared".into()
                    )
                ));
                self.republish("kept", item, user, Some(&edge), source, home);
                self.clears.clear((shard, minute), item, user, &entry);
                Ok(answer(r))
            }
        }
    }
}

impl Writer {
    /// Publishes `edge`'s current version for a request that flipped nothing (a keyed retry's
    /// replay, a no-op) when its flip is at least `api.relay_min_age` old and younger than
    /// half the dedupe horizon: the request that made that flip may have given up before its
    /// event, and its entry may be gone (docs/exactness.md, "The row fence"). A younger flip
    /// still has its own request's outbox entry standing for it (cleared only once its event
    /// is acknowledged; the relay takes none younger than that), so a copy would add nothing
    /// but load: a double tap or a burst of concurrent likes publishes no copies. Stage 1
    /// drops the copy of an event it has by op_id; a flip older than half the horizon is not
    /// sent, since stage 1 may have forgotten it and would count it again. Fire and forget:
    /// the answer does not wait, and a failed send loses nothing the request had.
    fn republish(
        &self,
        path: &'static str,
        item: &str,
        user: &str,
        edge: Option<&Edge>,
        source: Source,
        home: Home,
    ) {
        let Some(edge) = edge.filter(|e| e.op_id > 0) else {
            return;
        };
        let age = now_ms().saturating_sub(edge.updated_at_ms);
        let half_horizon = self.horizon.as_millis() as i64 / 2;
        if age < self.relay_min_age.as_millis() as i64 || age >= half_horizon {
            return;
        }
        metrics::counter!(crate::runtime::metrics::API_REPUBLISHED, "path" => path).increment(1);
        match self.events.enqueue(item, user, edge, source, home) {
            Ok(ack) => {
                let (it, us, op_id) = (item.to_string(), user.to_string(), edge.op_id);
                self.acks.spawn(async move {
                    if let Err(e) = ack.await {
                        tracing::debug!(item = %it, user = %us, op_id, error = %e, "a young flip's event sent again was not acknowledged");
                    }
                });
            }
            Err(e) => {
                tracing::debug!(%item, %user, op_id = edge.op_id, error = %e, "a young flip's event could not be sent again")
            }
        }
    }
}

/// One request, as the CAS needs it.
struct Request<'a> {
    user: &'a str,
    item: &'a str,
    liked: bool,
    platform: ClientPlatform,
    /// The request key as stored on the edge (namespaced).
    key: String,
    bucket: i32,
    now: i64,
    /// When the write began (monotonic: it runs on while the process is paused).
    started: std::time::Instant,
    /// With home regions: the epoch of the item's range when the write began.
    epoch: Option<i64>,
    /// What it cost the database so far (issue 57).
    spent: spent::Spent,
}

/// The time a request is stamped with on its edge: its own clock, but never at or before
/// the edge's last flip, whichever pod's clock stamped that. A flip's time orders the
/// edge's ops for stage 1 ("past the horizon", docs/exactness.md); a no-op's time tells a
/// cut that the op it found existed by then (ops/cut.rs), which a pod whose clock is behind
/// would otherwise date before that op's own flip (issue 23, item 8).
pub fn recorded_at(now: i64, last_flip_at: Option<i64>) -> i64 {
    last_flip_at.map_or(now, |t| now.max(t.saturating_add(1)))
}

/// What the request's compare-and-set found or did.
enum Outcome {
    /// The row already held this key: its stored answer, and the edge as the row held it.
    Replay(Option<Edge>, Remembered),
    /// This request flipped the edge to the given version.
    Flipped(Edge, Remembered),
    /// The edge (as given) was already in the asked state; only the key was written.
    Kept(Edge, Remembered),
}

/// The one compare-and-set of a request: aimed by `seen` (a guess from a plain read), retried
/// from a SERIAL read when it loses a race. "Already in that state" is decided by the CAS
/// itself (`IF op_id = :seen`), never by the guess.
impl Writer {
    /// Checked right before every compare-and-set: a write past its deadline, or whose
    /// item's range moved (or whose view of the range table aged past its lease) since it
    /// began, writes nothing. A move waits out lease + deadline + one CQL timeout before the
    /// new home writes; a paused writer that woke after that must not land its CAS on the
    /// new home's edges (issue 43, hole 6a). The deadline's own timer cannot say so: tokio
    /// polls the write before its timer, so a woken write would send its CAS first. The
    /// clock is monotonic, so the pause counts. This bounds when a CAS is *sent*, never
    /// when it lands: a statement stalled on the wire or in a paused coordinator applies
    /// whenever it gets there. What makes that late landing harmless is the row fence: the
    /// CAS names the fence stamp it read, and whoever drops this request's outbox entry
    /// unpublished moves the stamp first (docs/exactness.md, "The row fence").
    fn may_still_write(&self, req: &Request<'_>) -> std::result::Result<(), WriteError> {
        if req.started.elapsed() >= self.deadline {
            return Err(WriteError::RetryWithSameKey(format!(
                "the write passed its deadline ({:?}) before its compare-and-set, which was not sent",
                self.deadline
            )));
        }
        if let (Some(routes), Some(epoch)) = (&self.routes, req.epoch) {
            match routes.route(req.item) {
                Route::Here(h) if h.epoch == epoch => {}
                _ => {
                    return Err(WriteError::RangeClosed(
                        "the item's range moved, or this region's view of it aged, while the write waited".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    async fn cas(
        &self,
        req: &Request<'_>,
        mut seen: Option<EdgeRow>,
    ) -> std::result::Result<Outcome, WriteError> {
        let edges = &self.store.edges;
        // Requests on one edge with different keys contend for its next slot: each lost race
        // is a fresh read and another try.
        for _attempt in 0..(2 * request_keys::KEPT) {
            // A fault test holds a write here, as a paused process (GC, VM pause, SIGSTOP)
            // would hold it between its start and its compare-and-set.
            crate::runtime::hold::point("api-before-cas").await;
            self.may_still_write(req)?;
            let keys = seen.as_ref().map(|r| &r.keys);
            if let Some(r) = keys.and_then(|k| request_keys::lookup(k, &req.key, req.now)) {
                // A key the row holds was written by a committed CAS: its answer is final.
                if r.liked != req.liked {
                    return Err(WriteError::KeyReused);
                }
                return Ok(Outcome::Replay(seen.as_ref().map(|row| row.edge), r));
            }
            let edge = seen.as_ref().map(|r| r.edge);
            let already = edge.map(|e| e.liked == req.liked).unwrap_or(!req.liked);
            // One edge's flip times never go backwards, whichever pod's clock stamps them:
            // stage 1 reads "past the horizon" off them in op order (docs/exactness.md).
            let flip_at = recorded_at(req.now, edge.map(|e| e.updated_at_ms));
            let to = Edge {
                liked: req.liked,
                op_id: edge.map(|e| e.op_id).unwrap_or(0) + i64::from(!already),
                updated_at_ms: flip_at,
                prev_at_ms: edge.map(|e| e.updated_at_ms).unwrap_or(0),
                earlier_at_ms: edge.map(|e| e.earlier_after_flip()).unwrap_or_default(),
                platform: req.platform as i8,
            };
            let remembered = Remembered {
                liked: req.liked,
                changed: !already,
                op_id: to.op_id,
                at_ms: flip_at,
                key: req.key.clone(),
            };
            let value = remembered.encode();
            let empty = Default::default();
            let keys = keys.unwrap_or(&empty);
            let slot = request_keys::slot_for(keys, edge.map(|e| e.op_id).unwrap_or(0), req.now);
            let cas = Cas {
                item: req.item.to_string(),
                bucket: req.bucket,
                user: req.user.to_string(),
                slot,
                value,
                slot_was: keys.get(&slot).cloned(),
                fence_was: seen.as_ref().and_then(|r| r.fence),
            };
            let statement = match edge {
                None => {
                    if !req.liked {
                        // An unlike that creates the row (to hold its key): the user's side
                        // first, as for a like, so that erasure finds every row of the user.
                        edges.index_for_user(req.user, req.item, req.now).await?;
                        req.spent.wait(1, 0);
                    }
                    Statement::Insert(to)
                }
                Some(e) if already => Statement::Keep(e),
                Some(e) => Statement::Flip(e, to),
            };
            let sent = self.send(cas, statement).await?;
            req.spent.wait(1, 1);
            let applied = match sent {
                Sent::Applied => true,
                Sent::InsertFound(row) => {
                    // The row as Paxos saw it: its keys and state decide the next try.
                    seen = match row {
                        Some(row) => Some(row),
                        None => {
                            req.spent.wait(1, 1);
                            edges.read_row(req.item, req.bucket, req.user).await?
                        }
                    };
                    continue;
                }
                Sent::NotApplied => false,
            };
            if applied {
                return Ok(if already {
                    // A no-op unlike that made the row keeps `to` (op 0): nothing to publish.
                    Outcome::Kept(edge.unwrap_or(to), remembered)
                } else {
                    Outcome::Flipped(to, remembered)
                });
            }
            // Lost a race (or the guess was stale): the truth, then either our key (another
            // request with it won: replay) or another try.
            req.spent.wait(1, 1);
            seen = edges.read_row(req.item, req.bucket, req.user).await?;
        }
        Err(WriteError::RetryWithSameKey(
            "the edge kept changing under this request".into(),
        ))
    }
}

/// One compare-and-set of the edge row, as [`Writer::send`] sends it.
enum Statement {
    /// The first write of the edge: `INSERT ... IF NOT EXISTS`.
    Insert(Edge),
    /// Only the request's key, the edge as seen.
    Keep(Edge),
    /// A flip from the first edge to the second.
    Flip(Edge, Edge),
}

/// What a compare-and-set did.
enum Sent {
    Applied,
    /// The insert found a row: the row as Paxos saw it (None: not readable from the answer).
    InsertFound(Option<EdgeRow>),
    /// A keep or a flip whose condition failed.
    NotApplied,
}

impl Writer {
    /// Sends one compare-and-set. With fail point `api-cas-in-flight` configured (fault
    /// tests), the statement goes from a task of its own that the point holds first, as a
    /// statement stalled on the wire: the request may give up at its deadline and answer,
    /// and the statement still lands when the test lets it go (docs/exactness.md, "The row
    /// fence"). Fail point `api-cas-landed` is reached once it has.
    async fn send(&self, cas: Cas, statement: Statement) -> std::result::Result<Sent, WriteError> {
        let store = self.store.clone();
        let go = async move {
            let edges = &store.edges;
            let sent = match statement {
                Statement::Insert(to) => match edges.insert(&cas, &to).await? {
                    None => Sent::Applied,
                    Some(row) => Sent::InsertFound(row),
                },
                Statement::Keep(e) => applied(edges.keep(&cas, &e).await?),
                Statement::Flip(e, to) => applied(edges.flip(&cas, &e, &to).await?),
            };
            fail::fail_point!("api-cas-landed");
            Ok::<_, Error>(sent)
        };
        #[cfg(feature = "failpoints")]
        if fail::list().iter().any(|(n, _)| n == "api-cas-in-flight") {
            let on_the_wire = tokio::spawn(async move {
                crate::runtime::hold::point("api-cas-in-flight").await;
                go.await
            });
            return Ok(on_the_wire
                .await
                .map_err(|_| Error::Injected("api-cas-in-flight"))??);
        }
        Ok(go.await?)
    }
}

fn applied(yes: bool) -> Sent {
    if yes {
        Sent::Applied
    } else {
        Sent::NotApplied
    }
}

/// Fault-test hook: a slow database (`api-write-delay=return(ms)`, tests/api_overload.rs)
/// holds each write this long before its statements, without blocking a runtime thread as a
/// fail point's own sleep would.
fn injected_delay_ms() -> Option<u64> {
    fail::fail_point!("api-write-delay", |arg: Option<String>| arg
        .and_then(|a| a.parse().ok()));
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids() {
        assert!(super::valid_id("item-42"));
        assert!(super::valid_id("u:7_x"));
        assert!(!super::valid_id(""));
        assert!(!super::valid_id("a#1"));
        assert!(!super::valid_id("a.b"));
        assert!(!super::valid_id(&"x".repeat(129)));
    }
}
