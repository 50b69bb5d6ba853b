//! `likes-tools loadgen`: drives `likes api` over HTTP (or, with `--kafka`, produces LikeEvents
//! straight to the events topic) at a target rate, open loop: every request goes out at its
//! scheduled time whatever earlier ones took, and its latency counts from that time, so a
//! stall shows in the figures instead of quietly lowering the rate.
//!
//! The mix: items by zipf (s = 1), one viral item taking a chosen share, likes by new users,
//! unlikes of earlier likes, and retries that resend an earlier request with its own key
//! (the API replays them; the topology drops the duplicate event). Latency goes to an HDR
//! histogram (1 µs to 2 min, 3 significant digits).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::task::JoinSet;

use crate::bench::gen::Zipf;
use anyhow::{anyhow, Result};
use likes::api::auth::Signer;
use likes::config::Settings;
use likes::kafka;
use likes::schema::v1::Source;
use likes::topology::Topology;

/// The name of the viral item.
pub const VIRAL_ITEM: &str = "item-viral";

/// Requests the generator keeps outstanding at most; past it a due request is counted as
/// failed ("generator: in-flight cap") rather than queued, so memory stays bounded.
const MAX_IN_FLIGHT: usize = 20_000;

/// Where the load goes.
pub enum Target {
    Http {
        http: reqwest::Client,
        /// One API, or several: each request goes to one drawn at random, so flips of one
        /// edge come from several producers (chaos runs three).
        urls: Vec<String>,
        signer: Signer,
        expires_s: i64,
    },
    Kafka {
        producer: FutureProducer,
        topic: String,
        buckets: u32,
    },
}

impl Target {
    /// The API at `url`, with tokens minted from the configured session key.
    pub fn http(settings: &Settings, url: &str) -> Result<Self> {
        Self::http_spread(settings, &[url.to_string()])
    }

    /// Several API processes of one deployment; each request goes to one at random.
    pub fn http_spread(settings: &Settings, urls: &[String]) -> Result<Self> {
        Ok(Target::Http {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| anyhow!(format!("http client: {e}")))?,
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
            signer: Signer::from_session_key(&settings.api.session_key)?,
            expires_s: likes::runtime::clock::now_ms() / 1000 + 24 * 3600,
        })
    }

    /// The events topic of the topology, bypassing the API.
    pub fn kafka(settings: &Settings, topology: &Topology) -> Result<Self> {
        Ok(Target::Kafka {
            producer: kafka::producer_config(&settings.kafka).create()?,
            topic: settings.topic(&topology.topics.events.name),
            buckets: topology.buckets,
        })
    }

    /// Sends one operation; what the API answered (the HTTP target's body) or why it failed.
    async fn send(&self, op: &Op) -> std::result::Result<Reply, Failed> {
        match self {
            Target::Http {
                http,
                urls,
                signer,
                expires_s,
            } => {
                let url = &urls[rand::random_range(0..urls.len())];
                let edge = format!("{url}/v1/items/{}/likes/{}", op.item, op.user);
                let req = if op.read {
                    http.get(edge)
                } else if op.like {
                    http.post(format!("{url}/v1/items/{}/likes", op.item))
                } else {
                    http.delete(edge)
                };
                let mut req = req.bearer_auth(signer.sign(&op.user, *expires_s));
                if !op.read {
                    req = req.header("Idempotency-Key", &op.key);
                }
                let r = req.send().await.map_err(|e| {
                    if e.is_connect() {
                        // Never reached the API: nothing was done.
                        Failed::not_done("connection")
                    } else if e.is_timeout() {
                        Failed::unknown("timeout")
                    } else {
                        Failed::unknown("connection")
                    }
                })?;
                match r.status().as_u16() {
                    200..=299 => r.json::<Reply>().await.map_err(|e| Failed {
                        why: format!("unreadable answer: {e}"),
                        unknown: true,
                    }),
                    // Shed at the door: nothing was done.
                    429 => Err(Failed::not_done("429 (shed by admission or a dependency)")),
                    // Shed at the door by admission ("overloaded": nothing was done), or a
                    // dependency failed after part of the work: the write may land.
                    503 => {
                        #[derive(serde::Deserialize)]
                        struct Refusal {
                            error: String,
                        }
                        match r.json::<Refusal>().await {
                            Ok(b) if b.error == "overloaded" => {
                                Err(Failed::not_done("503 overloaded (shed at the door)"))
                            }
                            _ => Err(Failed::unknown("503 (a dependency failed or was slow)")),
                        }
                    }
                    code @ (400..=499) if code != 408 => Err(Failed {
                        why: code.to_string(),
                        unknown: false,
                    }),
                    code => Err(Failed {
                        why: code.to_string(),
                        unknown: true,
                    }),
                }
            }
            Target::Kafka {
                producer,
                topic,
                buckets,
            } => {
                // Each user likes once and may unlike once: op 1, then op 2.
                let (key, payload) = likes::records::Flip {
                    item: &op.item,
                    user: &op.user,
                    op_id: if op.like { 1 } else { 2 },
                    liked: op.like,
                    event_time_ms: op.at_ms,
                    prev_event_time_ms: if op.like { 0 } else { op.prev_at_ms },
                    earlier_event_times_ms: &[],
                    source: Source::Test,
                    platform: likes::schema::v1::ClientPlatform::Unspecified,
                }
                .record(*buckets);
                producer
                    .send(
                        FutureRecord::to(topic).key(&key).payload(&payload),
                        Duration::from_secs(30),
                    )
                    .await
                    .map(|_| Reply::default())
                    .map_err(|(e, _)| Failed::unknown(&format!("kafka: {e}")))
            }
        }
    }
}

