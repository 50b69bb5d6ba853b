package likes.peer;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.apache.kafka.streams.state.Stores;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;

/**
 * The likes topology in Kafka Streams, exactly-once v2: the peer `likes-tools bench topology`
 * measures `likes` against.
 *
 * <ol>
 *   <li>Dedupe: per edge (item, user) the highest op_id seen and its state, in a persistent
 *       RocksDB store with its changelog topic (Kafka Streams' default). An event whose op_id is
 *       not above the stored one is a duplicate or superseded and dies; a newer one emits the
 *       change of the item's count (+1, -1, or nothing), stamped with the event's time.
 *       Records that are not a LikeEvent go to a dead-letter topic.
 *   <li>Repartition by item (as many partitions as likes.deltas).
 *   <li>1-second tumbling windows on event time, summed per item; with record caching, each
 *       (item, window) is emitted at most once per commit.
 *   <li>Output: key item, value = window start (8 bytes) + the window's sum (8 bytes).
 * </ol>
 *
 * <p>An edge this instance has never seen counts as UNLIKED before it: the bench's input has
 * every edge start at op_id 1, so that equals what likes's stage 1 derives.
 *
 * <p>Usage: StreamsPeer bootstrap app-id input output dlq repartition-partitions window-ms
 * state-dir threads
 */
public final class StreamsPeer {
  /** Stage-1-sized RocksDB: 64 MiB block cache, 2 x 32 MiB write buffers. */
  public static final class Rocks implements RocksDBConfigSetter {
    private static final LRUCache CACHE = new LRUCache(64L << 20);

    @Override
    public void setConfig(String store, Options options, Map<String, Object> configs) {
      BlockBasedTableConfig table = (BlockBasedTableConfig) options.tableFormatConfig();
      table.setBlockCache(CACHE);
      options.setTableFormatConfig(table);
      options.setWriteBufferSize(32L << 20);
      options.setMaxWriteBufferNumber(2);
    }

    @Override
    public void close(String store, Options options) {}
  }

  private static final class Invalid {
    final byte[] bytes;

    Invalid(byte[] bytes) {
      this.bytes = bytes;
    }
  }

  /** Stage 1: per-edge dedupe by op_id; emits (item, ±1) at the event's time. */
  private static final class Dedupe implements Processor<byte[], Object, String, Long> {
    private ProcessorContext<String, Long> ctx;
    private KeyValueStore<String, Long> edges;

    @Override
    public void init(ProcessorContext<String, Long> ctx) {
      this.ctx = ctx;
      this.edges = ctx.getStateStore("edges");
    }

    @Override
    public void process(Record<byte[], Object> r) {
      LikeEvent e = (LikeEvent) r.value();
      String key = e.item + '\u0000' + e.user;
      Long seen = edges.get(key);
      long seenOp = seen == null ? 0 : seen >>> 1;
      boolean seenLiked = seen != null && (seen & 1) == 1;
      if (e.opId <= seenOp) {
        return;
      }
      edges.put(key, (e.opId << 1) | (e.liked ? 1 : 0));
      long delta = (e.liked ? 1 : 0) - (seenLiked ? 1 : 0);
      if (delta != 0) {
        ctx.forward(new Record<>(e.item, delta, e.eventTimeMs));
      }
    }
  }

  public static void main(String[] a) throws Exception {
    if (a.length != 9) {
      System.err.println(
          "usage: StreamsPeer bootstrap app-id input output dlq repartition-partitions window-ms state-dir threads");
      System.exit(2);
    }
    String bootstrap = a[0];
    String appId = a[1];
    String input = a[2];
    String output = a[3];
    String dlq = a[4];
    int partitions = Integer.parseInt(a[5]);
    long windowMs = Long.parseLong(a[6]);

    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(
        Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore("edges"), Serdes.String(), Serdes.Long()));
    KStream<byte[], Object> in =
        b.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .mapValues(
                v -> {
                  LikeEvent e = LikeEvent.parse(v);
                  return e != null ? (Object) e : new Invalid(v);
                });
    in.split(Named.as("in-"))
        .branch(
            (k, v) -> v instanceof Invalid,
            Branched.withConsumer(
                s ->
                    s.mapValues(v -> ((Invalid) v).bytes)
                        .to(dlq, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()))))
        .defaultBranch(
            Branched.withConsumer(
                s ->
                    s.process(Dedupe::new, "edges")
                        .repartition(
                            Repartitioned.with(Serdes.String(), Serdes.Long())
                                .withName("deltas")
                                .withNumberOfPartitions(partitions))
                        .groupByKey()
                        .windowedBy(
                            TimeWindows.ofSizeAndGrace(
                                Duration.ofMillis(windowMs), Duration.ofMinutes(5)))
                        .reduce(
                            Long::sum,
                            Materialized.with(Serdes.String(), Serdes.Long()))
                        .toStream()
                        .map(
                            (w, sum) ->
                                KeyValue.pair(
                                    w.key(),
                                    ByteBuffer.allocate(16)
                                        .putLong(w.window().start())
                                        .putLong(sum)
                                        .array()))
                        .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()))));

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(a[8]));
    p.put(StreamsConfig.STATE_DIR_CONFIG, a[7]);
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 64L << 20);
    p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, Rocks.class);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), 5000);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.FETCH_MAX_BYTES_CONFIG), 64 << 20);
    p.put(
        StreamsConfig.consumerPrefix(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG), 8 << 20);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    p.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
    p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);
    p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), 256 << 10);

    KafkaStreams streams = new KafkaStreams(b.build(), p);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(20));
                  stopped.countDown();
                }));
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println("peer: stream thread failed: " + e);
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.start();
    System.err.println("peer: started " + appId + " at " + System.currentTimeMillis());
    stopped.await();
  }
}
