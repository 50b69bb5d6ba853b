package likes.peer;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The physical limit of the bench: the whole topic read once by a plain consumer in batches of
 * up to 5000 records, every record decoded. Prints "events seconds" (from the first poll, so
 * the JVM's start is not counted) on stdout.
 *
 * <p>Usage: RawConsumer bootstrap topic partitions expected-records
 */
public final class RawConsumer {
  public static void main(String[] a) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a[0]);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 5000);
    p.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, 64 << 20);
    p.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, 8 << 20);
    long expected = Long.parseLong(a[3]);
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
      List<TopicPartition> tps = new ArrayList<>();
      for (int i = 0; i < Integer.parseInt(a[2]); i++) {
        tps.add(new TopicPartition(a[1], i));
      }
      c.assign(tps);
      c.seekToBeginning(tps);
      long n = 0;
      long chars = 0;
      long started = System.nanoTime();
      while (n < expected) {
        if (System.nanoTime() - started > 600_000_000_000L) {
          System.err.println("raw consume: timed out after 600 s at " + n + " records");
          System.exit(1);
        }
        ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(500));
        for (ConsumerRecord<byte[], byte[]> r : rs) {
          LikeEvent e = LikeEvent.parse(r.value());
          chars += e == null ? 0 : e.item.length();
          n++;
        }
      }
      double s = (System.nanoTime() - started) / 1e9;
      System.out.println(n + " " + s + " " + (chars == -1 ? "" : ""));
    }
  }
}