/// What the API answered a request: a write's answer, or the actor's read (`liked` only).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub liked: bool,
    #[serde(default)]
    pub changed: bool,
    #[serde(default, rename = "opId")]
    pub op_id: i64,
}

/// Why a request failed, and whether it may still have taken effect.
#[derive(Debug, Clone)]
pub struct Failed {
    pub why: String,
    /// A timeout, a 5xx or a broken connection: the write may land, now or later.
    pub unknown: bool,
}

impl Failed {
    fn not_done(why: &str) -> Self {
        Failed {
            why: why.into(),
            unknown: false,
        }
    }
    fn unknown(why: &str) -> Self {
        Failed {
            why: why.into(),
            unknown: true,
        }
    }
}

/// One request of the mix.
#[derive(Debug, Clone)]
pub struct Op {
    pub item: String,
    pub user: String,
    pub like: bool,
    /// The actor's own read of the edge (`like` unused).
    pub read: bool,
    pub key: String,
    /// A resend of an earlier request, same key.
    pub retry: bool,
    at_ms: i64,
    prev_at_ms: i64,
}

/// The shape of the load.
/// Knobs of `likes-tools loadgen`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Requests a second, held whatever the latency (open loop).
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// How long to run.
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Distinct items, drawn by zipf (s = 1).
    #[arg(long, default_value_t = 1000)]
    pub items: u32,
    /// Share of likes that go to the one viral item.
    #[arg(long, default_value_t = 0.05)]
    pub viral_share: f64,
    /// Share of requests that unlike an earlier like.
    #[arg(long, default_value_t = 0.1)]
    pub unlike_share: f64,
    /// Share of requests that resend an earlier request with its own key.
    #[arg(long, default_value_t = 0.05)]
    pub retry_share: f64,
    /// The API's base URL (default: http:// + api.listen).
    #[arg(long)]
    pub url: Option<String>,
    /// Produce LikeEvents to the events topic instead of calling the API.
    #[arg(long)]
    pub kafka: bool,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

