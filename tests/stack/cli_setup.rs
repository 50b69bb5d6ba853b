//! `likes migrate` and `likes topics`, run as the real binary against the real stack: twice
//! without error and without change, and `topics` refusing a partition-count change.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};

use likes::topology::Topology;
use likes::{cql, kafka};

/// Every column of every table of the keyspace: (table, column, kind, position, type).
async fn schema_snapshot(
    session: &scylla::client::session::Session,
    ks: &str,
) -> Vec<(String, String, String, i32, String)> {
    let mut rows: Vec<_> = session
        .query_unpaged(
            "SELECT table_name, column_name, kind, position, type FROM system_schema.columns \
             WHERE keyspace_name = ?",
            (ks,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows::<(String, String, String, i32, String)>()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_creates_once_and_then_changes_nothing() {
    let settings = crate::common::settings("migrate");
    let env = crate::common::env_for(&settings);
    let ks = &settings.cql.keyspace;

    let (ok, out, err) = crate::common::likes(&["migrate"], &env);
    assert!(ok, "first migrate failed: {err}");
    assert!(out.contains(&format!("keyspace {ks}: created")), "{out}");
    assert!(
        out.contains("table") && out.contains("edges: created"),
        "{out}"
    );
    assert!(
        out.contains("topology recorded: buckets = 64, window = 1000 ms"),
        "{out}"
    );

    let session = cql::connect(&settings.cql).await.unwrap();
    let before = schema_snapshot(&session, ks).await;
    let tables: std::collections::BTreeSet<_> = before.iter().map(|r| r.0.clone()).collect();
    assert_eq!(
        tables.into_iter().collect::<Vec<_>>(),
        [
            "edges",
            "edges_by_user",
            "erased_users",
            "erasures",
            "erasures_by_minute",
            "like_counts",
            "outbox",
            "outbox_floor",
            "outbox_lease",
            "ranges",
            "retractions",
            "topology_record"
        ]
    );

    let (ok, out, err) = crate::common::likes(&["migrate"], &env);
    assert!(ok, "second migrate failed: {err}");
    assert!(out.contains("nothing to do"), "{out}");
    assert!(!out.contains("created"), "{out}");
    assert_eq!(schema_snapshot(&session, ks).await, before);

    // A keyspace of the version before one-Paxos-round writes: edges without recent_keys, and
    // the idempotency table. The column is added; the old table is named, never dropped.
    for q in [
        format!("ALTER TABLE {ks}.edges DROP recent_keys"),
        format!("CREATE TABLE {ks}.idempotency (user_id text, key text, response text, PRIMARY KEY (user_id, key))"),
    ] {
        session.query_unpaged(q, ()).await.unwrap();
    }
    let (ok, out, err) = crate::common::likes(&["migrate"], &env);
    assert!(ok, "migrate of an older keyspace failed: {err}");
    assert!(out.contains("edges: added column recent_keys"), "{out}");
    assert!(
        out.contains(&format!("DROP TABLE {ks}.idempotency")),
        "the retired table is named with its drop command: {out}"
    );
    let (ok, out, _) = crate::common::likes(&["migrate"], &env);
    assert!(ok && out.contains("nothing to do"), "{out}");
    session
        .query_unpaged(format!("DROP TABLE {ks}.idempotency"), ())
        .await
        .unwrap();

    // A table that drifted from the spec is reported, never altered.
    session
        .query_unpaged(format!("ALTER TABLE {ks}.like_counts ADD extra int"), ())
        .await
        .unwrap();
    let (ok, _, err) = crate::common::likes(&["migrate"], &env);
    assert!(!ok);
    assert!(
        err.contains("like_counts") && err.contains("column extra"),
        "{err}"
    );

    session
        .query_unpaged(format!("DROP KEYSPACE {ks}"), ())
        .await
        .unwrap();
}

/// Partitions and the spec'd configs of every topic under the prefix.
async fn topics_snapshot(
    settings: &likes::config::Settings,
    topology: &Topology,
    expected: &[&str],
) -> BTreeMap<String, (i32, BTreeMap<String, Option<String>>)> {
    // The topics the test made must be waited for: read once right after their create, the
    // metadata may not list them yet (issue 60: 0 of 4 on a fresh machine). A topic missing
    // after the bound fails the test by name. Those not expected are read once, after the
    // expected ones are listed, so "nothing else was created" is read from the same view.
    let (s, want) = (
        settings.clone(),
        expected.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
    );
    let md = tokio::task::spawn_blocking(move || {
        let client: rdkafka::consumer::BaseConsumer =
            kafka::client_config(&s.kafka).create().unwrap();
        if let Err(e) = likes_testkit::topics::partition_counts(
            &client,
            &want,
            likes_testkit::topics::METADATA_BOUND,
        ) {
            panic!("{e}");
        }
        rdkafka::consumer::Consumer::fetch_metadata(&client, None, Duration::from_secs(30)).unwrap()
    })
    .await
    .unwrap();
    let admin = kafka::admin(&settings.kafka).unwrap();
    let mut out = BTreeMap::new();
    for (_, spec) in topology.topics() {
        let name = settings.topic(&spec.name);
        let Some(t) = md
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none())
        else {
            assert!(
                !expected.contains(&name.as_str()),
                "{name} listed a moment ago, gone now"
            );
            continue;
        };
        let resource = described(&admin, &name).await;
        let configs = spec
            .config
            .keys()
            .map(|k| (k.clone(), resource.get(k).and_then(|e| e.value.clone())))
            .collect();
        out.insert(name, (t.partitions().len() as i32, configs));
    }
    out
}

/// `topic`'s configs, asked again while the broker answering does not know the topic yet
/// (its metadata may lag the controller's), for at most [`likes_testkit::topics::METADATA_BOUND`].
async fn described(
    admin: &rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    topic: &str,
) -> rdkafka::admin::ConfigResource {
    let deadline = std::time::Instant::now() + likes_testkit::topics::METADATA_BOUND;
    loop {
        let answer = admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.into_iter().next().unwrap().map_err(|e| e.to_string()));
        match answer {
            Ok(resource) => return resource,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("describe_configs {topic}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("describe_configs {topic}: {e}"),
        }
    }
}

/// Waits (up to 15 s) until `describe_configs` shows `key = value` on `topic`.
async fn wait_for_config(
    admin: &rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    topic: &str,
    key: &str,
    value: &str,
) {
    for _ in 0..150 {
        let resource = described(admin, topic).await;
        if resource.get(key).and_then(|e| e.value.as_deref()) == Some(value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{topic}: {key} never became {value}");
}

async fn delete_topics(settings: &likes::config::Settings, topology: &Topology) {
    let admin = kafka::admin(&settings.kafka).unwrap();
    let names: Vec<String> = topology
        .topics()
        .iter()
        .map(|(_, s)| settings.topic(&s.name))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = admin.delete_topics(&refs, &AdminOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_twice_creates_once_then_changes_nothing_and_repairs_config_drift() {
    let settings = crate::common::settings("topics");
    let env = crate::common::env_for(&settings);
    let topology = Topology::load(None).unwrap();

    let (ok, out, err) = crate::common::likes(&["topics"], &env);
    assert!(ok, "first topics failed: {err}");
    let events = settings.topic("likes.events");
    assert!(
        out.contains(&format!("topic {events}: created (16 partitions)")),
        "{out}"
    );

    let all: Vec<String> = topology
        .topics()
        .iter()
        .map(|(_, s)| settings.topic(&s.name))
        .collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let first = topics_snapshot(&settings, &topology, &all).await;
    assert_eq!(first.len(), 4, "{first:?}");
    for (_, spec) in topology.topics() {
        let (partitions, configs) = &first[&settings.topic(&spec.name)];
        assert_eq!(*partitions, spec.partitions, "{}", spec.name);
        for (k, v) in &spec.config {
            assert_eq!(configs[k].as_deref(), Some(v.as_str()), "{} {k}", spec.name);
        }
    }

    let (ok, out, err) = crate::common::likes(&["topics"], &env);
    assert!(ok, "second topics failed: {err}");
    assert!(out.contains("nothing to do"), "{out}");
    assert_eq!(topics_snapshot(&settings, &topology, &all).await, first);

    // Someone changed a config by hand: topics puts the spec back, then is quiet again. A
    // config topology/ does not name (an operator's segment.ms) stays as the operator set it.
    let deltas = settings.topic("likes.deltas");
    let admin = kafka::admin(&settings.kafka).unwrap();
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&deltas))
        .set("message.timestamp.type", "CreateTime")
        .set("retention.ms", "604800000")
        .set("segment.ms", "3600000");
    admin
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    // KRaft applies a config change through the metadata log: wait until it is visible.
    wait_for_config(&admin, &deltas, "message.timestamp.type", "CreateTime").await;
    let (ok, out, err) = crate::common::likes(&["topics"], &env);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("topic {deltas}: config message.timestamp.type")),
        "{out}"
    );
    wait_for_config(&admin, &deltas, "message.timestamp.type", "LogAppendTime").await;
    let resource = described(&admin, &deltas).await;
    assert_eq!(
        resource.get("segment.ms").and_then(|e| e.value.as_deref()),
        Some("3600000"),
        "topics must not revert a config topology/ does not name"
    );
    let (ok, out, _) = crate::common::likes(&["topics"], &env);
    assert!(ok && out.contains("nothing to do"), "{out}");
    assert_eq!(topics_snapshot(&settings, &topology, &all).await, first);

    delete_topics(&settings, &topology).await;
}

/// The events topic made by hand with 3 partitions, where topology/ says 16.
async fn create_with_three_partitions(settings: &likes::config::Settings, events: &str) {
    let admin = kafka::admin(&settings.kafka).unwrap();
    admin
        .create_topics(
            &[NewTopic::new(events, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()
        .remove(0)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_refuses_to_change_a_partition_count_and_creates_nothing() {
    let settings = crate::common::settings("refuse");
    let env = crate::common::env_for(&settings);
    let topology = Topology::load(None).unwrap();
    let events = settings.topic("likes.events");

    create_with_three_partitions(&settings, &events).await;

    let (ok, _, err) = crate::common::likes(&["topics"], &env);
    assert!(!ok, "topics must refuse");
    assert!(
        err.contains(&events) && err.contains("3 partitions") && err.contains("refusing"),
        "{err}"
    );

    let after = topics_snapshot(&settings, &topology, &[&events]).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        [&events],
        "nothing else may be created"
    );
    assert_eq!(after[&events].0, 3, "the partition count must not change");

    delete_topics(&settings, &topology).await;
}

/// The same refusal when the metadata `likes topics` reads does not list the topic yet (a
/// broker's metadata lags a create, or another `likes topics` created it just after the read):
/// the create's "already exists" is checked like an existing topic. Before, it was taken as
/// created as asked, and the test above passed or failed with the broker's lag (it failed when
/// the tests ran beside each other). Fail point `topics-stale-metadata`: the read lists nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn topics_refuses_a_partition_count_it_learns_of_only_from_the_create() {
    let settings = crate::common::settings("refuselate");
    let mut env = crate::common::env_for(&settings);
    env.push(("FAILPOINTS", "topics-stale-metadata=return".to_string()));
    let topology = Topology::load(None).unwrap();
    let events = settings.topic("likes.events");

    create_with_three_partitions(&settings, &events).await;

    let (ok, out, err) = crate::common::likes(&["topics"], &env);
    assert!(!ok, "topics must refuse: {out}");
    assert!(
        err.contains(&events) && err.contains("3 partitions") && err.contains("refusing"),
        "{err}"
    );
    let after = topics_snapshot(&settings, &topology, &[&events]).await;
    assert_eq!(after[&events].0, 3, "the partition count must not change");

    delete_topics(&settings, &topology).await;
}

/// The race of issue 60, held: the metadata is read while it does not list a topic, and the
/// topic is created only after that first miss. Read once (a bound of zero, the shape the
/// snapshot had), the answer names the missing topic; waited for, the same read returns every
/// partition once the create has landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_read_before_the_metadata_lists_it_is_waited_for_not_skipped() {
    let settings = crate::common::settings("metalag");
    let topic = settings.topic("likes.events");
    let s = settings.clone();
    let t = topic.clone();
    let runtime = tokio::runtime::Handle::current();
    let (once, waited) = tokio::task::spawn_blocking(move || {
        let client: rdkafka::consumer::BaseConsumer =
            kafka::client_config(&s.kafka).create().unwrap();
        let once = likes_testkit::topics::partitions(&client, &t, Duration::ZERO);
        let waited = likes_testkit::topics::partitions_after_misses(
            &client,
            &t,
            likes_testkit::topics::METADATA_BOUND,
            |miss| {
                if miss == 1 {
                    runtime.block_on(create_with_three_partitions(&s, &t));
                }
            },
        );
        (once, waited)
    })
    .await
    .unwrap();
    let missing = once.expect_err("a topic not created yet cannot be listed");
    assert!(
        missing.contains(&topic),
        "the error names the topic: {missing}"
    );
    assert_eq!(waited.unwrap(), vec![0, 1, 2]);

    kafka::admin(&settings.kafka)
        .unwrap()
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .unwrap();
}
