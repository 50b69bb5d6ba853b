//! The metrics `likes` exports, most named here so `/metrics` is documented in one place (the
//! API's forward, refusal and outbox-clear counters and the region gauges are named where
//! they count; a job's gauges are ops/gauges.rs's).
//! Exported in Prometheus text format when `metrics.listen` is set.

use std::net::SocketAddr;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::runtime::health::{Health, Liveness};

/// Stage 1: LikeEvents read from `likes.events`.
pub const EVENTS_IN: &str = "likes_dedupe_events_total";
/// Stage 1: valid LikeEvents by the client platform they carry (label `platform`: the
/// worked example of a schema field added end to end, see docs/architecture.md, "Records and their schemas").
pub const EVENTS_BY_PLATFORM: &str = "likes_dedupe_events_by_platform_total";
/// Stage 1: events dropped as duplicates or stale reorders.
pub const DUPLICATES: &str = "likes_dedupe_duplicates_total";
pub const EXPIRED_FLIPS: &str = "likes_dedupe_expired_flips_total";
/// Stage 1: flips counted with a guessed baseline (a recount record went to `likes.dlq`).
pub const GUESSED_FLIPS: &str = "likes_dedupe_guessed_flips_total";
/// Stage 1: flips from before their range came home to this region (a move's leftovers):
/// the previous home's to count, not counted here, each a `previous_home` dead letter the
/// recount queue settles (docs/multi-region.md).
pub const PREVIOUS_HOME_FLIPS: &str = "likes_dedupe_previous_home_flips_total";
/// Stage 1: partitions brought in line at assignment (label `how`: kept, its local state
/// named the committed transaction; restored, rebuilt from the changelog). A restore after
/// every restart means local state does not survive one (docs/operations.md).
pub const PARTITIONS_RECOVERED: &str = "likes_dedupe_partitions_recovered_total";
pub const COMMITS_RESUMED: &str = "likes_dedupe_commits_resumed_total";
pub const OFFSET_RESETS: &str = "likes_offset_out_of_range_total";
/// Stage 1: combined Delta records written to `likes.deltas`.
pub const DELTAS_OUT: &str = "likes_dedupe_deltas_total";
/// Records sent to `likes.dlq` (labels `stage`, `kind`).
pub const DLQ_RECORDS: &str = "likes_dlq_records_total";
/// The `kind` label of [`DLQ_RECORDS`]: `invalid` (undecodable or refused input: a writer's
/// fault), `expired` (a flip older than the horizon with nothing remembered: most often a
/// late copy of a flip counted before, e.g. a relay's after an outage), `guessed` (counted on
/// a guessed baseline: a recount record).
pub const DLQ_KINDS: [&str; 4] = ["invalid", "expired", "guessed", "previous_home"];
/// Stage 1: committed transactions.
pub const TRANSACTIONS: &str = "likes_dedupe_transactions_total";
/// Stage 2: records read from `likes.deltas`.
pub const DELTA_RECORDS_IN: &str = "likes_count_records_total";
/// Stage 2: delta records whose windows are applied through the fence (a drained pipeline
/// has applied every delta stage 1 wrote).
pub const DELTAS_APPLIED: &str = "likes_count_deltas_applied_total";
/// Stage 2: (item, window) pairs applied to `like_counts`.
pub const WINDOWS_APPLIED: &str = "likes_count_windows_applied_total";
/// Stage 2: (item, window) pairs skipped by the fence (already applied: a replay).
pub const FENCE_SKIPS: &str = "likes_count_fence_skips_total";
/// Stage 2: conditional writes issued to `like_counts`.
pub const SINK_LWTS: &str = "likes_count_lwts_total";
/// Stage 2: compare-and-set misses retried.
pub const CAS_RETRIES: &str = "likes_count_cas_retries_total";
/// Stage 2: conditional batches whose answer was lost (a timeout, a connection dropped) and
/// were sent again in place: the fence makes the retry safe, so the stage does not restart.
pub const SINK_RESENDS: &str = "likes_count_unanswered_batches_resent_total";
/// Stage 2: writes that left a count below zero (kept as the true sum, served as 0; alert).
pub const CLAMPS: &str = "likes_count_clamps_total";
/// Stage 2: reconcile corrections decided at the correction fence (label `outcome`: applied,
/// refused). A refusal is a correction sent twice or overtaken by a newer recount.
pub const CORRECTIONS: &str = "likes_count_corrections_total";
/// Stage 2: windows and corrections not written because their item's range is no longer
/// homed here, or because they come from before it came home (docs/multi-region.md).
pub const HANDED_OVER: &str = "likes_count_handed_over_total";
/// API: age of the oldest erasure not yet purged, seconds (0 when none); the 30-day deadline
/// alerts from it.
pub const ERASURE_OLDEST_PENDING: &str = "likes_erasure_oldest_pending_seconds";
/// API: erasures not yet purged.
pub const ERASURES_PENDING: &str = "likes_erasures_pending";
/// Stage 2: sink time minus event time, per flip (from the mean event time of the flips each
/// delta combines), seconds.
pub const STALENESS_SECONDS: &str = "likes_count_staleness_seconds";
/// Stage 2: the time a closed window is handed to the sink minus the mean event time of its
/// flips, seconds: staleness before the counter-row write (input delay + the window's wait
/// for its end and for the round to end).
pub const WINDOW_CLOSED_SECONDS: &str = "likes_count_window_closed_seconds";
/// Stage 1: time per loop turn phase, seconds (label `phase`: poll, process, commit, state).
/// Where a slow stage 1 spends its time: CPU (process, state) or waiting on Kafka (commit).
pub const TURN_SECONDS: &str = "likes_dedupe_turn_seconds";
/// Stage 1: RocksDB memory by kind (label `kind`: memtables, block_cache, table_readers).
pub const STATE_MEMORY: &str = "likes_dedupe_state_memory_bytes";
/// Stage 2: a Delta's log-append time minus its earliest event time, seconds: the part of
/// staleness spent before stage 2 (API, relay, stage 1, its transaction).
pub const INPUT_DELAY_SECONDS: &str = "likes_count_input_delay_seconds";
/// Stage 1: wall clock at processing minus event time, seconds: how late events reach it.
pub const EVENT_DELAY_SECONDS: &str = "likes_dedupe_event_delay_seconds";
/// Stage 1: the configured dedupe horizon, seconds (the alerts compare delays with it).
pub const HORIZON_SECONDS: &str = "likes_dedupe_horizon_seconds";
/// Stage 1: the largest event delay (now − event time) of the last committed turn, seconds.
pub const EVENT_DELAY_MAX_SECONDS: &str = "likes_dedupe_event_delay_max_seconds";
/// Relay: the age of the oldest due outbox entry the last pass found, seconds (0: none).
pub const RELAY_OLDEST_SECONDS: &str = "likes_relay_oldest_entry_seconds";
/// API: requests by route pattern, method and status code (the write-availability SLO).
pub const API_REQUESTS: &str = "likes_api_requests_total";
/// API: request duration by route pattern and method, seconds (the write-latency SLO).
pub const API_REQUEST_SECONDS: &str = "likes_api_request_duration_seconds";
/// API: the adaptive limit on writes in flight (src/api/limit.rs).
pub const API_WRITE_LIMIT: &str = "likes_api_write_limit";
/// API: time from admission to the end of each admitted write's database work (its flip
/// applied, or its answer), seconds: what the adaptive limit keeps under
/// `api.write_latency_target` at p99 (the wait for the broker's ack is not in it).
pub const API_ADMITTED_WRITE_SECONDS: &str = "likes_api_admitted_write_seconds";
/// API: writes refused at admission (label `reason`: rate, in_flight).
pub const API_SHED: &str = "likes_api_writes_shed_total";
/// API: from a shed write's first middleware to its 429/503, seconds (the design's goal for
/// the whole answer: p99 < 5 ms; what the client sees beyond it is the box's queues).
pub const API_SHED_SECONDS: &str = "likes_api_shed_answer_seconds";
/// API: applied flips whose event the broker did not acknowledge within `api.publish_wait`
/// (label `reason`: timeout, error), answered anyway and left to the relay.
pub const API_PUBLISHES_DEFERRED: &str = "likes_api_publishes_deferred_total";
/// API: a keyed retry (label `path` = replay) or a request that changed nothing (kept)
/// found a flip older than `api.relay_min_age` and younger than half the dedupe horizon,
/// which its own request may never have published, and published the edge's current version
/// (docs/exactness.md, "The row fence").
pub const API_REPUBLISHED: &str = "likes_api_republished_total";
/// API: answered writes by kind (label `kind`: first_like, like_of_row, unlike, keyed_retry,
/// no_op), and what they cost the database on the answer's path, per kind: the requests
/// sent, the waits on answers one after the other, the Paxos rounds (src/write/spent.rs).
/// API: erased accounts in this pod's set (src/write/erased_set.rs).
pub const API_ERASED_SET: &str = "likes_api_erased_set_accounts";
pub const WRITES_BY_KIND: &str = "likes_api_writes_by_kind_total";
pub const WRITE_CQL_REQUESTS: &str = "likes_api_write_cql_requests_total";
pub const WRITE_CQL_WAITS: &str = "likes_api_write_cql_waits_total";
pub const WRITE_PAXOS_ROUNDS: &str = "likes_api_write_paxos_rounds_total";
/// Relay: outbox entries whose requests changed nothing, deleted after the row was fenced
/// (label `outcome`: fenced; raced: the row changed since it was read, decided next pass).
pub const RELAY_FENCES: &str = "likes_relay_fences_total";
/// Relay: events published for flips whose produce failed.
pub const RELAY_PUBLISHED: &str = "likes_relay_published_total";
/// Relay: passes over the outbox (label `outcome`: ok, error).
pub const RELAY_PASSES: &str = "likes_relay_passes_total";
/// This host's clock minus the database's, ms, as last measured (cql/clock.rs): past
/// `cql.max_clock_skew`, the API refuses writes and the relay skips its passes.
pub const CLOCK_SKEW: &str = "likes_clock_skew_ms";
/// Consumer lag in records, per stage (label `stage`).
pub const CONSUMER_LAG: &str = "likes_consumer_lag_records";
/// Stages started over in-process after a dependency's error (label `stage`).
pub const STAGE_RESTARTS: &str = "likes_stage_restarts_total";

