// mqgate example client: Java 17, java.net.http, no dependencies.
// Run as a single-file program:  java examples/java/Client.java
//
// Produces MQGATE_COUNT messages (one with POST /mq/produce, the rest with
// POST /mq/produce/batch), consumes them with GET /mq/message (long poll,
// wait=1, at most 50 pulls), acks every batch but the last by passing its
// requestId on the next pull, acks the last batch with POST /mq/ack, checks
// that every produced body came back and prints
//
//     OK produced=<n> consumed=<n>
//
// Configuration comes from the environment only: MQGATE_URL, MQGATE_TOPIC,
// MQGATE_PRODUCER, MQGATE_PRODUCER_TOKEN, MQGATE_CONSUMER,
// MQGATE_CONSUMER_TOKEN, MQGATE_COUNT (default 10).
// On any failure the reason goes to stderr and the exit status is 1.

import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

public class Client {
    static final int MAX_PULLS = 50; // every loop is bounded
    static final int WAIT_S = 1; // long-poll seconds per pull
    static final int BATCH_LIMIT = 1000; // messages per POST /mq/produce/batch

    static final class Failure extends Exception {
        Failure(String message) {
            super(message);
        }
    }

    /** One answer: HTTP status, parsed envelope, Retry-After header (or null). */
    record Answer(int status, Map<String, Object> envelope, String retryAfter) {
        @SuppressWarnings("unchecked")
        Map<String, Object> result() {
            Object r = envelope.get("result");
            return r instanceof Map ? (Map<String, Object>) r : Map.of();
        }
    }