/// `likes-tools loadgen`: one steady phase; returns the summary to print.
pub async fn run(settings: &Settings, topology: &Topology, a: &LoadgenArgs) -> Result<Summary> {
    let shares = [a.viral_share, a.unlike_share, a.retry_share];
    if !(a.rate > 0.0 && a.seconds > 0.0 && a.items > 0)
        || shares.iter().any(|s| !(0.0..=1.0).contains(s))
    {
        anyhow::bail!("--rate, --seconds and --items must be above 0 and every share in 0..=1");
    }
    let target = if a.kafka {
        Target::kafka(settings, topology)?
    } else {
        let url = a
            .url
            .clone()
            .unwrap_or_else(|| format!("http://{}", settings.api.listen));
        Target::http(settings, &url)?
    };
    let mut mix = Mix::new(MixArgs {
        items: a.items,
        viral_share: a.viral_share,
        unlike_share: a.unlike_share,
        retry_share: a.retry_share,
        relike_share: 0.0,
        relike_after_ms: 0,
        read_share: 0.0,
        seed: a.seed,
        run_id: format!("lg{}", likes::runtime::clock::now_ms()),
    });
    let phases = [Phase {
        name: "steady".into(),
        seconds: a.seconds,
        rate: a.rate,
        viral_share: a.viral_share,
    }];
    let live = Arc::new(Live::default());
    let started = Instant::now();
    drive(Arc::new(target), &mut mix, &phases, live.clone()).await;
    Ok(Summary::of(&live, started.elapsed()))
}

#[derive(Debug, Clone)]
pub struct MixArgs {
    pub items: u32,
    pub viral_share: f64,
    pub unlike_share: f64,
    pub retry_share: f64,
    /// Share of requests that like again an edge the mix unliked earlier (its op 3, 5, ...;
    /// over HTTP only: the Kafka target numbers ops 1 and 2 alone).
    pub relike_share: f64,
    /// An unliked edge is liked again no sooner than this after its unlike, ms.
    pub relike_after_ms: i64,
    /// Share of requests that are the actor's own read of an edge the mix wrote (HTTP only;
    /// `likes-tools chaos` checks them against the writes, docs/testing.md).
    pub read_share: f64,
    pub seed: u64,
    /// Prefixes user ids and request keys, so runs never collide.
    pub run_id: String,
}

/// Draws the operations.
pub struct Mix {
    args: MixArgs,
    rng: StdRng,
    zipf: Zipf,
    next_user: u64,
    /// Likes sent and not yet unliked: (item, user, when).
    liked: Vec<(String, String, i64)>,
    /// Unlikes sent and not yet liked again: (item, user, when).
    unliked: Vec<(String, String, i64)>,
    recent: VecDeque<Op>,
}

impl Mix {
    pub fn new(args: MixArgs) -> Self {
        Mix {
            rng: StdRng::seed_from_u64(args.seed),
            zipf: Zipf::new(args.items.max(1)),
            next_user: 0,
            liked: Vec::new(),
            unliked: Vec::new(),
            recent: VecDeque::new(),
            args,
        }
    }

    pub fn set_viral_share(&mut self, share: f64) {
        self.args.viral_share = share;
    }

    fn next(&mut self) -> Op {
        let now = likes::runtime::clock::now_ms();
        let written = self.liked.len() + self.unliked.len();
        if self.args.read_share > 0.0 && written > 0 && self.rng.random_bool(self.args.read_share) {
            let j = self.rng.random_range(0..written);
            let (item, user, _) = if j < self.liked.len() {
                &self.liked[j]
            } else {
                &self.unliked[j - self.liked.len()]
            };
            return Op {
                item: item.clone(),
                user: user.clone(),
                like: false,
                read: true,
                key: String::new(),
                retry: false,
                at_ms: now,
                prev_at_ms: 0,
            };
        }
        if !self.recent.is_empty() && self.rng.random_bool(self.args.retry_share) {
            let j = self.rng.random_range(0..self.recent.len());
            let mut op = self.recent[j].clone();
            op.retry = true;
            return op;
        }
        self.next_user += 1;
        let relike_due = self
            .unliked
            .first()
            .is_some_and(|u| now - u.2 >= self.args.relike_after_ms);
        let key = format!("{}-{}", self.args.run_id, self.next_user);
        // The next flip of an edge the mix flipped before (at `at`): one later, then or now.
        let again = |(item, user, at): (String, String, i64), like: bool| Op {
            item,
            user,
            like,
            read: false,
            key: key.clone(),
            retry: false,
            at_ms: now.max(at + 1),
            prev_at_ms: at,
        };
        let op = if relike_due && self.rng.random_bool(self.args.relike_share) {
            // The oldest first, and only after a while: with a short dedupe horizon, its
            // flips are past it; and the unlikes of the run's last seconds stay as they
            // are, for the checks.
            let edge = self.unliked.remove(0);
            self.liked
                .push((edge.0.clone(), edge.1.clone(), now.max(edge.2 + 1)));
            again(edge, true)
        } else if !self.liked.is_empty() && self.rng.random_bool(self.args.unlike_share) {
            let j = self.rng.random_range(0..self.liked.len());
            let edge = self.liked.swap_remove(j);
            if self.args.relike_share > 0.0 {
                self.unliked
                    .push((edge.0.clone(), edge.1.clone(), now.max(edge.2 + 1)));
            }
            again(edge, false)
        } else {
            let item = if self.rng.random_bool(self.args.viral_share) {
                VIRAL_ITEM.to_string()
            } else {
                format!("item-{}", self.zipf.sample(&mut self.rng))
            };
            let user = format!("{}u{}", self.args.run_id, self.next_user);
            self.liked.push((item.clone(), user.clone(), now));
            Op {
                item,
                user,
                like: true,
                read: false,
                key,
                retry: false,
                at_ms: now,
                prev_at_ms: 0,
            }
        };
        self.recent.push_back(op.clone());
        if self.recent.len() > 1000 {
            self.recent.pop_front();
        }
        op
    }
}