/// Serves /metrics, and /healthz for `health`, when `metrics.listen` is set (else nothing);
/// the alerting counters of `roles` start at 0 (see [`start_at_zero`]).
pub async fn serve_configured(
    settings: &Settings,
    health: Vec<Health>,
    roles: &[&'static str],
) -> Result<()> {
    if settings.metrics.listen.is_empty() {
        return Ok(());
    }
    let addr = settings
        .metrics
        .listen
        .parse()
        .map_err(|e| Error::Config(format!("metrics.listen: {e}")))?;
    install(addr, health).await?;
    for role in roles {
        start_at_zero(role);
    }
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(())
}

/// Puts the counters the alert rules watch on `/metrics` at 0 from the start, with the label
/// values this process will use: a series that appears only at its first increment shows no
/// `increase()` for it, and an absent series cannot be told from a broken scrape. `role`:
/// api, relay, dedupe or count.
pub fn start_at_zero(role: &'static str) {
    use metrics::counter;
    match role {
        "api" => {
            for reason in ["rate", "in_flight"] {
                counter!(API_SHED, "reason" => reason).absolute(0);
            }
            // The write SLO's series: a route's first error is then a step from 0.
            let writes = [
                ("/v1/items/{item_id}/likes", "POST"),
                ("/v1/items/{item_id}/likes/{user_id}", "DELETE"),
            ];
            for (route, method) in writes {
                for code in ["200", "500", "503"] {
                    counter!(API_REQUESTS, "route" => route, "method" => method, "code" => code)
                        .absolute(0);
                }
            }
        }
        "relay" => {
            metrics::gauge!(RELAY_OLDEST_SECONDS).set(0.0);
            counter!(RELAY_PUBLISHED).absolute(0);
            for outcome in ["ok", "error"] {
                counter!(RELAY_PASSES, "outcome" => outcome).absolute(0);
            }
        }
        "dedupe" | "count" => {
            for kind in DLQ_KINDS {
                counter!(DLQ_RECORDS, "stage" => role, "kind" => kind).absolute(0);
            }
            counter!(OFFSET_RESETS, "stage" => role).absolute(0);
            counter!(STAGE_RESTARTS, "stage" => role).absolute(0);
            if role == "count" {
                counter!(CLAMPS).absolute(0);
                counter!(FENCE_SKIPS).absolute(0);
                counter!(WINDOWS_APPLIED).absolute(0);
                counter!(HANDED_OVER).absolute(0);
                for outcome in ["applied", "refused"] {
                    counter!(CORRECTIONS, "outcome" => outcome).absolute(0);
                }
            } else {
                metrics::gauge!(EVENT_DELAY_MAX_SECONDS).set(0.0);
                counter!(EVENTS_IN).absolute(0);
                counter!(DUPLICATES).absolute(0);
                counter!(PREVIOUS_HOME_FLIPS).absolute(0);
                counter!(DELTAS_OUT).absolute(0);
                for how in ["kept", "restored"] {
                    counter!(PARTITIONS_RECOVERED, "how" => how).absolute(0);
                }
            }
        }
        _ => {}
    }
}

/// Buckets of the staleness histograms, seconds: fine around the 5 s SLO, then out to the
/// 10-minute band a backlog or the dedupe horizon reaches.
pub const STALENESS_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
];

