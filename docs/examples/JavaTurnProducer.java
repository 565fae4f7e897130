// Appends throughline turns with the Java Kafka client (docs/kafka.md, "Writing turns from another client").
//
// A turn is one record: key = the 32-byte SHA-256 of the canonical project, value = the turn's Avro
// single-object encoding (schemas/completed_turn.v2.avsc), no headers. The client's default
// partitioner (murmur2 of the key) puts it on the partition throughline computes; any compression.type.
//
// Run with the kafka-clients jar and its codec jars on the class path (single-file source launch):
//   java -cp 'kafka-clients-4.1.0.jar:lz4-java-1.8.0.jar:snappy-java-1.1.10.7.jar:zstd-jni-1.5.6-10.jar:slf4j-api-1.7.36.jar' \
//        JavaTurnProducer.java BOOTSTRAP TOPIC < lines
// Input lines: "producer CODEC [TRANSACTIONAL_ID]" starts a producer (closing the one before), then
// "KEY_HEX VALUE_HEX" per record and, for a transactional producer, "begin", "commit" and "abort".
// Output: "PARTITION OFFSET" of every record, in input order, once its producer closes.
// (tests/integration/test_other_clients.py runs this file.)

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaTurnProducer {
    static KafkaProducer<byte[], byte[]> open(String bootstrap, String codec, String transactionalId) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        props.put("acks", "all");
        props.put("enable.idempotence", "true"); // a retried send is neither duplicated nor reordered
        props.put("compression.type", codec); // none, gzip, snappy, lz4 or zstd: throughline reads each
        props.put("max.request.size", "1048576"); // the topic's max.message.bytes (a body is at most 512 KiB)
        if (transactionalId != null) {
            props.put("transactional.id", transactionalId);
        }
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        if (transactionalId != null) {
            producer.initTransactions();
        }
        return producer;
    }

    static void close(KafkaProducer<byte[], byte[]> producer, List<Future<RecordMetadata>> sent) throws Exception {
        producer.close();
        for (Future<RecordMetadata> f : sent) {
            RecordMetadata meta = f.get();
            System.out.println(meta.partition() + " " + meta.offset());
        }
        sent.clear();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        HexFormat hex = HexFormat.of();
        KafkaProducer<byte[], byte[]> producer = null;
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        for (String line; (line = in.readLine()) != null; ) {
            String[] words = line.trim().split(" ");
            switch (words[0]) {
                case "producer" -> {
                    if (producer != null) {
                        close(producer, sent);
                    }
                    producer = open(bootstrap, words[1], words.length > 2 ? words[2] : null);
                }
                case "begin" -> producer.beginTransaction();
                case "commit" -> producer.commitTransaction();
                case "abort" -> {
                    producer.flush(); // the records are in the log; the abort marker then hides them
                    producer.abortTransaction();
                }
                default -> {
                    // No partition given: the default partitioner picks murmur2(key) % partitions.
                    sent.add(producer.send(new ProducerRecord<>(topic, hex.parseHex(words[0]), hex.parseHex(words[1]))));
                }
            }
        }
        if (producer != null) {
            close(producer, sent);
        }
    }
}