    static String baseUrl;
    static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1) // plain HTTP/1.1, no h2c upgrade attempt
            .connectTimeout(Duration.ofSeconds(10))
            .build();

    public static void main(String[] args) {
        try {
            run();
            System.exit(0);
        } catch (Failure e) {
            System.err.println("FAIL: " + e.getMessage());
        } catch (Exception e) {
            System.err.println("FAIL: " + e);
        }
        System.exit(1);
    }

    static String env(String name, String dflt) throws Failure {
        String value = System.getenv(name);
        if (value == null || value.isEmpty()) value = dflt;
        if (value == null || value.isEmpty()) throw new Failure("environment variable " + name + " is not set");
        return value;
    }

    static void run() throws Exception {
        baseUrl = env("MQGATE_URL", null).replaceAll("/+$", "");
        String topic = env("MQGATE_TOPIC", null);
        String producer = env("MQGATE_PRODUCER", null);
        String producerToken = env("MQGATE_PRODUCER_TOKEN", null);
        String consumer = env("MQGATE_CONSUMER", null);
        String consumerToken = env("MQGATE_CONSUMER_TOKEN", null);
        int count;
        try {
            count = Integer.parseInt(env("MQGATE_COUNT", "10"));
        } catch (NumberFormatException e) {
            throw new Failure("MQGATE_COUNT must be an integer");
        }
        if (count < 1) throw new Failure("MQGATE_COUNT must be at least 1");

        // A unique prefix: the topic may hold other messages, only ours count.
        String prefix = "mqgate-example-java-" + UUID.randomUUID().toString().replace("-", "") + "-";
        List<String> bodies = new ArrayList<>();
        for (int i = 0; i < count; i++) bodies.add(prefix + i);
        // Small batches, so that there are several of them and both ack styles are used.
        int maxPerPull = Math.min(1024, Math.max(1, (count + 1) / 2));

        // ---- produce: the first message alone, the rest in batches ---------------
        Answer one = call("POST", "/mq/produce", producerToken, null,
                "{\"producer\":" + quote(producer) + "," + messageFields(bodies.get(0), 0) + "}", 200);
        Object msgId = one.result().get("msgId");
        if (!(msgId instanceof String) || ((String) msgId).isEmpty()) {
            throw new Failure("POST /mq/produce: no msgId in result " + one.result());
        }
        int produced = 1;

        for (int start = 1; start < count; start += BATCH_LIMIT) {
            int end = Math.min(count, start + BATCH_LIMIT);
            StringBuilder json = new StringBuilder("{\"producer\":").append(quote(producer)).append(",\"messages\":[");
            for (int i = start; i < end; i++) {
                if (i > start) json.append(',');
                json.append('{').append(messageFields(bodies.get(i), i)).append('}');
            }
            json.append("]}");
            Answer batch = call("POST", "/mq/produce/batch", producerToken, null, json.toString(), 200);
            Object receipts = batch.result().get("receipts");
            if (!(receipts instanceof List) || ((List<?>) receipts).size() != end - start) {
                throw new Failure("POST /mq/produce/batch: expected " + (end - start) + " receipts, got " + receipts);
            }
            produced += end - start;
        }

        // ---- consume -------------------------------------------------------------
        Set<String> expected = new LinkedHashSet<>(bodies);
        Set<String> received = new LinkedHashSet<>();
        String pending = null; // requestId of the batch not yet acked
        int piggybackAcks = 0;

        for (int pull = 0; pull < MAX_PULLS; pull++) {
            Map<String, String> params = new LinkedHashMap<>();
            params.put("topic", topic);
            params.put("consumer", consumer);
            params.put("max", Integer.toString(maxPerPull));
            params.put("wait", Integer.toString(WAIT_S));
            if (pending != null) params.put("requestId", pending); // acks the previous batch first
            Answer answer = call("GET", "/mq/message", consumerToken, params, null, 200, 429);
            Map<String, Object> result = answer.result();

            if (pending != null) {
                Object ack = result.get("ack");
                if ("ok".equals(ack)) {
                    piggybackAcks++;
                    pending = null;
                } else if (!(answer.status() == 429 && ack == null)) {
                    throw new Failure("ack of the previous batch via requestId failed: ack=" + ack);
                } // else: rate limited before the ack was looked at, send it again
            }

            if (answer.status() == 429) {
                double delay = 1;
                try {
                    if (answer.retryAfter() != null) delay = Double.parseDouble(answer.retryAfter());
                } catch (NumberFormatException ignored) {
                    // keep 1 s
                }
                Thread.sleep((long) (Math.min(Math.max(delay, 0.1), 5) * 1000));
                continue;
            }

            Object kind = result.get("status");
            if ("FOUND".equals(kind)) {
                Object requestId = result.get("requestId");
                Object msgList = result.get("msgList");
                if (!(requestId instanceof String) || ((String) requestId).isEmpty() || !(msgList instanceof List)) {
                    throw new Failure("FOUND without requestId or msgList: " + result);
                }
                for (Object item : (List<?>) msgList) {
                    Object body = item instanceof Map ? ((Map<?, ?>) item).get("message") : null;
                    if (body instanceof String && ((String) body).startsWith(prefix)) {
                        if (!expected.contains(body)) throw new Failure("received a body that was never produced: " + body);
                        received.add((String) body);
                    }
                }
                pending = (String) requestId;
                if (received.size() == expected.size()) break;
            } else if ("NO_NEW_MSG".equals(kind)) {
                continue;
            } else if ("PAUSED".equals(kind)) {
                Thread.sleep(WAIT_S * 1000L);
            } else {
                throw new Failure("GET /mq/message: unexpected result.status " + kind);
            }
        }

        // ---- explicit ack of the last batch --------------------------------------
        if (pending != null) {
            call("POST", "/mq/ack", consumerToken, null, "{\"requestId\":" + quote(pending) + "}", 200);
            pending = null;
        }

        List<String> missing = new ArrayList<>();
        for (String b : bodies) if (!received.contains(b)) missing.add(b);
        if (!missing.isEmpty()) {
            throw new Failure(missing.size() + " of " + count + " messages not received after " + MAX_PULLS
                    + " pulls, e.g. " + missing.subList(0, Math.min(3, missing.size())));
        }
        if (count > maxPerPull && piggybackAcks == 0) {
            throw new Failure("no batch was acked by passing requestId on the next pull");
        }

        System.out.println("OK produced=" + produced + " consumed=" + received.size());
    }

    static String messageFields(String body, int i) {
        return "\"message\":" + quote(body) + ",\"keys\":[" + quote("example-" + i)
                + "],\"tags\":[\"example\"],\"properties\":{\"lang\":\"java\"}";
    }

    /** One API call. Throws Failure on a transport error, a non-envelope answer or an unexpected status. */
    @SuppressWarnings("unchecked")
    static Answer call(String method, String path, String token, Map<String, String> params, String json,
            int... ok) throws Failure, InterruptedException {
        StringBuilder url = new StringBuilder(baseUrl).append(path);
        if (params != null && !params.isEmpty()) {
            char sep = '?';
            for (Map.Entry<String, String> e : params.entrySet()) {
                url.append(sep).append(URLEncoder.encode(e.getKey(), StandardCharsets.UTF_8)).append('=')
                        .append(URLEncoder.encode(e.getValue(), StandardCharsets.UTF_8));
                sep = '&';
            }
        }
        HttpRequest.Builder req;
        try {
            req = HttpRequest.newBuilder(URI.create(url.toString()));
        } catch (IllegalArgumentException e) {
            throw new Failure("bad MQGATE_URL: " + e.getMessage());
        }
        req.timeout(Duration.ofSeconds(WAIT_S + 15)).header("Authorization", "Bearer " + token);
        if (json != null) {
            req.header("Content-Type", "application/json")
                    .method(method, HttpRequest.BodyPublishers.ofString(json, StandardCharsets.UTF_8));
        } else {
            req.method(method, HttpRequest.BodyPublishers.noBody());
        }
        HttpResponse<String> resp;
        try {
            resp = HTTP.send(req.build(), HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new Failure(method + " " + path + ": " + e + (e.getCause() != null ? " (" + e.getCause() + ")" : ""));
        }
        Object parsed;
        try {
            parsed = new Json(resp.body()).parseDocument();
        } catch (IllegalArgumentException e) {
            String text = resp.body();
            throw new Failure(method + " " + path + ": HTTP " + resp.statusCode() + ", answer is not JSON ("
                    + e.getMessage() + "): " + text.substring(0, Math.min(300, text.length())));
        }
        if (!(parsed instanceof Map) || !((Map<?, ?>) parsed).containsKey("result")
                || !((Map<?, ?>) parsed).containsKey("message")) {
            throw new Failure(method + " " + path + ": HTTP " + resp.statusCode() + ", not an envelope: " + parsed);
        }
        Map<String, Object> envelope = (Map<String, Object>) parsed;
        Object status = envelope.get("status");
        if (!(status instanceof Number) || ((Number) status).doubleValue() != resp.statusCode()) {
            throw new Failure(method + " " + path + ": envelope status " + status + " != HTTP " + resp.statusCode());
        }
        boolean accepted = false;
        for (int code : ok) accepted |= code == resp.statusCode();
        Answer answer = new Answer(resp.statusCode(), envelope, resp.headers().firstValue("Retry-After").orElse(null));
        if (!accepted) {
            throw new Failure(method + " " + path + ": HTTP " + resp.statusCode() + " code=" + answer.result().get("code")
                    + " message=" + quote(String.valueOf(envelope.get("message"))));
        }
        return answer;
    }

    /** JSON string literal. */
    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
                }
            }
        }
        return out.append('"').toString();
    }

    /** A minimal JSON reader: objects → Map, arrays → List, strings, numbers → Double, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        Json(String s) {
            this.s = s;
        }

        Object parseDocument() {
            Object v = value();
            ws();
            if (i != s.length()) throw error("trailing characters");
            return v;
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException(what + " at offset " + i);
        }

        private void ws() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        private void expect(char c) {
            ws();
            if (i >= s.length() || s.charAt(i) != c) throw error("expected '" + c + "'");
            i++;
        }

        private Object value() {
            ws();
            if (i >= s.length()) throw error("unexpected end");
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> map = new LinkedHashMap<>();
                ws();
                if (i < s.length() && s.charAt(i) == '}') {
                    i++;
                    return map;
                }
                while (true) {
                    ws();
                    String key = string();
                    expect(':');
                    map.put(key, value());
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    expect('}');
                    return map;
                }
            }
            if (c == '[') {
                i++;
                List<Object> list = new ArrayList<>();
                ws();
                if (i < s.length() && s.charAt(i) == ']') {
                    i++;
                    return list;
                }
                while (true) {
                    list.add(value());
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    expect(']');
                    return list;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) {
                i += 4;
                return Boolean.TRUE;
            }
            if (s.startsWith("false", i)) {
                i += 5;
                return Boolean.FALSE;
            }
            if (s.startsWith("null", i)) {
                i += 4;
                return null;
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            if (start == i) throw error("unexpected character '" + c + "'");
            try {
                return Double.parseDouble(s.substring(start, i));
            } catch (NumberFormatException e) {
                throw error("bad number");
            }
        }

        private String string() {
            if (i >= s.length() || s.charAt(i) != '"') throw error("expected string");
            i++;
            StringBuilder out = new StringBuilder();
            while (true) {
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return out.toString();
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                if (i >= s.length()) throw error("unterminated escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> out.append(e);
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'n' -> out.append('\n');
                    case 'r' -> out.append('\r');
                    case 't' -> out.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) throw error("bad \\u escape");
                        try {
                            out.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape");
                }
            }
        }
    }
}
