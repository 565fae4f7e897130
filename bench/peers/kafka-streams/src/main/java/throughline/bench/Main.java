package throughline.bench;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.query.FailureReason;
import org.apache.kafka.streams.query.KeyQuery;
import org.apache.kafka.streams.query.Position;
import org.apache.kafka.streams.query.PositionBound;
import org.apache.kafka.streams.query.QueryResult;
import org.apache.kafka.streams.query.RangeQuery;
import org.apache.kafka.streams.query.StateQueryRequest;
import org.apache.kafka.streams.query.StateQueryResult;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * throughline's fold as a Kafka Streams application (the benchmark's peer; see bench/streams_peer.py).
 *
 * <p>One processor folds each source's chain into RocksDB stores (changelogged, the defaults):
 * {@code heads} ('S' + source -> length, chain digest, broken flag; 'P' + project -> head source),
 * {@code turns} (source + seq -> the live turn), {@code applied} (source + turn id -> content digest),
 * {@code superseded} and {@code quarantine}. Every record writes {@code heads}, so that store's
 * position (the input offsets it has absorbed) is what an IQv2 read bounds.
 *
 * <p>Arguments are key=value: bootstrap, topic, app (application.id), state (state dir), guarantee
 * (exactly_once_v2 | at_least_once), schemas (folder of *.avsc), port (0: no HTTP), expect (records
 * to fold, then report, dump and exit; -1: serve until stdin closes), dump (file for the chains).
 */
public final class Main {
  static final byte[] TURN_DOMAIN = "throughline.turn.v1\0".getBytes(StandardCharsets.UTF_8);
  static final byte[] SOURCE_DOMAIN = "throughline.source.v1\0".getBytes(StandardCharsets.UTF_8);
  static final byte[] CHAIN_ORIGIN = sha256("throughline.chain.v1".getBytes(StandardCharsets.UTF_8));
  static final long MAX_SEQ = (1L << 53) - 1;
  static final HexFormat HEX = HexFormat.of();

  static final AtomicLong PROCESSED = new AtomicLong();
  static final AtomicLong QUARANTINED = new AtomicLong();
  static final AtomicLong DUPLICATES = new AtomicLong();
  static final AtomicLong REWINDS = new AtomicLong();
  static final AtomicLong SKIPPED_REPAIRS = new AtomicLong();
  static volatile long expect = -1;
  /**
   * Held around each record's fold and around each page read. Kafka Streams 4.1.0's RocksDBStore takes
   * its store lock then its position lock on put, and an IQv2 query takes them in the other order
   * (fixed upstream after 4.1.0): without this lock a read under ingest deadlocks the stream thread
   * (seen in this bench). It also gives a page one consistent state across its three queries.
   */
  static final Object FOLD_LOCK = new Object();

  /** System.nanoTime() of the first record folded (0 until then). */
  static final AtomicLong FIRST_NS = new AtomicLong();
  /** The last offset folded on each input partition (what /status reports). */
  static final java.util.concurrent.ConcurrentHashMap<Integer, Long> POSITIONS =
      new java.util.concurrent.ConcurrentHashMap<>();
  /**
   * With trace=1 (the bench's freshness sweep only): when each record became readable, as (partition,
   * offset, System.nanoTime()) triples in a ring of TRACE_SIZE, written under FOLD_LOCK after the fold
   * and served by GET /trace. System.nanoTime() is CLOCK_MONOTONIC on Linux, the bench's clock.
   */
  static volatile boolean tracing;
  static final int TRACE_SIZE = 1 << 18;
  static long[] trace = new long[0]; // allocated only when tracing (the memory figures run without)
  static long traced;

  private Main() {}