/// One stretch of constant load.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
    pub rate: f64,
    pub viral_share: f64,
}

/// Steady load at `rate` (5% viral) for `before` seconds, a burst of `burst` seconds at
/// `factor` times the rate with `share` of the likes on the viral item, then steady again
/// until `total` seconds.
pub fn with_burst(
    total: f64,
    before: f64,
    burst: f64,
    rate: f64,
    factor: f64,
    share: f64,
) -> Vec<Phase> {
    let steady = |seconds| Phase {
        name: "steady".into(),
        seconds,
        rate,
        viral_share: 0.05,
    };
    let viral = Phase {
        name: "viral burst".into(),
        seconds: burst,
        rate: rate * factor,
        viral_share: share,
    };
    vec![steady(before), viral, steady(total - before - burst)]
}

/// Counters a live view reads while the load runs.
pub struct Live {
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub failures: Mutex<BTreeMap<String, u64>>,
    pub latency_us: Mutex<Histogram<u64>>,
    /// Of the requests shed (429 or 503), from the scheduled send to the answer: shedding is
    /// meant to be fast (the design's goal: p99 < 5 ms).
    pub shed_us: Mutex<Histogram<u64>>,
    /// Acknowledged likes minus unlikes per item (first sends only; retries excluded).
    pub net_by_item: Mutex<HashMap<String, i64>>,
    /// Per edge (item, user), when set: what the client knows of it (`likes-tools chaos` checks
    /// acknowledged writes against `edges` with it).
    pub edges: Option<Mutex<HashMap<(String, String), EdgeSeen>>>,
    /// When the counters were made: [`Answer::due_s`] counts from here.
    pub t0: Instant,
    /// When set, every request's outcome, in the order they ended: availability over any
    /// stretch of the run (a broker outage's, say) is read from it afterwards.
    pub answers: Option<Mutex<Vec<Answer>>>,
    /// When set, every operation with its call and return times and its outcome, the
    /// actor's reads included: the history `likes-tools chaos` checks for linearizability.
    pub history: Option<Mutex<Vec<Recorded>>>,
    /// The actor's reads sent, and answered 2xx (not in `sent` and `ok`, which count writes).
    pub reads: AtomicU64,
    pub reads_ok: AtomicU64,
}

/// One operation of the history, as tools/linearizability reads it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recorded {
    pub item: String,
    pub user: String,
    /// like, unlike or read.
    pub op: &'static str,
    pub key: String,
    /// From [`Live::t0`], µs.
    pub call_us: i64,
    /// None: the outcome is unknown (it may take effect at any time after the call).
    pub return_us: Option<i64>,
    pub liked: bool,
    pub changed: bool,
    pub op_id: i64,
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// Its scheduled send, seconds after [`Live::t0`].
    pub due_s: f64,
    /// Answered 2xx.
    pub ok: bool,
    /// From its scheduled send to its end, ms.
    pub latency_ms: f64,
}

