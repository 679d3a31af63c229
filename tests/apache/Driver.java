import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * Real traffic through a RocketMQ broker with the 4.x remoting client (rocketmq-client), for the tests
 * of tests/apache_rocketmq.py.
 *
 * <pre>
 * java Driver NAMESRV STEP [-- STEP ...]
 *
 * STEP is a command and its name=value options, run in order:
 *   consume group=G topics=T1,T2 [model=clustering|broadcasting] [orderly=false] [fail=K1,K2]
 *           [maxReconsume=2] [retryLevel=0] [expect=N] [groupExpect=N] [keysFile=PATH] [instance=NAME]
 *       starts a push consumer (from the first offset). It answers RECONSUME_LATER for the messages
 *       whose key is in fail, so that after maxReconsume retries they go to %DLQ%G; retryLevel is
 *       the delay level it asks for the retry (0: the broker's, 3 + reconsume times). The run waits
 *       until it consumed expect distinct keys, the consumers of G in this run together groupExpect
 *       distinct keys (instances of one clustering group share its queues), or every key of
 *       keysFile (one a line), and each fail key was delivered maxReconsume + 1 times.
 *   send topic=T kind=normal|ordered|batch|delay|tx [count=N] [prefix=P] [tag=TAG] [group=PG]
 *        [orderKeys=A,B,C] [level=L] [outcomes=commit,rollback,check-commit,check-rollback]
 *       sends count messages, keyed P-0, P-1, ...: ordered ones through a MessageQueueSelector by
 *       their order key (orderKeys in turn), a batch in one send, delay ones at delay level L, and
 *       for tx each outcome count times: committed or rolled back by the local transaction, or left
 *       unknown and committed or rolled back by the check-back (which answers from the message's
 *       real outcome). The run waits until every unknown one was checked.
 *   flood topic=T [prefix=P] [size=BYTES]
 *       sends one message at a time until standard input closes; a failed send is printed and
 *       retried after 100 ms with the next key.
 *   topic name=T [queues=4] [type=NORMAL|FIFO|DELAY|TRANSACTION] [order=false]
 *       creates or updates the topic on every master of the cluster, as mqadmin updateTopic does
 *       (the gRPC proxy checks the message.type attribute on every send).
 *   group name=G [orderly=false] [retryMaxTimes=16]
 *       creates or updates the subscription group on every master, as mqadmin updateSubGroup does.
 *   wait seconds=S
 *       how long the run waits for the consumers and the check-backs (default 90).
 *   mqadmin SUBCOMMAND [ARG ...]
 *       runs the admin tool's SUBCOMMAND (MQAdminStartup, as mqadmin does) against the name server,
 *       its arguments as given (not name=value); its output is one line, event mqadmin. Many admin
 *       commands in one JVM instead of one JVM each.
 * </pre>
 *
 * It prints one JSON line per send result (event sent), per delivery (event consumed), per
 * check-back (event checked) and per failed flood send (event error), then a summary line and
 * "done". It exits 1 when a wait was not met, 2 on a bad argument.
 */
public final class Driver {
    private static final Object OUT = new Object();
    // the process's standard output: the admin tool's output is captured by replacing System.out
    private static final PrintStream STDOUT = System.out;
    private static final List<Runnable> SHUTDOWN = new ArrayList<>();
    private static final List<Expectation> EXPECTATIONS = new ArrayList<>();
    private static final Map<String, DefaultMQProducer> PRODUCERS = new HashMap<>();
    // the keys each consumer group consumed in this run, over its instances
    private static final Map<String, Set<String>> GROUP_SUCCEEDED = new ConcurrentHashMap<>();
    private static String namesrv;
    private static long waitSeconds = 90;

    private Driver() {
    }

    /** A condition the run waits for before it ends. */
    private interface Expectation {
        boolean met();

        String describe();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: java Driver NAMESRV STEP [-- STEP ...] (see the class comment)");
            System.exit(2);
        }
        namesrv = args[0];
        List<List<String>> steps = new ArrayList<>();
        List<String> current = new ArrayList<>();
        for (String arg : Arrays.copyOfRange(args, 1, args.length)) {
            if (arg.equals("--")) {
                steps.add(current);
                current = new ArrayList<>();
            } else {
                current.add(arg);
            }
        }
        steps.add(current);
        for (List<String> step : steps) {
            if (step.get(0).equals("mqadmin")) {
                mqadmin(step.subList(1, step.size()));
                continue;
            }
            Map<String, String> options = options(step.subList(1, step.size()));
            switch (step.get(0)) {
                case "consume":
                    consume(options);
                    break;
                case "send":
                    send(options);
                    break;
                case "flood":
                    flood(options);
                    break;
                case "topic":
                    topic(options);
                    break;
                case "group":
                    group(options);
                    break;
                case "wait":
                    waitSeconds = Long.parseLong(required(options, "seconds"));
                    break;
                default:
                    System.err.println("unknown step " + step.get(0));
                    System.exit(2);
            }
        }
        long deadline = System.currentTimeMillis() + waitSeconds * 1000;
        boolean met = false;
        while (!(met = EXPECTATIONS.stream().allMatch(Expectation::met)) && System.currentTimeMillis() < deadline) {
            Thread.sleep(50);
        }
        List<String> unmet = new ArrayList<>();
        for (Expectation e : EXPECTATIONS) {
            if (!e.met()) {
                unmet.add(e.describe());
            }
        }
        for (Runnable r : SHUTDOWN) {
            r.run();
        }
        Map<String, Object> summary = new LinkedHashMap<>();
        summary.put("event", "summary");
        summary.put("met", met);
        summary.put("unmet", String.join("; ", unmet));
        emit(summary);
        synchronized (OUT) {
            STDOUT.println("done");
            STDOUT.flush();
        }
        System.exit(met ? 0 : 1);
    }

    // ------------------------------------------------------------------------------------------ admin

    private static DefaultMQAdminExt admin;

    private static List<String> masters() throws Exception {
        if (admin == null) {
            admin = new DefaultMQAdminExt();
            admin.setNamesrvAddr(namesrv);
            admin.start();
            SHUTDOWN.add(admin::shutdown);
        }
        List<String> addresses = new ArrayList<>();
        ClusterInfo info = admin.examineBrokerClusterInfo();
        for (BrokerData broker : info.getBrokerAddrTable().values()) {
            String master = broker.getBrokerAddrs().get(0L);
            if (master != null) {
                addresses.add(master);
            }
        }
        if (addresses.isEmpty()) {
            throw new IllegalStateException("no master broker registered in " + namesrv);
        }
        return addresses;
    }

    private static void topic(Map<String, String> o) throws Exception {
        int queues = Integer.parseInt(o.getOrDefault("queues", "4"));
        TopicConfig config = new TopicConfig(required(o, "name"), queues, queues, PermName.PERM_READ | PermName.PERM_WRITE);
        config.setOrder(Boolean.parseBoolean(o.getOrDefault("order", "false")));
        if (o.containsKey("type")) {
            Map<String, String> attributes = new HashMap<>();
            attributes.put("+message.type", o.get("type"));
            config.setAttributes(attributes);
        }
        for (String address : masters()) {
            admin.createAndUpdateTopicConfig(address, config);
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "topic");
        line.put("name", config.getTopicName());
        line.put("config", config.toString());
        emit(line);
    }

    private static void group(Map<String, String> o) throws Exception {
        SubscriptionGroupConfig config = new SubscriptionGroupConfig();
        config.setGroupName(required(o, "name"));
        config.setConsumeMessageOrderly(Boolean.parseBoolean(o.getOrDefault("orderly", "false")));
        config.setRetryMaxTimes(Integer.parseInt(o.getOrDefault("retryMaxTimes", "16")));
        for (String address : masters()) {
            admin.createAndUpdateSubscriptionGroupConfig(address, config);
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "group");
        line.put("name", config.getGroupName());
        line.put("config", config.toString());
        emit(line);
    }

    /** The admin tool's command, its standard output and error captured into one mqadmin line. */
    private static void mqadmin(List<String> args) {
        List<String> full = new ArrayList<>(args);
        full.add("-n");
        full.add(namesrv);
        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        PrintStream err = System.err;
        long started = System.nanoTime();
        Thread waker = new Thread(Driver::wakeIdleEventExecutors, "mqadmin-waker");
        waker.setDaemon(true);
        synchronized (OUT) {
            PrintStream capture = new PrintStream(captured, true, StandardCharsets.UTF_8);
            System.setOut(capture);
            System.setErr(capture);
            waker.start();
            try {
                MQAdminStartup.main0(full.toArray(new String[0]), null);
            } finally {
                waker.interrupt();
                System.setOut(STDOUT);
                System.setErr(err);
            }
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "mqadmin");
        line.put("args", String.join(" ", args));
        line.put("output", captured.toString(StandardCharsets.UTF_8));
        line.put("ms", (System.nanoTime() - started) / 1_000_000);
        emit(line);
    }

    /**
     * Interrupts, every 20 ms, each idle NettyEventExecutor thread: one waiting in its event
     * queue's poll. The admin client's shutdown joins that thread without interrupting it, and it
     * sleeps in a 3 s poll: without a wake-up most commands end 3 s after their output. An idle
     * one that is not stopping just polls again.
     */
    private static void wakeIdleEventExecutors() {
        ThreadGroup group = Thread.currentThread().getThreadGroup();
        while (!Thread.currentThread().isInterrupted()) {
            Thread[] threads = new Thread[group.activeCount() * 2 + 16];
            int count = group.enumerate(threads);
            for (int i = 0; i < count; i++) {
                Thread t = threads[i];
                if ("NettyEventExecutor".equals(t.getName()) && t.getState() == Thread.State.TIMED_WAITING
                    && polling(t)) {
                    t.interrupt();
                }
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    /** Whether the thread waits in a blocking queue's poll (an idle event executor). */
    private static boolean polling(Thread thread) {
        for (StackTraceElement frame : thread.getStackTrace()) {
            if ("poll".equals(frame.getMethodName()) && frame.getClassName().endsWith("BlockingQueue")) {
                return true;
            }
        }
        return false;
    }

    // ------------------------------------------------------------------------------------------ consumers

    private static void consume(Map<String, String> o) throws Exception {
        String group = required(o, "group");
        String instance = o.getOrDefault("instance", "DEFAULT");
        Set<String> fail = set(o.get("fail"));
        int maxReconsume = Integer.parseInt(o.getOrDefault("maxReconsume", "2"));
        boolean orderly = Boolean.parseBoolean(o.getOrDefault("orderly", "false"));
        int expect = Integer.parseInt(o.getOrDefault("expect", "0"));
        int groupExpect = Integer.parseInt(o.getOrDefault("groupExpect", "0"));
        int retryLevel = Integer.parseInt(o.getOrDefault("retryLevel", "0"));
        Set<String> groupSucceeded = GROUP_SUCCEEDED.computeIfAbsent(group, k -> ConcurrentHashMap.newKeySet());
        Set<String> expectedKeys = new HashSet<>();
        if (o.containsKey("keysFile")) {
            for (String line : Files.readAllLines(Paths.get(o.get("keysFile")), StandardCharsets.UTF_8)) {
                if (!line.isBlank()) {
                    expectedKeys.add(line.trim());
                }
            }
        }
        Set<String> succeeded = ConcurrentHashMap.newKeySet();
        Map<String, AtomicInteger> failedDeliveries = new ConcurrentHashMap<>();

        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(instance);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setMessageModel("broadcasting".equals(o.get("model")) ? MessageModel.BROADCASTING : MessageModel.CLUSTERING);
        consumer.setMaxReconsumeTimes(maxReconsume);
        consumer.setPullInterval(0);
        // routes of new topics (and of %RETRY%G) every second, not every 30 s
        consumer.setPollNameServerInterval(1000);
        consumer.setPersistConsumerOffsetInterval(1000);
        consumer.setConsumeThreadMin(2);
        consumer.setConsumeThreadMax(4);
        // shutdown waits for the deliveries under way, so that the last RECONSUME_LATER's send-back
        // (which moves the message to %DLQ%G) is done when the run ends
        consumer.setAwaitTerminationMillisWhenShutdown(10000);
        for (String topic : required(o, "topics").split(",")) {
            consumer.subscribe(topic, "*");
        }
        if (orderly) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    consumed(group, instance, m, "success");
                    succeeded.add(m.getKeys());
                    groupSucceeded.add(m.getKeys());
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                // one message at a time (consumeMessageBatchMaxSize is 1): the status is its own
                for (MessageExt m : msgs) {
                    if (fail.contains(m.getKeys())) {
                        consumed(group, instance, m, "later");
                        failedDeliveries.computeIfAbsent(m.getKeys(), k -> new AtomicInteger()).incrementAndGet();
                        ctx.setDelayLevelWhenNextConsume(retryLevel);
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                    consumed(group, instance, m, "success");
                    succeeded.add(m.getKeys());
                    groupSucceeded.add(m.getKeys());
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        consumer.start();
        SHUTDOWN.add(consumer::shutdown);
        EXPECTATIONS.add(new Expectation() {
            public boolean met() {
                if (succeeded.size() < expect || groupSucceeded.size() < groupExpect
                    || !succeeded.containsAll(expectedKeys)) {
                    return false;
                }
                for (String key : fail) {
                    AtomicInteger n = failedDeliveries.get(key);
                    if (n == null || n.get() < maxReconsume + 1) {
                        return false;
                    }
                }
                return true;
            }

            public String describe() {
                Set<String> missing = new HashSet<>(expectedKeys);
                missing.removeAll(succeeded);
                return String.format(
                    "consumer %s/%s: %d of %d keys, the group %d of %d, %d keys of the file missing, fail deliveries %s",
                    group, instance, succeeded.size(), expect, groupSucceeded.size(), groupExpect, missing.size(),
                    failedDeliveries);
            }
        });
    }

    private static void consumed(String group, String instance, MessageExt m, String result) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "consumed");
        line.put("group", group);
        line.put("instance", instance);
        line.put("key", m.getKeys());
        line.put("topic", m.getTopic());
        line.put("queueId", m.getQueueId());
        line.put("queueOffset", m.getQueueOffset());
        line.put("commitLogOffset", m.getCommitLogOffset());
        line.put("msgId", m.getMsgId());
        line.put("reconsumeTimes", m.getReconsumeTimes());
        line.put("bornTime", m.getBornTimestamp());
        line.put("storeTime", m.getStoreTimestamp());
        line.put("deliverTime", System.currentTimeMillis());
        line.put("tags", m.getTags());
        line.put("result", result);
        line.put("properties", new LinkedHashMap<String, Object>(m.getProperties()));
        emit(line);
    }

    // ------------------------------------------------------------------------------------------ producers

    private static DefaultMQProducer producer(String group) throws Exception {
        DefaultMQProducer p = PRODUCERS.get(group);
        if (p == null) {
            p = new DefaultMQProducer(group);
            p.setNamesrvAddr(namesrv);
            p.setPollNameServerInterval(1000);
            p.setSendMsgTimeout(5000);
            p.start();
            PRODUCERS.put(group, p);
            SHUTDOWN.add(0, p::shutdown);
        }
        return p;
    }

    private static Message message(String topic, String tag, String key, String body) {
        return new Message(topic, tag, key, body.getBytes(StandardCharsets.UTF_8));
    }

    private static void send(Map<String, String> o) throws Exception {
        String topic = required(o, "topic");
        String kind = required(o, "kind");
        String prefix = o.getOrDefault("prefix", topic);
        String tag = o.getOrDefault("tag", kind);
        int count = Integer.parseInt(o.getOrDefault("count", "1"));
        String group = o.getOrDefault("group", "driver-" + kind);
        if (kind.equals("tx")) {
            transactions(topic, prefix, tag, count, group, o.getOrDefault("outcomes", "commit,rollback,check-commit"));
            return;
        }
        DefaultMQProducer p = producer(group);
        switch (kind) {
            case "normal":
                for (int i = 0; i < count; i++) {
                    String key = prefix + "-" + i;
                    sent(kind, key, p.send(message(topic, tag, key, "normal " + key)), null);
                }
                break;
            case "delay":
                int level = Integer.parseInt(o.getOrDefault("level", "3"));
                for (int i = 0; i < count; i++) {
                    String key = prefix + "-" + i;
                    Message m = message(topic, tag, key, "delay " + key);
                    m.setDelayTimeLevel(level);
                    sent(kind, key, p.send(m), null);
                }
                break;
            case "ordered":
                String[] orderKeys = o.getOrDefault("orderKeys", "A,B,C").split(",");
                MessageQueueSelector byOrderKey = (mqs, msg, arg) -> mqs.get(Math.floorMod(arg.hashCode(), mqs.size()));
                for (int i = 0; i < count; i++) {
                    String key = prefix + "-" + i;
                    String orderKey = orderKeys[i % orderKeys.length];
                    Message m = message(topic, tag, key, "ordered " + key);
                    m.putUserProperty("orderKey", orderKey);
                    m.putUserProperty("seq", Integer.toString(i));
                    sent(kind, key, p.send(m, byOrderKey, orderKey), orderKey);
                }
                break;
            case "batch":
                List<Message> batch = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    String key = prefix + "-" + i;
                    batch.add(message(topic, tag, key, "batch " + key));
                }
                SendResult r = p.send(batch);
                // one result for the batch: comma-separated ids, the first message's queue offset
                String[] ids = r.getMsgId().split(",");
                String[] offsetIds = r.getOffsetMsgId() == null ? new String[0] : r.getOffsetMsgId().split(",");
                for (int i = 0; i < count; i++) {
                    Map<String, Object> line = sentLine(kind, prefix + "-" + i, r);
                    line.put("msgId", ids[i]);
                    line.put("offsetMsgId", i < offsetIds.length ? offsetIds[i] : null);
                    line.put("queueOffset", r.getQueueOffset() + i);
                    emit(line);
                }
                break;
            default:
                System.err.println("unknown kind " + kind);
                System.exit(2);
        }
    }

    private static Map<String, Object> sentLine(String kind, String key, SendResult r) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "sent");
        line.put("kind", kind);
        line.put("key", key);
        line.put("topic", r.getMessageQueue().getTopic());
        line.put("status", r.getSendStatus().name());
        line.put("msgId", r.getMsgId());
        line.put("offsetMsgId", r.getOffsetMsgId());
        line.put("broker", r.getMessageQueue().getBrokerName());
        line.put("queueId", r.getMessageQueue().getQueueId());
        line.put("queueOffset", r.getQueueOffset());
        line.put("transactionId", r.getTransactionId());
        return line;
    }

    private static void sent(String kind, String key, SendResult r, String orderKey) {
        Map<String, Object> line = sentLine(kind, key, r);
        if (orderKey != null) {
            line.put("orderKey", orderKey);
        }
        emit(line);
    }

    private static void transactions(String topic, String prefix, String tag, int count, String group, String outcomes)
        throws Exception {
        Map<String, AtomicInteger> checks = new ConcurrentHashMap<>();
        TransactionMQProducer p = new TransactionMQProducer(group);
        p.setNamesrvAddr(namesrv);
        p.setPollNameServerInterval(1000);
        p.setTransactionListener(new TransactionListener() {
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                switch (msg.getUserProperty("outcome")) {
                    case "commit":
                        return LocalTransactionState.COMMIT_MESSAGE;
                    case "rollback":
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    default:
                        return LocalTransactionState.UNKNOW;
                }
            }

            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                // the real outcome, as an application reads it from its own records
                String outcome = msg.getUserProperty("outcome");
                LocalTransactionState answer = outcome.endsWith("rollback")
                    ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.COMMIT_MESSAGE;
                checks.computeIfAbsent(msg.getKeys(), k -> new AtomicInteger()).incrementAndGet();
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("event", "checked");
                line.put("key", msg.getKeys());
                line.put("outcome", outcome);
                line.put("answer", answer.name());
                line.put("msgId", msg.getMsgId());
                line.put("transactionId", msg.getTransactionId());
                line.put("queueOffset", msg.getQueueOffset());
                line.put("properties", new LinkedHashMap<String, Object>(msg.getProperties()));
                emit(line);
                return answer;
            }
        });
        p.start();
        SHUTDOWN.add(0, p::shutdown);
        Set<String> awaited = new HashSet<>();
        int n = 0;
        for (int i = 0; i < count; i++) {
            for (String outcome : outcomes.split(",")) {
                String key = prefix + "-" + n++;
                Message m = message(topic, tag, key, outcome + " " + key);
                m.putUserProperty("outcome", outcome);
                SendResult r = p.sendMessageInTransaction(m, null);
                Map<String, Object> line = sentLine("tx", key, r);
                line.put("outcome", outcome);
                emit(line);
                if (outcome.startsWith("check-")) {
                    awaited.add(key);
                }
            }
        }
        EXPECTATIONS.add(new Expectation() {
            public boolean met() {
                return checks.keySet().containsAll(awaited);
            }

            public String describe() {
                return "check-backs of " + awaited + ", got " + checks.keySet();
            }
        });
    }

    private static void flood(Map<String, String> o) throws Exception {
        String topic = required(o, "topic");
        String prefix = o.getOrDefault("prefix", topic);
        int size = Integer.parseInt(o.getOrDefault("size", "100"));
        DefaultMQProducer p = producer(o.getOrDefault("group", "driver-flood"));
        p.setRetryTimesWhenSendFailed(0); // an acknowledged send is one record
        AtomicBoolean open = new AtomicBoolean(true);
        Thread stdin = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() >= 0) {
                    // until end of file
                }
            } catch (IOException e) {
                // closed
            }
            open.set(false);
        });
        stdin.setDaemon(true);
        stdin.start();
        StringBuilder pad = new StringBuilder();
        while (pad.length() < size) {
            pad.append('x');
        }
        for (long i = 0; open.get(); i++) {
            String key = prefix + "-" + i;
            String body = (key + " " + pad).substring(0, Math.max(size, key.length()));
            try {
                sent("flood", key, p.send(message(topic, "flood", key, body)), null);
            } catch (Exception e) {
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("event", "error");
                line.put("key", key);
                line.put("error", e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage()).split("\n")[0]);
                emit(line);
                Thread.sleep(100);
            }
        }
    }

    // ------------------------------------------------------------------------------------------ output

    private static Map<String, String> options(List<String> args) {
        Map<String, String> o = new HashMap<>();
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (eq <= 0) {
                System.err.println("not name=value: " + arg);
                System.exit(2);
            }
            o.put(arg.substring(0, eq), arg.substring(eq + 1));
        }
        return o;
    }

    private static String required(Map<String, String> o, String name) {
        String value = o.get(name);
        if (value == null) {
            System.err.println("missing option " + name);
            System.exit(2);
        }
        return value;
    }

    private static Set<String> set(String csv) {
        Set<String> s = new HashSet<>();
        if (csv != null && !csv.isEmpty()) {
            s.addAll(Arrays.asList(csv.split(",")));
        }
        return s;
    }

    private static void emit(Map<String, Object> fields) {
        String text = json(fields);
        synchronized (OUT) {
            STDOUT.println(text);
            STDOUT.flush();
        }
    }

    @SuppressWarnings("unchecked")
    private static String json(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Number || value instanceof Boolean) {
            return value.toString();
        }
        if (value instanceof Map) {
            StringBuilder b = new StringBuilder("{");
            for (Map.Entry<String, Object> e : ((Map<String, Object>) value).entrySet()) {
                if (b.length() > 1) {
                    b.append(',');
                }
                b.append(json(e.getKey())).append(':').append(json(e.getValue()));
            }
            return b.append('}').toString();
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