/// Buckets of the shed answers' histogram, seconds: fine under the 5 ms goal.
pub const SHED_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Serves `/metrics` (Prometheus text) on `addr`, and `/healthz` and `/readyz`: 200 while
/// every stage of `health` is live, 503 with the reason once one has stalled. Must be called
/// inside a Tokio runtime.
pub async fn install(addr: SocketAddr, health: Vec<Health>) -> Result<()> {
    let mut builder = PrometheusBuilder::new()
        .set_buckets(&[
            0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
            2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 30.0,
        ])
        .map_err(|e| Error::Config(format!("metrics: {e}")))?;
    // Staleness and its parts span sub-second to minutes: a backlog's staleness must read as
    // what it is (the shared buckets' 10 -> 30 -> +Inf made "30" a cap and anything from 10 to
    // 30 s one bucket: issue 45).
    for name in [
        STALENESS_SECONDS,
        INPUT_DELAY_SECONDS,
        WINDOW_CLOSED_SECONDS,
        EVENT_DELAY_SECONDS,
    ] {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_string()), STALENESS_BUCKETS)
            .map_err(|e| Error::Config(format!("metrics: {e}")))?;
    }
    builder = builder
        .set_buckets_for_metric(Matcher::Full(API_SHED_SECONDS.to_string()), SHED_BUCKETS)
        .map_err(|e| Error::Config(format!("metrics: {e}")))?;
    let handle = builder
        .install_recorder()
        .map_err(|e| Error::Config(format!("metrics on {addr}: {e}")))?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let live = move || {
        let health = health.clone();
        async move {
            let stalled = health
                .iter()
                .map(Health::liveness)
                .find(|l| *l != Liveness::Ok);
            match stalled {
                Some(Liveness::Stalled { stage, for_ }) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("stalled: {stage} has had input and made no progress for {for_:?}\n"),
                ),
                _ => (StatusCode::OK, "ok\n".to_string()),
            }
        }
    };
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(live.clone()))
        .route("/readyz", get(live));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding metrics.listen {addr}")))?;
    // Detached on purpose, unlike a process's tasks (runtime/shutdown.rs): health and metrics
    // answer until the process exits, while its tasks stop and are joined.
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics and health endpoint stopped");
        }
    });
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(EVENTS_IN, "LikeEvents read by stage 1");
    describe_counter!(
        EVENTS_BY_PLATFORM,
        "Valid LikeEvents read by stage 1, by client platform"
    );
    describe_counter!(API_SHED, "API writes refused at admission (429/503)");
    describe_counter!(
        API_PUBLISHES_DEFERRED,
        "API flips answered without the broker's ack in time, their events left to the relay"
    );
    describe_counter!(WRITES_BY_KIND, "Answered writes by kind");
    metrics::describe_gauge!(
        API_ERASED_SET,
        "Erased accounts in this API pod's set (its writes by them ask the database)"
    );
    describe_counter!(
        WRITE_CQL_REQUESTS,
        "CQL requests the answered writes of a kind sent on their answers' path"
    );
    describe_counter!(
        WRITE_CQL_WAITS,
        "Waits on CQL answers, one after the other, of the answered writes of a kind"
    );
    describe_counter!(
        WRITE_PAXOS_ROUNDS,
        "Paxos rounds (compare-and-sets, SERIAL reads) of the answered writes of a kind"
    );
    describe_counter!(
        API_REPUBLISHED,
        "API retries and no-op writes that published the edge's young current version again"
    );
    describe_counter!(
        RELAY_FENCES,
        "relay fences of edge rows before dropping their outbox entries unpublished"
    );
    metrics::describe_gauge!(
        API_WRITE_LIMIT,
        "the adaptive limit on API writes in flight: down when admitted writes' p99 passes api.write_latency_target, up while under it and reached"
    );
    metrics::describe_histogram!(
        API_SHED_SECONDS,
        "time from a shed write's arrival at the API's first middleware to its 429 or 503, seconds"
    );
    describe_histogram!(
        API_ADMITTED_WRITE_SECONDS,
        "time from admission to the end of each admitted API write's database work, seconds"
    );
    describe_counter!(
        API_REQUESTS,
        "API requests by route, method and status code"
    );
    describe_counter!(
        RELAY_PUBLISHED,
        "Events the relay published for flips whose produce failed"
    );
    describe_counter!(RELAY_PASSES, "Relay passes over the outbox, by outcome");
    describe_gauge!(
        RELAY_OLDEST_SECONDS,
        "age of the oldest due outbox entry the relay's last pass found, seconds (0: none)"
    );
    describe_gauge!(
        HORIZON_SECONDS,
        "stage 1's configured dedupe horizon, seconds"
    );
    describe_gauge!(
        EVENT_DELAY_MAX_SECONDS,
        "the largest event delay (now - event time) of stage 1's last committed turn, seconds"
    );
    describe_gauge!(
        CLOCK_SKEW,
        "this host's clock minus the database's, ms, as last measured; past cql.max_clock_skew writes and relay passes are refused"
    );
    describe_histogram!(
        API_REQUEST_SECONDS,
        "API request duration by route and method, seconds"
    );
    describe_counter!(DUPLICATES, "events dropped as duplicates or stale");
    describe_counter!(
        EXPIRED_FLIPS,
        "flips older than the dedupe horizon with no state left: dead-lettered, not counted"
    );
    describe_counter!(
        PARTITIONS_RECOVERED,
        "partitions brought in line at assignment: kept (local state named the committed transaction) or restored from the changelog"
    );
    describe_counter!(
        PREVIOUS_HOME_FLIPS,
        "flips from before their range came home to this region (a move's leftovers): left to the previous home's count and the move's recount"
    );
    describe_counter!(
        HANDED_OVER,
        "windows and corrections of items whose range is no longer homed here (or from before it came home): not written; the move's recount accounts for them"
    );
    describe_counter!(
        GUESSED_FLIPS,
        "flips counted with nothing remembered and too little history to know the edge's counted baseline: each also sent a recount record to the dead-letter topic"
    );
    describe_counter!(
        COMMITS_RESUMED,
        "stage-1 transaction commits whose outcome was unknown (a timeout, the broker away) and were resumed"
    );
    describe_counter!(
        OFFSET_RESETS,
        "partitions whose committed offset was out of range (records lost to retention, or a recreated topic); alert on any"
    );
    describe_counter!(DELTAS_OUT, "combined deltas written by stage 1");
    describe_counter!(DLQ_RECORDS, "records sent to the dead-letter topic");
    describe_counter!(TRANSACTIONS, "stage-1 transactions committed");
    describe_counter!(DELTA_RECORDS_IN, "records read by stage 2");
    describe_counter!(
        DELTAS_APPLIED,
        "delta records whose windows stage 2 applied through the fence"
    );
    describe_counter!(
        WINDOWS_APPLIED,
        "(item, window) pairs applied through the fence"
    );
    describe_counter!(
        FENCE_SKIPS,
        "(item, window) pairs the fence skipped (already applied)"
    );
    describe_counter!(SINK_LWTS, "conditional writes to like_counts");
    describe_counter!(CAS_RETRIES, "compare-and-set misses retried");
    describe_counter!(
        SINK_RESENDS,
        "conditional batches whose answer was lost, sent again in place"
    );
    describe_counter!(
        CLAMPS,
        "counter writes that left a count below zero (the row keeps the true sum, reads serve 0); alert on any"
    );
    describe_counter!(
        CORRECTIONS,
        "reconcile corrections applied or refused at the correction fence"
    );
    describe_gauge!(
        ERASURE_OLDEST_PENDING,
        Unit::Seconds,
        "age of the oldest erasure not yet purged (deadline: 30 days)"
    );
    describe_gauge!(ERASURES_PENDING, "erasures not yet purged");
    describe_gauge!(
        STATE_MEMORY,
        Unit::Bytes,
        "stage-1 RocksDB memory by kind (memtables, block_cache, table_readers)"
    );
    describe_histogram!(
        INPUT_DELAY_SECONDS,
        Unit::Seconds,
        "delta log-append time minus earliest event time (staleness before stage 2)"
    );
    describe_histogram!(
        EVENT_DELAY_SECONDS,
        Unit::Seconds,
        "stage-1 processing time minus event time"
    );
    describe_histogram!(
        TURN_SECONDS,
        Unit::Seconds,
        "stage-1 time per loop phase (poll, process, commit, state)"
    );
    describe_histogram!(
        WINDOW_CLOSED_SECONDS,
        Unit::Seconds,
        "closed window handed to the sink minus event time, per flip"
    );
    describe_histogram!(
        STALENESS_SECONDS,
        Unit::Seconds,
        "sink time minus event time, per flip"
    );
    describe_gauge!(CONSUMER_LAG, "records behind the log end");
    describe_counter!(
        STAGE_RESTARTS,
        "stages started over in-process after a Kafka or Cassandra error (a restart of a dependency)"
    );
}