/// Requests scheduled within a stretch of the run, and how they fared.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Availability {
    pub requests: u64,
    pub ok: u64,
    /// ok / requests (NaN with none).
    pub ratio: f64,
    /// Of the requests answered 2xx, from the scheduled send (NaN with none).
    pub ok_p99_ms: f64,
}

/// What the load generator knows of one edge.
#[derive(Debug, Clone, Copy, Default)]
pub struct EdgeSeen {
    /// A like of it was answered 2xx.
    pub like_acked: bool,
    /// An unlike of it was sent (answered or not).
    pub unlike_sent: bool,
    /// A like sent after an unlike (a relike).
    pub relike_sent: bool,
    /// Requests of the edge sent and not answered yet.
    pub pending: u32,
    /// A request of the edge failed: it may still land, at any time, so nothing sent after
    /// it can be judged by its answer.
    pub failed: bool,
    /// The unlike was sent with the like answered 2xx and nothing else of the edge pending
    /// or failed: its answer is the edge's state, unless a relike follows.
    pub unlike_clean: bool,
    /// The (first) unlike was answered 2xx.
    pub unlike_acked: bool,
}

impl Live {
    /// Counters that also keep every request's [`Answer`].
    pub fn keeping_answers() -> Self {
        Live {
            answers: Some(Mutex::new(Vec::new())),
            ..Live::default()
        }
    }

    /// Counters that also keep [`EdgeSeen`] per edge and every request's [`Answer`].
    pub fn tracking_edges() -> Self {
        Live {
            edges: Some(Mutex::new(HashMap::new())),
            answers: Some(Mutex::new(Vec::new())),
            ..Live::default()
        }
    }

    /// [`Live::tracking_edges`], and the history of every operation.
    pub fn recording_history() -> Self {
        Live {
            history: Some(Mutex::new(Vec::new())),
            ..Live::tracking_edges()
        }
    }

    fn record(&self, op: &Op, call_us: i64, sent: &std::result::Result<Reply, Failed>) {
        let Some(history) = &self.history else {
            return;
        };
        let now_us = self.t0.elapsed().as_micros() as i64;
        let (return_us, reply) = match sent {
            Ok(reply) => (Some(now_us), *reply),
            Err(f) if !f.unknown => return,
            Err(_) => (None, Reply::default()),
        };
        history.lock().unwrap().push(Recorded {
            item: op.item.clone(),
            user: op.user.clone(),
            op: match (op.read, op.like) {
                (true, _) => "read",
                (false, true) => "like",
                (false, false) => "unlike",
            },
            key: op.key.clone(),
            call_us,
            return_us,
            liked: reply.liked,
            changed: reply.changed,
            op_id: reply.op_id,
        });
    }

    fn see(&self, op: &Op, f: impl FnOnce(&mut EdgeSeen)) {
        if let Some(edges) = &self.edges {
            f(edges
                .lock()
                .unwrap()
                .entry((op.item.clone(), op.user.clone()))
                .or_default());
        }
    }
}

/// 1 µs to 2 min, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

impl Default for Live {
    fn default() -> Self {
        Live {
            sent: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            failures: Mutex::new(BTreeMap::new()),
            latency_us: Mutex::new(latency_histogram()),
            shed_us: Mutex::new(latency_histogram()),
            net_by_item: Mutex::new(HashMap::new()),
            edges: None,
            t0: Instant::now(),
            answers: None,
            history: None,
            reads: AtomicU64::new(0),
            reads_ok: AtomicU64::new(0),
        }
    }
}

impl Live {
    fn fail(&self, why: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *self.failures.lock().unwrap().entry(why).or_insert(0) += 1;
    }

    fn answered(&self, due: Instant, ok: bool) {
        let Some(answers) = &self.answers else {
            return;
        };
        let answer = Answer {
            due_s: due.saturating_duration_since(self.t0).as_secs_f64(),
            ok,
            latency_ms: due.elapsed().as_secs_f64() * 1000.0,
        };
        answers.lock().unwrap().push(answer);
    }