  static byte[] sha256(byte[]... parts) {
    try {
      MessageDigest md = MessageDigest.getInstance("SHA-256");
      for (byte[] p : parts) {
        md.update(p);
      }
      return md.digest();
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  static byte[] u64(long n) {
    return ByteBuffer.allocate(8).putLong(n).array();
  }

  static byte[] concat(byte[]... parts) {
    int n = 0;
    for (byte[] p : parts) {
      n += p.length;
    }
    ByteBuffer b = ByteBuffer.allocate(n);
    for (byte[] p : parts) {
      b.put(p);
    }
    return b.array();
  }

  /** The canonical project form: NFC, and a lexically normalised path when it contains '/'. */
  static String canonicalProject(String project) {
    String text = Normalizer.normalize(project, Normalizer.Form.NFC);
    if (text.indexOf('/') >= 0) {
      boolean abs = text.startsWith("/");
      List<String> parts = new ArrayList<>();
      for (String seg : text.split("/")) {
        if (seg.isEmpty() || seg.equals(".")) {
          continue;
        }
        if (seg.equals("..")) {
          if (!parts.isEmpty() && !parts.get(parts.size() - 1).equals("..")) {
            parts.remove(parts.size() - 1);
          } else if (!abs) {
            parts.add(seg);
          }
          continue;
        }
        parts.add(seg);
      }
      text = (abs ? "/" : "") + String.join("/", parts);
      if (text.isEmpty()) {
        text = ".";
      }
    }
    return text;
  }

  /** The fold, one record at a time (throughline/core/fold.py's rules). */
  static final class Fold implements Processor<Bytes, byte[], Void, Void> {
    private final Map<Long, GenericDatumReader<GenericRecord>> turnReaders;
    private final Set<Long> repairFingerprints;
    private final Map<String, byte[]> projectHashes = new HashMap<>();
    private ProcessorContext<Void, Void> context;
    private KeyValueStore<Bytes, byte[]> heads;
    private KeyValueStore<Bytes, byte[]> turns;
    private KeyValueStore<Bytes, byte[]> applied;
    private KeyValueStore<Bytes, byte[]> superseded;
    private KeyValueStore<Bytes, byte[]> quarantine;
    private BinaryDecoder decoder;
    private GenericRecord reuse;

    Fold(Map<Long, GenericDatumReader<GenericRecord>> turnReaders, Set<Long> repairFingerprints) {
      this.turnReaders = turnReaders;
      this.repairFingerprints = repairFingerprints;
    }

    @Override
    public void init(ProcessorContext<Void, Void> context) {
      this.context = context;
      heads = context.getStateStore("heads");
      turns = context.getStateStore("turns");
      applied = context.getStateStore("applied");
      superseded = context.getStateStore("superseded");
      quarantine = context.getStateStore("quarantine");
    }

    private byte[] projectHash(String project) {
      return projectHashes.computeIfAbsent(project, p -> {
        String canonical = canonicalProject(p);
        return canonical.equals(p) ? sha256(canonical.getBytes(StandardCharsets.UTF_8)) : null;
      });
    }

    @Override
    public void process(Record<Bytes, byte[]> record) {
      RecordMetadata meta = context.recordMetadata().orElseThrow();
      if (FIRST_NS.get() == 0) {
        FIRST_NS.compareAndSet(0, System.nanoTime());
      }
      try {
        synchronized (FOLD_LOCK) {
          fold(record, meta.partition(), meta.offset());
          if (tracing) {
            int j = 3 * (int) (traced++ % TRACE_SIZE);
            trace[j] = meta.partition();
            trace[j + 1] = meta.offset();
            trace[j + 2] = System.nanoTime();
          }
        }
      } finally {
        POSITIONS.put(meta.partition(), meta.offset());
        long n = PROCESSED.incrementAndGet();
        if (n == expect) {
          context.commit(); // the last record asked for: commit now rather than at the next interval
        }
      }
    }

    private void reject(Bytes source, int partition, long offset, String reason) {
      QUARANTINED.incrementAndGet();
      quarantine.put(Bytes.wrap(ByteBuffer.allocate(12).putInt(partition).putLong(offset).array()),
          reason.getBytes(StandardCharsets.UTF_8));
      if (source != null) {
        Bytes key = headKey(source.get());
        byte[] head = heads.get(key);
        byte[] state = head == null ? headValue(0, CHAIN_ORIGIN, true) : head.clone();
        state[40] = 1;
        heads.put(key, state);
      } else {
        touch();
      }
    }

    /** Every record writes {@code heads}: its position is what reads are bounded by. */
    private void touch() {
      heads.put(Bytes.wrap(new byte[] {'Z'}), new byte[0]);
    }

    private void fold(Record<Bytes, byte[]> record, int partition, long offset) {
      byte[] value = record.value();
      if (value == null || value.length < 10 || (value[0] & 0xff) != 0xC3 || value[1] != 0x01) {
        reject(null, partition, offset, "not an Avro single-object record");
        return;
      }
      long fp = ByteBuffer.wrap(value, 2, 8).order(java.nio.ByteOrder.LITTLE_ENDIAN).getLong();
      GenericDatumReader<GenericRecord> reader = turnReaders.get(fp);
      if (reader == null) {
        if (repairFingerprints.contains(fp)) {
          SKIPPED_REPAIRS.incrementAndGet(); // repairs are not part of this peer's job (see the docs)
          touch();
        } else {
          reject(null, partition, offset, "unknown writer schema fingerprint");
        }
        return;
      }
      GenericRecord r;
      try {
        decoder = DecoderFactory.get().binaryDecoder(value, 10, value.length - 10, decoder);
        r = reader.read(reuse, decoder);
        reuse = r;
      } catch (IOException | RuntimeException e) {
        reject(null, partition, offset, "undecodable: " + e);
        return;
      }
      String project = r.get("project").toString();
      byte[] projectSha = ((GenericData.Fixed) r.get("projectSha256")).bytes();
      byte[] host = r.get("host").toString().getBytes(StandardCharsets.UTF_8);
      byte[] thread = r.get("thread").toString().getBytes(StandardCharsets.UTF_8);
      String turnId = r.get("turnId").toString();
      Object seqObj = r.get("seq");
      long completedAt = (Long) r.get("completedAt");
      byte[] body = r.get("body").toString().getBytes(StandardCharsets.UTF_8);
      byte[] content = ((GenericData.Fixed) r.get("contentDigest")).bytes().clone();
      byte[] tid = turnId.getBytes(StandardCharsets.UTF_8);
      byte[] sourceRaw = sha256(SOURCE_DOMAIN, projectSha, u64(host.length), host, u64(thread.length), thread);
      Bytes source = Bytes.wrap(sourceRaw);

      byte[] expected = projectHash(project);
      String problem = null;
      if (expected == null) {
        problem = "project is not in canonical form";
      } else if (!Arrays.equals(expected, projectSha)) {
        problem = "projectSha256 does not match the project";
      } else if (seqObj != null && ((Long) seqObj < 1 || (Long) seqObj > MAX_SEQ)) {
        problem = "seq out of range";
      } else if (!Arrays.equals(sha256(TURN_DOMAIN, u64(tid.length), tid, u64(completedAt), u64(body.length), body),
          content)) {
        problem = "contentDigest does not match the turn's content";
      } else if (record.key() != null && !Arrays.equals(record.key().get(), projectSha)) {
        problem = "record's project does not match its partition key";
      }
      if (problem != null) {
        // An unsound record is quarantined without marking its source broken (only a record the chain
        // refuses does that), as the projector's fold does.
        reject(null, partition, offset, problem);
        return;
      }
      Bytes appliedKey = Bytes.wrap(concat(sourceRaw, tid));
      byte[] seen = applied.get(appliedKey);
      if (seen != null) {
        if (Arrays.equals(seen, content)) {
          DUPLICATES.incrementAndGet();
          touch();
        } else {
          reject(source, partition, offset, "turn id was already applied with other content");
        }
        return;
      }
      Bytes hk = headKey(sourceRaw);
      byte[] head = heads.get(hk);
      long length = head == null ? 0 : ByteBuffer.wrap(head, 0, 8).getLong();
      byte[] headDigest = head == null ? CHAIN_ORIGIN : Arrays.copyOfRange(head, 8, 40);
      boolean broken = head != null && head[40] == 1;
      long seq = seqObj == null ? length + 1 : (Long) seqObj;
      byte[] base;
      if (seq == length + 1) {
        base = headDigest;
      } else if (seq > length + 1) {
        reject(source, partition, offset, "seq " + seq + " leaves a gap after length " + length);
        return;
      } else {
        // A rewind: turns seq..length are superseded (kept for audit, never served).
        REWINDS.incrementAndGet();
        base = seq == 1 ? CHAIN_ORIGIN : Arrays.copyOfRange(turns.get(turnKey(sourceRaw, seq - 1)), 0, 32);
        for (long k = seq; k <= length; k++) {
          Bytes tk = turnKey(sourceRaw, k);
          byte[] old = turns.get(tk);
          superseded.put(Bytes.wrap(concat(sourceRaw, u64(k), ByteBuffer.allocate(12).putInt(partition)
              .putLong(offset).array())), old);
          if (k > seq) {
            turns.delete(tk);
          }
        }
      }
      byte[] digest = sha256(base, content);
      turns.put(turnKey(sourceRaw, seq), ByteBuffer.allocate(32 + 32 + 8 + 4 + 8 + 4 + tid.length + body.length)
          .put(digest).put(content).putLong(completedAt).putInt(partition).putLong(offset).putInt(tid.length)
          .put(tid).put(body).array());
      applied.put(appliedKey, content);
      heads.put(Bytes.wrap(concat(new byte[] {'P'}, projectSha)), sourceRaw);
      heads.put(hk, headValue(seq, digest, broken));
    }

    @Override
    public void close() {}
  }

  static Bytes headKey(byte[] source) {
    return Bytes.wrap(concat(new byte[] {'S'}, source));
  }

  static byte[] headValue(long length, byte[] digest, boolean broken) {
    return ByteBuffer.allocate(41).putLong(length).put(digest).put((byte) (broken ? 1 : 0)).array();
  }

  static Bytes turnKey(byte[] source, long seq) {
    return Bytes.wrap(concat(source, u64(seq)));
  }

  static Map<String, String> parse(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (String a : args) {
      int i = a.indexOf('=');
      if (i < 0) {
        throw new IllegalArgumentException("expected key=value, got " + a);
      }
      out.put(a.substring(0, i), a.substring(i + 1));
    }
    return out;
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> a = parse(args);
    String bootstrap = a.get("bootstrap");
    String topic = a.get("topic");
    String app = a.get("app");
    expect = Long.parseLong(a.getOrDefault("expect", "-1"));

    // Schemas: every turn version resolves into the newest; repair records are recognised and skipped.
    Map<Long, GenericDatumReader<GenericRecord>> turnReaders = new HashMap<>();
    Set<Long> repairs = new java.util.HashSet<>();
    Schema newest = null;
    int newestVersion = 0;
    Map<Long, Schema> turnSchemas = new HashMap<>();
    try (var files = Files.list(Path.of(a.get("schemas")))) {
      for (Path p : (Iterable<Path>) files.sorted()::iterator) {
        String name = p.getFileName().toString();
        if (!name.endsWith(".avsc")) {
          continue;
        }
        Schema s = new Schema.Parser().parse(p.toFile());
        long fp = SchemaNormalization.parsingFingerprint64(s);
        if (name.startsWith("completed_turn.v")) {
          int v = Integer.parseInt(name.substring("completed_turn.v".length(), name.length() - ".avsc".length()));
          turnSchemas.put(fp, s);
          if (v > newestVersion) {
            newestVersion = v;
            newest = s;
          }
        } else {
          repairs.add(fp);
        }
      }
    }
    for (Map.Entry<Long, Schema> e : turnSchemas.entrySet()) {
      turnReaders.put(e.getKey(), new GenericDatumReader<>(e.getValue(), newest));
    }

    Topology topology = new Topology();
    topology.addSource("turns-in", Serdes.Bytes().deserializer(), Serdes.ByteArray().deserializer(), topic);
    topology.addProcessor("fold", () -> new Fold(turnReaders, repairs), "turns-in");
    for (String store : List.of("heads", "turns", "applied", "superseded", "quarantine")) {
      var builder = Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(store), Serdes.Bytes(),
          Serdes.ByteArray());
      // No record cache: a cache flush writes RocksDB at commit, outside FOLD_LOCK, where an IQv2 query
      // could deadlock with it (see FOLD_LOCK).
      topology.addStateStore(builder, "fold");
    }

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.getOrDefault("guarantee", "exactly_once_v2"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // The Kafka Streams docs' throughput advice for the producer (its changelog writes): larger batches,
    // some linger, lz4. acks stays all (required under exactly-once).
    props.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), "131072");
    props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), "20");
    props.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
    for (Map.Entry<String, String> e : a.entrySet()) {
      if (e.getKey().startsWith("ks.")) {
        props.put(e.getKey().substring(3), e.getValue());
      }
    }

    KafkaStreams streams = new KafkaStreams(topology, props);
    int port = Integer.parseInt(a.getOrDefault("port", "0"));
    HttpServer server = null;
    if (port >= 0 && a.containsKey("port")) {
      // The JDK server writes a response's headers and body in two writes; with Nagle's algorithm on, a
      // keep-alive client's delayed ACK holds the second ~40 ms (measured: every read's p50 was 43.9 ms).
      System.setProperty("sun.net.httpserver.nodelay", "true");
      server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 64);
      server.createContext("/page", ex -> page(ex, streams, topic));
      server.createContext("/status", ex -> {
        String state = streams.state().toString();
        StringBuilder sb = new StringBuilder("{\"state\":\"" + state + "\",\"processed\":" + PROCESSED.get()
            + ",\"positions\":{");
        boolean first = true;
        for (Map.Entry<Integer, Long> e : POSITIONS.entrySet()) {
          sb.append(first ? "" : ",").append('"').append(e.getKey()).append("\":").append(e.getValue());
          first = false;
        }
        respond(ex, 200, sb.append("}}").toString());
      });
      if ("1".equals(a.get("trace"))) {
        trace = new long[3 * TRACE_SIZE];
        tracing = true;
      }
      server.createContext("/trace", ex -> {
        StringBuilder sb = new StringBuilder();
        synchronized (FOLD_LOCK) {
          for (long i = Math.max(0, traced - TRACE_SIZE); i < traced; i++) {
            int j = 3 * (int) (i % TRACE_SIZE);
            sb.append(trace[j]).append(' ').append(trace[j + 1]).append(' ').append(trace[j + 2]).append('\n');
          }
        }
        respond(ex, 200, sb.toString());
      });
      server.setExecutor(Executors.newFixedThreadPool(4));
      server.start();
    }
    long t0 = System.nanoTime();
    streams.start();
    System.out.println("{\"event\":\"started\",\"port\":" + (server == null ? 0 : server.getAddress().getPort())
        + "}");
    System.out.flush();
    if (expect >= 0) {
      double seconds = waitCommitted(bootstrap, topic, app, t0);
      long rss = peakRssKib();
      dump(streams, a.get("dump"));
      streams.close(java.time.Duration.ofSeconds(30));
      if (server != null) {
        server.stop(0);
      }
      System.out.println("{\"event\":\"done\",\"records\":" + PROCESSED.get() + ",\"seconds\":" + seconds
          + ",\"first_record_s\":" + (FIRST_NS.get() - t0) / 1e9          + ",\"quarantined\":" + QUARANTINED.get() + ",\"duplicates\":" + DUPLICATES.get() + ",\"rewinds\":"
          + REWINDS.get() + ",\"skipped_repairs\":" + SKIPPED_REPAIRS.get() + ",\"rss\":" + rss + "}");
      System.out.flush();
      System.exit(0);
    }
    // Serve until the bench closes stdin.
    InputStream in = System.in;
    byte[] buf = new byte[256];
    while (in.read(buf) >= 0) {
      // nothing: stdin carries no commands
    }
    if (server != null) {
      server.stop(0);
    }
    streams.close(java.time.Duration.ofSeconds(30));
    System.exit(0);
  }

  /** The process's peak resident set (VmHWM, KiB), 0 when unknown. */
  static long peakRssKib() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
        if (line.startsWith("VmHWM:")) {
          return Long.parseLong(line.replaceAll("[^0-9]", ""));
        }
      }
    } catch (IOException | NumberFormatException e) {
      return 0;
    }
    return 0;
  }

  /** Seconds from start until the group's committed offsets reach the log's end on every partition. */
  static double waitCommitted(String bootstrap, String topic, String app, long t0) throws Exception {
    Properties ap = new Properties();
    ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(ap)) {
      var desc = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
      Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
      for (var p : desc.partitions()) {
        latest.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest());
      }
      Map<TopicPartition, Long> ends = new HashMap<>();
      admin.listOffsets(latest).all().get().forEach((tp, info) -> ends.put(tp, info.offset()));
      long deadline = System.nanoTime() + 1_800_000_000_000L;
      while (System.nanoTime() < deadline) {
        if (PROCESSED.get() >= expect) {
          Map<TopicPartition, OffsetAndMetadata> got =
              admin.listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata().get();
          boolean all = true;
          for (var e : ends.entrySet()) {
            OffsetAndMetadata c = got.get(e.getKey());
            if (e.getValue() > 0 && (c == null || c.offset() < e.getValue())) {
              all = false;
              break;
            }
          }
          if (all) {
            return (System.nanoTime() - t0) / 1e9;
          }
          Thread.sleep(10);
        } else {
          Thread.sleep(20);
        }
      }
      throw new IllegalStateException("not committed within 30 minutes");
    }
  }

  /** Every source's chain (hex source, length, hex head digest, broken) and the quarantine count. */
  static void dump(KafkaStreams streams, String path) throws IOException {
    if (path == null) {
      return;
    }
    ReadOnlyKeyValueStore<Bytes, byte[]> store = null;
    for (int i = 0; i < 600 && store == null; i++) {
      try {
        store = streams.store(StoreQueryParameters.fromNameAndType("heads", QueryableStoreTypes.keyValueStore()));
      } catch (RuntimeException e) {
        try {
          Thread.sleep(100);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          return;
        }
      }
    }
    try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(Path.of(path)));
        KeyValueIterator<Bytes, byte[]> it = store.all()) {
      while (it.hasNext()) {
        KeyValue<Bytes, byte[]> kv = it.next();
        byte[] k = kv.key.get();
        if (k[0] != 'S') {
          continue;
        }
        ByteBuffer v = ByteBuffer.wrap(kv.value);
        long length = v.getLong();
        byte[] d = new byte[32];
        v.get(d);
        w.println(HEX.formatHex(Arrays.copyOfRange(k, 1, 33)) + " " + length + " " + HEX.formatHex(d) + " "
            + v.get());
      }
    }
  }

  /**
   * GET /page?project=HEX&partition=P&offset=O&limit=L: the latest L turns of the project's head source,
   * from IQv2 queries bounded by (topic, P, O); 409 'not up to bound' when the store has not absorbed O.
   */
  static void page(HttpExchange ex, KafkaStreams streams, String topic) throws IOException {
    int status;
    String body;
    synchronized (FOLD_LOCK) {
      String[] answer = pageAnswer(ex, streams, topic);
      status = Integer.parseInt(answer[0]);
      body = answer[1];
    }
    respond(ex, status, body);
  }

  static String[] pageAnswer(HttpExchange ex, KafkaStreams streams, String topic) {
    try {
      Map<String, String> q = new HashMap<>();
      String raw = ex.getRequestURI().getRawQuery();
      if (raw != null) {
        for (String kv : raw.split("&")) {
          int i = kv.indexOf('=');
          if (i > 0) {
            q.put(kv.substring(0, i), URLDecoder.decode(kv.substring(i + 1), StandardCharsets.UTF_8));
          }
        }
      }
      byte[] project = HEX.parseHex(q.get("project"));
      int partition = Integer.parseInt(q.get("partition"));
      long offset = Long.parseLong(q.getOrDefault("offset", "-1"));
      int limit = Integer.parseInt(q.getOrDefault("limit", "10"));
      PositionBound bound = offset < 0 ? PositionBound.unbounded()
          : PositionBound.at(Position.emptyPosition().withComponent(topic, partition, offset));
      QueryResult<byte[]> head = one(streams, "heads", KeyQuery.withKey(Bytes.wrap(concat(new byte[] {'P'}, project))),
          bound, partition);
      if (!head.isSuccess()) {
        boolean notUp = head.getFailureReason() == FailureReason.NOT_UP_TO_BOUND;
        return new String[] {notUp ? "409" : "503", "{\"error\":\"" + (notUp ? "not_up_to_bound"
            : head.getFailureReason()) + "\"}"};
      }
      if (head.getResult() == null) {
        return new String[] {"404", "{\"error\":\"unknown_project\"}"};
      }
      byte[] source = head.getResult();
      QueryResult<byte[]> state = one(streams, "heads", KeyQuery.withKey(headKey(source)), PositionBound.unbounded(),
          partition);
      ByteBuffer sv = ByteBuffer.wrap(state.getResult());
      long length = sv.getLong();
      byte[] digest = new byte[32];
      sv.get(digest);
      boolean broken = sv.get() == 1;
      long from = Math.max(1, length - limit + 1);
      QueryResult<KeyValueIterator<Bytes, byte[]>> range = one(streams, "turns",
          RangeQuery.withRange(turnKey(source, from), turnKey(source, length)), PositionBound.unbounded(), partition);
      StringBuilder sb = new StringBuilder(4096);
      sb.append("{\"length\":").append(length).append(",\"chainDigest\":\"").append(HEX.formatHex(digest))
          .append("\",\"broken\":").append(broken).append(",\"position\":")
          .append(head.getPosition() == null ? "null" : "\"" + head.getPosition() + "\"").append(",\"turns\":[");
      boolean first = true;
      try (KeyValueIterator<Bytes, byte[]> it = range.getResult()) {
        while (it.hasNext()) {
          KeyValue<Bytes, byte[]> kv = it.next();
          ByteBuffer v = ByteBuffer.wrap(kv.value);
          v.position(64);
          long completedAt = v.getLong();
          v.getInt();
          v.getLong();
          int tl = v.getInt();
          String tid = new String(kv.value, v.position(), tl, StandardCharsets.UTF_8);
          String body = new String(kv.value, v.position() + tl, kv.value.length - v.position() - tl,
              StandardCharsets.UTF_8);
          long seq = ByteBuffer.wrap(kv.key.get(), 32, 8).getLong();
          sb.append(first ? "" : ",").append("{\"seq\":").append(seq).append(",\"turnId\":");
          json(sb, tid);
          sb.append(",\"completedAt\":").append(completedAt).append(",\"body\":");
          json(sb, body);
          sb.append('}');
          first = false;
        }
      }
      sb.append("]}");
      return new String[] {"200", sb.toString()};
    } catch (RuntimeException e) {
      return new String[] {"400", "{\"error\":\"bad_request\"}"};
    }
  }

  @SuppressWarnings("unchecked")
  static <R> QueryResult<R> one(KafkaStreams streams, String store, org.apache.kafka.streams.query.Query<R> query,
      PositionBound bound, int partition) {
    StateQueryRequest<R> req = StateQueryRequest.inStore(store).withQuery(query).withPositionBound(bound)
        .withPartitions(Set.of(partition));
    StateQueryResult<R> res = streams.query(req);
    QueryResult<R> r = res.getPartitionResults().get(partition);
    if (r == null) {
      return (QueryResult<R>) QueryResult.forFailure(FailureReason.NOT_PRESENT, "partition not local");
    }
    return r;
  }

  static void json(StringBuilder sb, String s) {
    sb.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"' || c == '\\') {
        sb.append('\\').append(c);
      } else if (c < 0x20) {
        sb.append(String.format("\\u%04x", (int) c));
      } else {
        sb.append(c);
      }
    }
    sb.append('"');
  }

  static void respond(HttpExchange ex, int status, String body) throws IOException {
    byte[] out = body.getBytes(StandardCharsets.UTF_8);
    ex.getResponseHeaders().set("Content-Type", "application/json");
    ex.sendResponseHeaders(status, out.length);
    try (OutputStream os = ex.getResponseBody()) {
      os.write(out);
    }
  }
}