    /// The requests scheduled from `from_s` to `to_s` (seconds after [`Live::t0`]); none
    /// unless the answers are kept.
    pub fn availability(&self, from_s: f64, to_s: f64) -> Availability {
        let Some(answers) = &self.answers else {
            return Availability {
                ratio: f64::NAN,
                ok_p99_ms: f64::NAN,
                ..Default::default()
            };
        };
        let answers = answers.lock().unwrap();
        let within: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.due_s >= from_s && a.due_s < to_s)
            .collect();
        let mut ok: Vec<f64> = within
            .iter()
            .filter(|a| a.ok)
            .map(|a| a.latency_ms)
            .collect();
        ok.sort_by(f64::total_cmp);
        let n = within.len() as u64;
        Availability {
            requests: n,
            ok: ok.len() as u64,
            ratio: if n == 0 {
                f64::NAN
            } else {
                ok.len() as f64 / n as f64
            },
            ok_p99_ms: crate::bench::harness::quantile_of(&ok, 0.99),
        }
    }
}

/// Runs the phases one after another, open loop, and waits for every request to finish.
pub async fn drive(target: Arc<Target>, mix: &mut Mix, phases: &[Phase], live: Arc<Live>) {
    let mut tasks = JoinSet::new();
    for phase in phases {
        mix.set_viral_share(phase.viral_share);
        let n = (phase.rate * phase.seconds).round() as u64;
        let start = Instant::now();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / phase.rate);
            tokio::time::sleep_until(due.into()).await;
            while tasks.try_join_next().is_some() {}
            if tasks.len() >= MAX_IN_FLIGHT {
                live.sent.fetch_add(1, Ordering::Relaxed);
                live.fail("generator: in-flight cap".into());
                live.answered(due, false);
                continue;
            }
            let op = mix.next();
            if op.read {
                live.reads.fetch_add(1, Ordering::Relaxed);
                let (target, live) = (target.clone(), live.clone());
                tasks.spawn(async move {
                    let call_us = live.t0.elapsed().as_micros() as i64;
                    let sent = target.send(&op).await;
                    live.record(&op, call_us, &sent);
                    if sent.is_ok() {
                        live.reads_ok.fetch_add(1, Ordering::Relaxed);
                    }
                });
                continue;
            }
            live.sent.fetch_add(1, Ordering::Relaxed);
            live.see(&op, |e| {
                if !op.like && !op.retry && !e.unlike_sent {
                    e.unlike_clean = e.like_acked && e.pending == 0 && !e.failed;
                }
                if op.like && !op.retry && e.unlike_sent {
                    e.relike_sent = true;
                }
                e.unlike_sent |= !op.like;
                e.pending += 1;
            });
            let (target, live) = (target.clone(), live.clone());
            tasks.spawn(async move {
                let call_us = live.t0.elapsed().as_micros() as i64;
                let sent = target.send(&op).await;
                live.record(&op, call_us, &sent);
                live.see(&op, |e| {
                    e.pending -= 1;
                    e.failed |= sent.is_err();
                });
                live.answered(due, sent.is_ok());
                match sent {
                    Ok(_) => {
                        let us = due.elapsed().as_micros() as u64;
                        live.latency_us.lock().unwrap().saturating_record(us.max(1));
                        live.ok.fetch_add(1, Ordering::Relaxed);
                        if op.like {
                            live.see(&op, |e| e.like_acked = true);
                        } else {
                            live.see(&op, |e| e.unlike_acked = true);
                        }
                        if !op.retry {
                            *live.net_by_item.lock().unwrap().entry(op.item).or_insert(0) +=
                                if op.like { 1 } else { -1 };
                        }
                    }
                    Err(Failed { why, .. }) => {
                        if why.starts_with("429") || why.starts_with("503") {
                            let us = due.elapsed().as_micros() as u64;
                            live.shed_us.lock().unwrap().saturating_record(us.max(1));
                        }
                        live.fail(why)
                    }
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// What a run achieved.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub seconds: f64,
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    pub failures: BTreeMap<String, u64>,
    pub achieved_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Live {
    /// The shed answers' p99, ms (NaN: none shed).
    pub fn shed_p99_ms(&self) -> f64 {
        let h = self.shed_us.lock().unwrap();
        if h.is_empty() {
            f64::NAN
        } else {
            h.value_at_quantile(0.99) as f64 / 1000.0
        }
    }
}

impl Summary {
    pub fn of(live: &Live, elapsed: Duration) -> Self {
        let h = live.latency_us.lock().unwrap();
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        let ok = live.ok.load(Ordering::Relaxed);
        Summary {
            seconds: elapsed.as_secs_f64(),
            sent: live.sent.load(Ordering::Relaxed),
            ok,
            failed: live.failed.load(Ordering::Relaxed),
            failures: live.failures.lock().unwrap().clone(),
            achieved_per_s: ok as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: h.max() as f64 / 1000.0,
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "loadgen: {} sent in {:.1} s, {} ok ({:.0}/s), {} failed",
            self.sent, self.seconds, self.ok, self.achieved_per_s, self.failed
        )?;
        for (why, n) in &self.failures {
            writeln!(f, "  failed {why}: {n}")?;
        }
        write!(
            f,
            "latency from the scheduled send, ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_counts_the_requests_scheduled_within_the_stretch() {
        let live = Live::tracking_edges();
        let at = |s: f64| live.t0 + Duration::from_secs_f64(s);
        // Before, within (two ok, one failed), at its end (excluded).
        for (s, ok) in [
            (0.5, true),
            (1.0, true),
            (1.5, false),
            (1.9, true),
            (2.0, false),
        ] {
            live.answered(at(s), ok);
        }
        let a = live.availability(1.0, 2.0);
        assert_eq!((a.requests, a.ok), (3, 2));
        assert!((a.ratio - 2.0 / 3.0).abs() < 1e-9);
        assert!(a.ok_p99_ms.is_finite());
        assert!(live.availability(5.0, 6.0).ratio.is_nan());
    }

    #[test]
    fn the_mix_unlikes_earlier_likes_and_retries_reuse_keys() {
        let mut mix = Mix::new(MixArgs {
            items: 50,
            viral_share: 0.2,
            unlike_share: 0.2,
            retry_share: 0.1,
            relike_share: 0.0,
            relike_after_ms: 0,
            read_share: 0.0,
            seed: 1,
            run_id: "t".into(),
        });
        let ops: Vec<Op> = (0..5000).map(|_| mix.next()).collect();
        let mut liked = std::collections::HashSet::new();
        let mut keys = HashMap::new();
        for op in &ops {
            if op.retry {
                let first = keys.get(&op.key).expect("a retry resends an earlier key");
                assert_eq!(first, &(op.item.clone(), op.user.clone(), op.like));
                continue;
            }
            assert!(
                keys.insert(op.key.clone(), (op.item.clone(), op.user.clone(), op.like))
                    .is_none(),
                "a first send has a fresh key"
            );
            if op.like {
                liked.insert((op.item.clone(), op.user.clone()));
            } else {
                assert!(
                    liked.remove(&(op.item.clone(), op.user.clone())),
                    "unlike of a like"
                );
            }
        }
        let share = |f: &dyn Fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count() as f64 / 5000.0;
        assert!((0.07..0.13).contains(&share(&|o| o.retry)));
        assert!((0.13..0.23).contains(&share(&|o| !o.like && !o.retry)));
        assert!(share(&|o| o.item == VIRAL_ITEM) > 0.1);
    }

    #[test]
    fn relikes_like_again_an_edge_the_mix_unliked() {
        let mut mix = Mix::new(MixArgs {
            items: 50,
            viral_share: 0.0,
            unlike_share: 0.3,
            retry_share: 0.0,
            relike_share: 0.3,
            relike_after_ms: 0,
            read_share: 0.0,
            seed: 2,
            run_id: "r".into(),
        });
        let mut state: HashMap<(String, String), bool> = HashMap::new();
        let mut relikes = 0;
        for _ in 0..3000 {
            let op = mix.next();
            let edge = (op.item.clone(), op.user.clone());
            match (state.get(&edge), op.like) {
                (None, true) => {}
                (Some(false), true) => relikes += 1,
                (Some(true), false) => {}
                other => panic!("{other:?} for {edge:?}: flips must alternate"),
            }
            state.insert(edge, op.like);
        }
        assert!(relikes > 100, "{relikes} relikes");
    }
}
