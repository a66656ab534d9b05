// The AWS SDK for JavaScript v3's SQS client (@aws-sdk/client-sqs, unchanged) against a real
// mqgate gateway: tests/sqs/test_sqs_js.py starts the gateway, issues two access keys in two
// projects and runs this script.
//
//   node sqs_suite.mjs --endpoint URL --region R --key-id ID --secret S \
//       --other-key-id ID2 --other-secret S2 [--prefix P] [--only NAME,NAME]
//
// Every option may come from the environment instead: SQS_ENDPOINT, SQS_REGION (or AWS_REGION),
// SQS_KEY_ID, SQS_SECRET, SQS_OTHER_KEY_ID, SQS_OTHER_SECRET, SQS_PREFIX.
//
// Each scenario makes its own queues (named after the prefix), so that one failing leaves the
// others meaningful. One JSON line per scenario on stdout:
//   {"scenario": "...", "ok": true, "ms": 123}
//   {"scenario": "...", "ok": false, "ms": 123, "error": "...", "name": "...", "code": "..."}
// then a summary on stderr; the exit status is 1 when a scenario failed, 2 on a usage error.

import { createHash, randomBytes } from "node:crypto";
import { parseArgs } from "node:util";

import {
  BatchEntryIdsNotDistinct,
  ChangeMessageVisibilityBatchCommand,
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageBatchCommand,
  DeleteMessageCommand,
  DeleteQueueCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  ListDeadLetterSourceQueuesCommand,
  ListMessageMoveTasksCommand,
  ListQueuesCommand,
  ListQueueTagsCommand,
  PurgeQueueCommand,
  QueueDoesNotExist,
  QueueNameExists,
  ReceiptHandleIsInvalid,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SetQueueAttributesCommand,
  SQSClient,
  SQSServiceException,
  StartMessageMoveTaskCommand,
  TagQueueCommand,
  TooManyEntriesInBatchRequest,
  UntagQueueCommand,
} from "@aws-sdk/client-sqs";

// ---------------------------------------------------------------------------------------------
// Options.

function options() {
  const { values } = parseArgs({
    options: {
      endpoint: { type: "string", default: process.env.SQS_ENDPOINT },
      region: { type: "string", default: process.env.SQS_REGION ?? process.env.AWS_REGION ?? "us-east-1" },
      "key-id": { type: "string", default: process.env.SQS_KEY_ID },
      secret: { type: "string", default: process.env.SQS_SECRET },
      "other-key-id": { type: "string", default: process.env.SQS_OTHER_KEY_ID },
      "other-secret": { type: "string", default: process.env.SQS_OTHER_SECRET },
      prefix: { type: "string", default: process.env.SQS_PREFIX ?? `js${randomBytes(3).toString("hex")}` },
      only: { type: "string", default: "" },
    },
    strict: true,
  });
  const missing = ["endpoint", "key-id", "secret", "other-key-id", "other-secret"].filter((k) => !values[k]);
  if (missing.length) {
    process.stderr.write(`usage error: missing ${missing.map((k) => "--" + k).join(", ")}\n`);
    process.exit(2);
  }
  return values;
}

const opts = options();
const ENDPOINT = opts.endpoint.replace(/\/+$/, "");
const REGION = opts.region;
const PREFIX = opts.prefix;

function client(keyId, secret) {
  return new SQSClient({
    endpoint: ENDPOINT,
    region: REGION,
    credentials: { accessKeyId: keyId, secretAccessKey: secret },
    // One attempt: a refusal must be seen as the gateway answered it, not retried away.
    maxAttempts: 1,
    // `md5` is left at its default: the SDK checks MD5OfMessageBody of every send, batch entry
    // and received message itself, and throws on a mismatch.
  });
}

const sqs = client(opts["key-id"], opts.secret);
const stranger = client(opts["other-key-id"], opts["other-secret"]);

// ---------------------------------------------------------------------------------------------
// Assertions.

class Failure extends Error {}

function check(cond, message) {
  if (!cond) throw new Failure(message);
}

// JSON with object keys sorted (a map's order says nothing) and bytes as their hex.
function canonical(value) {
  return JSON.stringify(value, (_, v) => {
    if (v instanceof Uint8Array) return { bytes: Buffer.from(v).toString("hex") };
    if (v && typeof v === "object" && !Array.isArray(v)) {
      return Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]]));
    }
    return v;
  });
}

function eq(actual, expected, what) {
  const a = canonical(actual);
  const e = canonical(expected);
  if (a !== e) throw new Failure(`${what}: expected ${e}, got ${a}`);
}

function describeError(err) {
  if (!err) return String(err);
  const status = err.$metadata?.httpStatusCode;
  return `${err.name}${err.Code ? ` (Code ${err.Code})` : ""}${status ? ` HTTP ${status}` : ""}: ${err.message}`;
}

// The call must be refused: with an error of class `cls` when given, named `name` as the SDK
// surfaces it, and with the query-protocol code `code` (x-amzn-query-error) when given.
async function refused(promise, { cls, name, code, status }, what) {
  let result;
  try {
    result = await promise;
  } catch (err) {
    if (err instanceof Failure) throw err;
    check(err instanceof SQSServiceException, `${what}: not a service error: ${describeError(err)}`);
    if (cls) check(err instanceof cls, `${what}: expected ${cls.name}, got ${describeError(err)}`);
    if (name) check(err.name === name, `${what}: expected error name ${name}, got ${describeError(err)}`);
    if (code) check(err.Code === code, `${what}: expected Code ${code}, got ${describeError(err)}`);
    if (status) {
      const got = err.$metadata?.httpStatusCode;
      check(got === status, `${what}: expected HTTP ${status}, got ${got} (${describeError(err)})`);
    }
    return err;
  }
  throw new Failure(`${what}: expected a refusal (${name ?? cls?.name}), got success ${JSON.stringify(result)}`);
}

// Poll `fn` (every 50 ms) until it returns a truthy value, failing after `timeoutMs`.
async function pollUntil(fn, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Failure(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50)); // the poll's interval
  }
}

// MD5OfMessageAttributes as SQS computes it: the attributes sorted by name, each as its name,
// its data type (both 4-byte big-endian length then UTF-8 bytes), a transport byte (1 string,
// 2 binary) and its value (length then bytes); the hex MD5 of all of that.
function md5OfAttributes(attrs) {
  const hash = createHash("md5");
  const field = (bytes) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(bytes.length);
    hash.update(len);
    hash.update(bytes);
  };
  for (const name of Object.keys(attrs).sort()) {
    const a = attrs[name];
    field(Buffer.from(name, "utf8"));
    field(Buffer.from(a.DataType, "utf8"));
    if (a.BinaryValue !== undefined) {
      hash.update(Buffer.from([2]));
      field(Buffer.from(a.BinaryValue));
    } else {
      hash.update(Buffer.from([1]));
      field(Buffer.from(a.StringValue, "utf8"));
    }
  }
  return hash.digest("hex");
}

function md5(text) {
  return createHash("md5").update(text, "utf8").digest("hex");
}

function sameBytes(a, b) {
  return a instanceof Uint8Array && Buffer.from(a).equals(Buffer.from(b));
}

// ---------------------------------------------------------------------------------------------
// Helpers on queues.

const QUEUE_URL = new RegExp(`^${ENDPOINT.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}/(\\d{12})/([\\w-]+(?:\\.fifo)?)$`);

async function freshQueue(suffix, attributes = undefined) {
  const name = `${PREFIX}-${suffix}`;
  const out = await sqs.send(new CreateQueueCommand({ QueueName: name, Attributes: attributes }));
  const m = QUEUE_URL.exec(out.QueueUrl ?? "");
  check(m && m[2] === name, `CreateQueue ${name}: unexpected QueueUrl ${out.QueueUrl}`);
  return { name, url: out.QueueUrl, account: m[1] };
}

async function receive(url, extra = {}) {
  const out = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url, ...extra }));
  return out.Messages ?? [];
}

// Receive until `count` messages were received (a receive may answer fewer than are there).
async function receiveAll(url, count, extra = {}) {
  const got = [];
  await pollUntil(
    async () => {
      got.push(...(await receive(url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 1, ...extra })));
      return got.length >= count;
    },
    20_000,
    `${count} messages on ${url}`,
  );
  eq(got.length, count, "messages received");
  return got;
}

async function assertEmpty(url) {
  eq(await receive(url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }), [], `messages left on ${url}`);
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

const scenarios = [];
function scenario(name, fn, timeoutMs = 60_000) {
  scenarios.push({ name, fn, timeoutMs });
}

scenario("create_queue_idempotent", async () => {
  const q = await freshQueue("create", { VisibilityTimeout: "40" });
  const again = await sqs.send(
    new CreateQueueCommand({ QueueName: q.name, Attributes: { VisibilityTimeout: "40" } }),
  );
  eq(again.QueueUrl, q.url, "CreateQueue again with the same attributes");
  // AWS: `QueueNameExists` in the JSON protocol, `QueueAlreadyExists` as its query code.
  await refused(
    sqs.send(new CreateQueueCommand({ QueueName: q.name, Attributes: { VisibilityTimeout: "50" } })),
    { cls: QueueNameExists, name: "QueueNameExists", code: "QueueAlreadyExists", status: 400 },
    "CreateQueue with another VisibilityTimeout",
  );
  const attrs = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["VisibilityTimeout"] }),
  );
  eq(attrs.Attributes, { VisibilityTimeout: "40" }, "VisibilityTimeout kept from the first create");
});

scenario("get_queue_url", async () => {
  const q = await freshQueue("url");
  const out = await sqs.send(new GetQueueUrlCommand({ QueueName: q.name }));
  eq(out.QueueUrl, q.url, "GetQueueUrl");
  const own = await sqs.send(new GetQueueUrlCommand({ QueueName: q.name, QueueOwnerAWSAccountId: q.account }));
  eq(own.QueueUrl, q.url, "GetQueueUrl with the own account id");
  await refused(
    sqs.send(new GetQueueUrlCommand({ QueueName: `${PREFIX}-never-made` })),
    { cls: QueueDoesNotExist, name: "QueueDoesNotExist", code: "AWS.SimpleQueueService.NonExistentQueue" },
    "GetQueueUrl of a queue never made",
  );
});

scenario("list_queues_prefix", async () => {
  const made = [];
  for (const s of ["lq-alpha-1", "lq-alpha-2", "lq-alpha-3", "lq-beta-1"]) made.push(await freshQueue(s));
  const alphas = made.slice(0, 3).map((q) => q.url).sort();
  const all = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-lq-alpha` }));
  eq([...(all.QueueUrls ?? [])].sort(), alphas, "ListQueues with a prefix");
  eq(all.NextToken, undefined, "NextToken of a complete list");
  const first = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-lq-alpha`, MaxResults: 2 }));
  eq(first.QueueUrls?.length, 2, "first page's size");
  check(first.NextToken, "a first page of 2 out of 3 has a NextToken");
  const rest = await sqs.send(
    new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-lq-alpha`, MaxResults: 2, NextToken: first.NextToken }),
  );
  eq(rest.QueueUrls?.length, 1, "second page's size");
  eq(rest.NextToken, undefined, "NextToken of the last page");
  eq([...first.QueueUrls, ...rest.QueueUrls].sort(), alphas, "both pages");
  const none = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-lq-gamma` }));
  eq(none.QueueUrls ?? [], [], "ListQueues with a prefix nothing has");
});

scenario("send_receive_message_attributes", async () => {
  const q = await freshQueue("attrs");
  const attributes = {
    kind: { DataType: "String", StringValue: "order ✓" },
    size: { DataType: "Number", StringValue: "3.25" },
    blob: { DataType: "Binary", BinaryValue: new Uint8Array([0, 1, 0xfe, 0xff]) },
  };
  const body = "hello from JS — ünïcode";
  const sent = await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: body, MessageAttributes: attributes }));
  check(sent.MessageId, "SendMessage answers a MessageId");
  eq(sent.MD5OfMessageBody, md5(body), "MD5OfMessageBody of the send");
  eq(sent.MD5OfMessageAttributes, md5OfAttributes(attributes), "MD5OfMessageAttributes of the send");

  const got = await receive(q.url, {
    MaxNumberOfMessages: 10,
    WaitTimeSeconds: 5,
    MessageAttributeNames: ["All"],
    MessageSystemAttributeNames: ["ApproximateReceiveCount", "SenderId", "SentTimestamp"],
  });
  eq(got.length, 1, "messages received");
  const m = got[0];
  eq(m.MessageId, sent.MessageId, "MessageId");
  eq(m.Body, body, "Body");
  eq(m.MD5OfBody, md5(body), "MD5OfBody");
  eq(m.MD5OfMessageAttributes, md5OfAttributes(attributes), "MD5OfMessageAttributes of the receive");
  eq(Object.keys(m.MessageAttributes ?? {}).sort(), ["blob", "kind", "size"], "message attribute names");
  eq(m.MessageAttributes.kind, attributes.kind, "String attribute");
  eq(m.MessageAttributes.size, attributes.size, "Number attribute");
  eq(m.MessageAttributes.blob.DataType, "Binary", "Binary attribute's type");
  check(
    sameBytes(m.MessageAttributes.blob.BinaryValue, attributes.blob.BinaryValue),
    `Binary attribute's value: got ${JSON.stringify(m.MessageAttributes.blob)}`,
  );
  eq(m.Attributes?.ApproximateReceiveCount, "1", "ApproximateReceiveCount");
  eq(m.Attributes?.SenderId, opts["key-id"], "SenderId");
  check(Math.abs(Number(m.Attributes?.SentTimestamp) - Date.now()) < 300_000, `SentTimestamp ${m.Attributes?.SentTimestamp}`);

  // Only the attributes asked for, by name.
  await sqs.send(new ChangeMessageVisibilityCommand({ QueueUrl: q.url, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 }));
  const named = await receive(q.url, { WaitTimeSeconds: 5, MessageAttributeNames: ["kind"] });
  eq(named.length, 1, "messages received again");
  eq(Object.keys(named[0].MessageAttributes ?? {}), ["kind"], "attributes asked for by name");
  eq(named[0].MD5OfMessageAttributes, md5OfAttributes({ kind: attributes.kind }), "MD5 of the attributes returned");
  eq(named[0].Attributes, undefined, "system attributes when none were asked for");
});

scenario("send_message_batch", async () => {
  const q = await freshQueue("batch");
  const entries = [
    { Id: "a", MessageBody: "one" },
    { Id: "b", MessageBody: "two", MessageAttributes: { n: { DataType: "Number", StringValue: "2" } } },
    { Id: "c", MessageBody: "three", DelaySeconds: 901 },
  ];
  const out = await sqs.send(new SendMessageBatchCommand({ QueueUrl: q.url, Entries: entries }));
  eq((out.Successful ?? []).map((s) => s.Id).sort(), ["a", "b"], "Successful ids");
  for (const s of out.Successful) check(s.MessageId, `entry ${s.Id} has a MessageId`);
  eq(out.Successful.find((s) => s.Id === "b").MD5OfMessageAttributes, md5OfAttributes(entries[1].MessageAttributes), "batch entry's MD5OfMessageAttributes");
  eq((out.Failed ?? []).map((f) => [f.Id, f.SenderFault]), [["c", true]], "Failed entries");
  const got = await receiveAll(q.url, 2);
  eq(got.map((m) => m.Body).sort(), ["one", "two"], "bodies received");

  const eleven = Array.from({ length: 11 }, (_, i) => ({ Id: `e${i}`, MessageBody: `m${i}` }));
  await refused(
    sqs.send(new SendMessageBatchCommand({ QueueUrl: q.url, Entries: eleven })),
    { cls: TooManyEntriesInBatchRequest, name: "TooManyEntriesInBatchRequest", code: "AWS.SimpleQueueService.TooManyEntriesInBatchRequest" },
    "SendMessageBatch of 11 entries",
  );
  await refused(
    sqs.send(new SendMessageBatchCommand({ QueueUrl: q.url, Entries: [{ Id: "x", MessageBody: "1" }, { Id: "x", MessageBody: "2" }] })),
    { cls: BatchEntryIdsNotDistinct, name: "BatchEntryIdsNotDistinct", code: "AWS.SimpleQueueService.BatchEntryIdsNotDistinct" },
    "SendMessageBatch with the same Id twice",
  );
  // Neither refused batch sent anything.
  await assertEmpty(q.url);
});

scenario("long_poll_woken_by_send", async () => {
  const q = await freshQueue("longpoll");
  await assertEmpty(q.url);
  const WAIT_S = 20;
  const started = Date.now();
  let settledAt = null;
  const polling = sqs.send(new ReceiveMessageCommand({ QueueUrl: q.url, WaitTimeSeconds: WAIT_S })).finally(() => {
    settledAt = Date.now();
  });
  // The receive is on its way; give it a moment to reach the gateway and wait there (what is
  // tested is a receive already waiting when the send comes: nothing to poll for that).
  await new Promise((resolve) => setTimeout(resolve, 1500));
  check(settledAt === null, `the long poll answered before anything was sent (after ${settledAt - started} ms)`);
  const sent = await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "late" }));
  const sentAt = Date.now();
  const out = await polling;
  const messages = out.Messages ?? [];
  eq(messages.map((m) => [m.MessageId, m.Body]), [[sent.MessageId, "late"]], "what the long poll returned");
  const waited = settledAt - started;
  // Woken by the send, not by its WaitTimeSeconds running out (bound kept generous).
  check(settledAt - sentAt < 10_000, `the receive answered ${settledAt - sentAt} ms after the send`);
  check(waited < WAIT_S * 1000 - 2000, `the receive waited ${waited} ms of its ${WAIT_S} s`);

  // And a long poll on an empty queue waits about its WaitTimeSeconds, then answers nothing.
  const t0 = Date.now();
  await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: messages[0].ReceiptHandle }));
  const empty = await sqs.send(new ReceiveMessageCommand({ QueueUrl: q.url, WaitTimeSeconds: 2 }));
  const emptyWait = Date.now() - t0;
  eq(empty.Messages ?? [], [], "a long poll nothing woke");
  check(emptyWait >= 1500 && emptyWait < 15_000, `an empty long poll of 2 s took ${emptyWait} ms`);
});

scenario("visibility_zero_and_receive_count", async () => {
  const q = await freshQueue("visibility", { VisibilityTimeout: "60" });
  const sent = await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "again" }));
  const first = await receive(q.url, { WaitTimeSeconds: 5, AttributeNames: ["ApproximateReceiveCount"] });
  eq(first.map((m) => [m.MessageId, m.Attributes?.ApproximateReceiveCount]), [[sent.MessageId, "1"]], "first receive");
  // Hidden for 60 s: nothing to receive now.
  await assertEmpty(q.url);
  await sqs.send(
    new ChangeMessageVisibilityCommand({ QueueUrl: q.url, ReceiptHandle: first[0].ReceiptHandle, VisibilityTimeout: 0 }),
  );
  const second = await receive(q.url, { WaitTimeSeconds: 5, AttributeNames: ["ApproximateReceiveCount"] });
  eq(second.map((m) => [m.MessageId, m.Attributes?.ApproximateReceiveCount]), [[sent.MessageId, "2"]], "second receive");
  check(second[0].ReceiptHandle !== first[0].ReceiptHandle, "a new receive answers a new receipt handle");

  await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: second[0].ReceiptHandle }));
  // A stale receipt (received again since): success, as AWS.
  await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: first[0].ReceiptHandle }));
  await refused(
    sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: "not-a-receipt" })),
    { cls: ReceiptHandleIsInvalid, name: "ReceiptHandleIsInvalid", code: "ReceiptHandleIsInvalid" },
    "DeleteMessage with a malformed receipt",
  );
  await sqs.send(new SetQueueAttributesCommand({ QueueUrl: q.url, Attributes: { VisibilityTimeout: "0" } }));
  await assertEmpty(q.url);
});

scenario("delete_message_batch", async () => {
  const q = await freshQueue("delbatch");
  await sqs.send(
    new SendMessageBatchCommand({ QueueUrl: q.url, Entries: ["x", "y", "z"].map((b) => ({ Id: b, MessageBody: b })) }),
  );
  const got = await receiveAll(q.url, 3, { VisibilityTimeout: 60 });
  const out = await sqs.send(
    new DeleteMessageBatchCommand({
      QueueUrl: q.url,
      Entries: [
        ...got.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })),
        { Id: "bad", ReceiptHandle: "garbage" },
      ],
    }),
  );
  eq((out.Successful ?? []).map((s) => s.Id).sort(), ["d0", "d1", "d2"], "DeleteMessageBatch Successful");
  eq((out.Failed ?? []).map((f) => [f.Id, f.Code, f.SenderFault]), [["bad", "ReceiptHandleIsInvalid", true]], "DeleteMessageBatch Failed");
  // Gone, not merely hidden: neither visible nor in flight.
  await pollUntil(
    async () => {
      const a = await sqs.send(
        new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
      );
      return a.Attributes?.ApproximateNumberOfMessages === "0" && a.Attributes?.ApproximateNumberOfMessagesNotVisible === "0";
    },
    10_000,
    "no message left, visible or not, after DeleteMessageBatch",
  );
  await assertEmpty(q.url);
  await refused(
    sqs.send(new DeleteMessageBatchCommand({ QueueUrl: q.url, Entries: [{ Id: "s", ReceiptHandle: "a" }, { Id: "s", ReceiptHandle: "b" }] })),
    { cls: BatchEntryIdsNotDistinct, name: "BatchEntryIdsNotDistinct" },
    "DeleteMessageBatch with the same Id twice",
  );
});

scenario("change_message_visibility_batch", async () => {
  const q = await freshQueue("visbatch");
  await sqs.send(
    new SendMessageBatchCommand({ QueueUrl: q.url, Entries: ["p", "q"].map((b) => ({ Id: b, MessageBody: b })) }),
  );
  const got = await receiveAll(q.url, 2, { VisibilityTimeout: 120 });
  await assertEmpty(q.url);
  const out = await sqs.send(
    new ChangeMessageVisibilityBatchCommand({
      QueueUrl: q.url,
      Entries: [
        ...got.map((m, i) => ({ Id: `v${i}`, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 })),
        { Id: "bad", ReceiptHandle: "garbage", VisibilityTimeout: 0 },
      ],
    }),
  );
  eq((out.Successful ?? []).map((s) => s.Id).sort(), ["v0", "v1"], "ChangeMessageVisibilityBatch Successful");
  eq((out.Failed ?? []).map((f) => [f.Id, f.Code, f.SenderFault]), [["bad", "ReceiptHandleIsInvalid", true]], "ChangeMessageVisibilityBatch Failed");
  const again = await receiveAll(q.url, 2, { AttributeNames: ["ApproximateReceiveCount"] });
  eq(again.map((m) => m.Body).sort(), ["p", "q"], "bodies received again");
  eq(again.map((m) => m.Attributes?.ApproximateReceiveCount), ["2", "2"], "receive counts");
});

scenario("purge_queue", async () => {
  const q = await freshQueue("purge");
  await sqs.send(
    new SendMessageBatchCommand({ QueueUrl: q.url, Entries: ["1", "2", "3"].map((b) => ({ Id: `p${b}`, MessageBody: b })) }),
  );
  const before = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["ApproximateNumberOfMessages"] }),
  );
  eq(before.Attributes?.ApproximateNumberOfMessages, "3", "ApproximateNumberOfMessages before the purge");
  await sqs.send(new PurgeQueueCommand({ QueueUrl: q.url }));
  await assertEmpty(q.url);
  const after = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
  );
  eq(after.Attributes, { ApproximateNumberOfMessages: "0", ApproximateNumberOfMessagesNotVisible: "0" }, "counts after the purge");
  // The queue still works.
  await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "after" }));
  eq((await receiveAll(q.url, 1)).map((m) => m.Body), ["after"], "a message sent after the purge");
});

scenario("tags", async () => {
  const name = `${PREFIX}-tags`;
  const made = await sqs.send(new CreateQueueCommand({ QueueName: name, tags: { origin: "create" } }));
  const url = made.QueueUrl;
  eq((await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags, { origin: "create" }, "tags given at creation");
  await sqs.send(new TagQueueCommand({ QueueUrl: url, Tags: { team: "a", env: "test" } }));
  eq((await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags, { env: "test", origin: "create", team: "a" }, "tags after TagQueue");
  await sqs.send(new UntagQueueCommand({ QueueUrl: url, TagKeys: ["env", "origin"] }));
  eq((await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags, { team: "a" }, "tags after UntagQueue");
  await sqs.send(new TagQueueCommand({ QueueUrl: url, Tags: { team: "b" } }));
  eq((await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags, { team: "b" }, "a tag set again");
});

scenario("queue_attributes", async () => {
  const q = await freshQueue("qattrs");
  const all = (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["All"] }))).Attributes;
  eq(all.QueueArn, `arn:aws:sqs:${REGION}:${q.account}:${q.name}`, "QueueArn");
  eq(all.VisibilityTimeout, "30", "default VisibilityTimeout");
  eq(all.DelaySeconds, "0", "default DelaySeconds");
  eq(all.ReceiveMessageWaitTimeSeconds, "0", "default ReceiveMessageWaitTimeSeconds");
  eq(all.ApproximateNumberOfMessages, "0", "ApproximateNumberOfMessages of a new queue");
  check(Number(all.CreatedTimestamp) > 0, `CreatedTimestamp ${all.CreatedTimestamp}`);
  await sqs.send(
    new SetQueueAttributesCommand({
      QueueUrl: q.url,
      Attributes: { VisibilityTimeout: "45", MaximumMessageSize: "2048", MessageRetentionPeriod: "3600" },
    }),
  );
  const set = await sqs.send(
    new GetQueueAttributesCommand({
      QueueUrl: q.url,
      AttributeNames: ["VisibilityTimeout", "MaximumMessageSize", "MessageRetentionPeriod"],
    }),
  );
  eq(set.Attributes, { MaximumMessageSize: "2048", MessageRetentionPeriod: "3600", VisibilityTimeout: "45" }, "attributes set");
  // MaximumMessageSize is enforced on send.
  await refused(
    sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "x".repeat(3000) })),
    { code: "InvalidParameterValue", status: 400 },
    "a send over MaximumMessageSize",
  );
  await refused(
    sqs.send(new SetQueueAttributesCommand({ QueueUrl: q.url, Attributes: { VisibilityTimeout: "43201" } })),
    { code: "InvalidAttributeValue", status: 400 },
    "VisibilityTimeout over 12 hours",
  );
});

scenario("delete_queue", async () => {
  const q = await freshQueue("doomed");
  await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "lost" }));
  await sqs.send(new DeleteQueueCommand({ QueueUrl: q.url }));
  const gone = { cls: QueueDoesNotExist, name: "QueueDoesNotExist", code: "AWS.SimpleQueueService.NonExistentQueue" };
  await refused(sqs.send(new GetQueueUrlCommand({ QueueName: q.name })), gone, "GetQueueUrl of a deleted queue");
  await refused(sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "x" })), gone, "SendMessage to a deleted queue");
  await refused(sqs.send(new ReceiveMessageCommand({ QueueUrl: q.url })), gone, "ReceiveMessage of a deleted queue");
  const listed = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: q.name }));
  eq(listed.QueueUrls ?? [], [], "ListQueues after DeleteQueue");
});

scenario("queue_url_as_endpoint", async () => {
  // A client given no endpoint sends each call that names a QueueUrl to that URL's origin (the
  // SDK's useQueueUrlAsEndpoint, on by default), signed for its region: how code that only
  // passes queue URLs around reaches the gateway.
  const q = await freshQueue("byurl");
  const warnings = [];
  const quiet = () => {};
  const byUrl = new SQSClient({
    region: REGION,
    credentials: { accessKeyId: opts["key-id"], secretAccessKey: opts.secret },
    maxAttempts: 1,
    logger: { trace: quiet, debug: quiet, info: quiet, warn: (...a) => warnings.push(a.join(" ")), error: quiet },
  });
  try {
    const sent = await byUrl.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "by url" }));
    const got = await byUrl.send(new ReceiveMessageCommand({ QueueUrl: q.url, WaitTimeSeconds: 5 }));
    eq((got.Messages ?? []).map((m) => [m.MessageId, m.Body]), [[sent.MessageId, "by url"]], "received through the QueueUrl's origin");
    await byUrl.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: got.Messages[0].ReceiptHandle }));
    check(warnings.some((w) => w.includes("using QueueUrl host as endpoint")), `the SDK did not take the QueueUrl's host: ${JSON.stringify(warnings)}`);
  } finally {
    byUrl.destroy();
  }
  await assertEmpty(q.url);
});

scenario("wrong_secret", async () => {
  const forger = client(opts["key-id"], "x".repeat(40));
  await refused(forger.send(new ListQueuesCommand({})), { name: "SignatureDoesNotMatch", code: "SignatureDoesNotMatch", status: 403 }, "ListQueues signed with a wrong secret");
  const q = await freshQueue("forged");
  await refused(
    forger.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "forged" })),
    { name: "SignatureDoesNotMatch", status: 403 },
    "SendMessage signed with a wrong secret",
  );
  await assertEmpty(q.url);
  const unknown = client("MQGA" + "A".repeat(16), "x".repeat(40));
  await refused(unknown.send(new ListQueuesCommand({})), { name: "InvalidClientTokenId", status: 403 }, "a key id the gateway never issued");
});

scenario("other_project_queue", async () => {
  const q = await freshQueue("private");
  const gone = { cls: QueueDoesNotExist, name: "QueueDoesNotExist", code: "AWS.SimpleQueueService.NonExistentQueue" };
  await refused(stranger.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "intrusion" })), gone, "another project's key sending");
  await refused(stranger.send(new ReceiveMessageCommand({ QueueUrl: q.url })), gone, "another project's key receiving");
  await refused(stranger.send(new GetQueueAttributesCommand({ QueueUrl: q.url, AttributeNames: ["All"] })), gone, "another project's key reading attributes");
  await refused(stranger.send(new PurgeQueueCommand({ QueueUrl: q.url })), gone, "another project's key purging");
  await refused(stranger.send(new DeleteQueueCommand({ QueueUrl: q.url })), gone, "another project's key deleting the queue");
  await refused(
    stranger.send(new GetQueueUrlCommand({ QueueName: q.name, QueueOwnerAWSAccountId: q.account })),
    gone,
    "another project's key asking the URL by the owner's account",
  );
  await refused(stranger.send(new GetQueueUrlCommand({ QueueName: q.name })), gone, "another project's key asking the URL");
  const listed = await stranger.send(new ListQueuesCommand({ QueueNamePrefix: PREFIX }));
  eq(listed.QueueUrls ?? [], [], "another project's ListQueues");
  // The queue is untouched: still there, empty.
  eq((await sqs.send(new GetQueueUrlCommand({ QueueName: q.name }))).QueueUrl, q.url, "the owner's GetQueueUrl");
  await assertEmpty(q.url);
});

async function queueArn(url) {
  const out = await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["QueueArn"] }));
  check(out.Attributes?.QueueArn, `GetQueueAttributes ${url}: no QueueArn`);
  return out.Attributes.QueueArn;
}

// Neither InvalidParameterValue nor MissingParameter is a modeled error of SQS: the SDK raises
// an SQSServiceException named after the query code (x-amzn-query-error), as AWS answers them.
const INVALID_PARAMETER_VALUE = { name: "InvalidParameterValue", code: "InvalidParameterValue", status: 400 };
const MISSING_PARAMETER = { name: "MissingParameter", code: "MissingParameter", status: 400 };

scenario("dlq_redrive", async () => {
  const dlq = await freshQueue("dlq");
  const dlqArn = await queueArn(dlq.url);
  eq(dlqArn, `arn:aws:sqs:${REGION}:${dlq.account}:${dlq.name}`, "the dead-letter queue's QueueArn");
  const policy = { deadLetterTargetArn: dlqArn, maxReceiveCount: 2 };
  const src = await freshQueue("dlq-src", { RedrivePolicy: JSON.stringify(policy) });
  const shown = await sqs.send(new GetQueueAttributesCommand({ QueueUrl: src.url, AttributeNames: ["RedrivePolicy"] }));
  eq(JSON.parse(shown.Attributes?.RedrivePolicy ?? "null"), policy, "RedrivePolicy given at CreateQueue");

  const attributes = { kind: { DataType: "String", StringValue: "poison ☠" } };
  const sent = await sqs.send(new SendMessageCommand({ QueueUrl: src.url, MessageBody: "bad apple", MessageAttributes: attributes }));
  for (const count of ["1", "2"]) {
    // Received maxReceiveCount times, each time let go at once.
    const got = await receive(src.url, {
      WaitTimeSeconds: 5,
      VisibilityTimeout: 0,
      MessageSystemAttributeNames: ["ApproximateReceiveCount"],
    });
    eq(got.map((m) => [m.MessageId, m.Attributes?.ApproximateReceiveCount]), [[sent.MessageId, count]], `receive number ${count}`);
  }
  // The third receive moves it to the dead-letter queue instead of answering it.
  eq(await receive(src.url, { MaxNumberOfMessages: 10 }), [], "the third receive");
  const dead = await receive(dlq.url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 5, MessageAttributeNames: ["All"] });
  eq(dead.map((m) => [m.MessageId, m.Body]), [[sent.MessageId, "bad apple"]], "the message on the dead-letter queue");
  eq(dead[0].MessageAttributes, attributes, "its message attributes, as sent");
  eq(dead[0].MD5OfMessageAttributes, md5OfAttributes(attributes), "its MD5OfMessageAttributes");
  // Visible again on the dead-letter queue, for the move task to take.
  await sqs.send(new ChangeMessageVisibilityCommand({ QueueUrl: dlq.url, ReceiptHandle: dead[0].ReceiptHandle, VisibilityTimeout: 0 }));

  const sources = await sqs.send(new ListDeadLetterSourceQueuesCommand({ QueueUrl: dlq.url }));
  eq(sources.queueUrls, [src.url], "ListDeadLetterSourceQueues of the dead-letter queue");
  eq((await sqs.send(new ListDeadLetterSourceQueuesCommand({ QueueUrl: src.url }))).queueUrls ?? [], [], "ListDeadLetterSourceQueues of the source");

  // A move task sends it back to the queue it came from.
  const started = await sqs.send(new StartMessageMoveTaskCommand({ SourceArn: dlqArn }));
  check(started.TaskHandle, `StartMessageMoveTask answers a TaskHandle: ${JSON.stringify(started)}`);
  const task = await pollUntil(
    async () => {
      const out = await sqs.send(new ListMessageMoveTasksCommand({ SourceArn: dlqArn }));
      eq((out.Results ?? []).length, 1, "ListMessageMoveTasks results");
      return out.Results[0].Status !== "RUNNING" && out.Results[0];
    },
    30_000,
    "the move task to end",
  );
  eq(
    [task.TaskHandle, task.SourceArn, task.Status, task.ApproximateNumberOfMessagesMoved, task.ApproximateNumberOfMessagesToMove],
    [started.TaskHandle, dlqArn, "COMPLETED", 1, 1],
    "the move task ended",
  );
  const back = await receive(src.url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 5, MessageAttributeNames: ["All"] });
  eq(back.map((m) => [m.Body, m.MessageAttributes]), [["bad apple", attributes]], "the message back on its source queue");
  await assertEmpty(dlq.url);

  // maxReceiveCount is 1 to 1,000: 0 is refused, and the policy in place stays.
  const zero = { RedrivePolicy: JSON.stringify({ deadLetterTargetArn: dlqArn, maxReceiveCount: 0 }) };
  await refused(
    sqs.send(new SetQueueAttributesCommand({ QueueUrl: src.url, Attributes: zero })),
    INVALID_PARAMETER_VALUE,
    "SetQueueAttributes with a RedrivePolicy of maxReceiveCount 0",
  );
  await refused(
    sqs.send(new CreateQueueCommand({ QueueName: `${PREFIX}-dlq-zero`, Attributes: zero })),
    INVALID_PARAMETER_VALUE,
    "CreateQueue with a RedrivePolicy of maxReceiveCount 0",
  );
  const kept = await sqs.send(new GetQueueAttributesCommand({ QueueUrl: src.url, AttributeNames: ["RedrivePolicy"] }));
  eq(JSON.parse(kept.Attributes?.RedrivePolicy ?? "null"), policy, "RedrivePolicy after the refusals");
});

scenario("fifo_order_dedup", async () => {
  const q = await freshQueue("x.fifo", { FifoQueue: "true" });
  const groups = ["ga", "gb", "gc"];
  const ROUNDS = 4;
  // Two batches of six, the groups interleaved: ga-0 gb-0 gc-0 ga-1 gb-1 gc-1, then 2 and 3.
  const sequences = Object.fromEntries(groups.map((g) => [g, []]));
  for (const half of [0, 1]) {
    const entries = [];
    for (let n = half * 2; n < half * 2 + 2; n++) {
      for (const g of groups) {
        entries.push({ Id: `${g}-${n}`, MessageBody: `${g}-${n}`, MessageGroupId: g, MessageDeduplicationId: `${g}-${n}` });
      }
    }
    const out = await sqs.send(new SendMessageBatchCommand({ QueueUrl: q.url, Entries: entries }));
    eq(out.Failed ?? [], [], "SendMessageBatch Failed");
    eq((out.Successful ?? []).map((s) => s.Id).sort(), entries.map((e) => e.Id).sort(), "SendMessageBatch Successful");
    for (const e of entries) {
      const s = out.Successful.find((x) => x.Id === e.Id);
      check(s.MessageId, `entry ${e.Id} has a MessageId`);
      check(/^\d+$/.test(s.SequenceNumber ?? ""), `entry ${e.Id}'s SequenceNumber ${s.SequenceNumber}`);
      sequences[e.MessageGroupId].push(BigInt(s.SequenceNumber));
    }
  }
  for (const g of groups) {
    const seq = sequences[g];
    check(seq.every((v, i) => i === 0 || v > seq[i - 1]), `SequenceNumbers of ${g} not increasing: ${seq.join(", ")}`);
  }

  // Receive, deleting each batch before the next receive, until all twelve came.
  const seen = Object.fromEntries(groups.map((g) => [g, []]));
  let total = 0;
  await pollUntil(
    async () => {
      const got = await receive(q.url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageSystemAttributeNames: ["All"] });
      const lastInBatch = {};
      for (const m of got) {
        const g = m.Attributes?.MessageGroupId;
        check(groups.includes(g), `a message of group ${g}: ${JSON.stringify(m.Attributes)}`);
        check(m.Body.startsWith(`${g}-`), `${m.Body} received as of group ${g}`);
        eq(m.Attributes.MessageDeduplicationId, m.Body, `MessageDeduplicationId of ${m.Body}`);
        const n = BigInt(m.Attributes.SequenceNumber);
        check(lastInBatch[g] === undefined || n > lastInBatch[g], `SequenceNumbers of ${g} in one receive out of order`);
        lastInBatch[g] = n;
        seen[g].push(Number(m.Body.split("-")[1]));
      }
      total += got.length;
      if (got.length) {
        const del = await sqs.send(
          new DeleteMessageBatchCommand({ QueueUrl: q.url, Entries: got.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })) }),
        );
        eq(del.Failed ?? [], [], "DeleteMessageBatch Failed");
      }
      return total >= groups.length * ROUNDS;
    },
    30_000,
    "the twelve FIFO messages",
  );
  const inOrder = Array.from({ length: ROUNDS }, (_, n) => n);
  eq(seen, Object.fromEntries(groups.map((g) => [g, inOrder])), "each group's messages, in the order received");
  await assertEmpty(q.url);

  // The same MessageDeduplicationId again: the first send's answer, and nothing stored.
  const one = await sqs.send(
    new SendMessageCommand({ QueueUrl: q.url, MessageBody: "first", MessageGroupId: "gd", MessageDeduplicationId: "once" }),
  );
  const two = await sqs.send(
    new SendMessageCommand({ QueueUrl: q.url, MessageBody: "second", MessageGroupId: "gd", MessageDeduplicationId: "once" }),
  );
  check(one.MessageId && one.SequenceNumber, `a FIFO send answers a MessageId and a SequenceNumber: ${JSON.stringify(one)}`);
  eq([two.MessageId, two.SequenceNumber], [one.MessageId, one.SequenceNumber], "a duplicate send's MessageId and SequenceNumber");
  const got = await receive(q.url, { MaxNumberOfMessages: 10, WaitTimeSeconds: 2 });
  eq(got.map((m) => [m.MessageId, m.Body]), [[one.MessageId, "first"]], "the deduplicated messages received");
  await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: got[0].ReceiptHandle }));
  await assertEmpty(q.url);

  // A FIFO queue's message needs its group.
  await refused(
    sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: "stray", MessageDeduplicationId: "nogroup" })),
    MISSING_PARAMETER,
    "a FIFO send without MessageGroupId",
  );
  const batch = await sqs.send(
    new SendMessageBatchCommand({
      QueueUrl: q.url,
      Entries: [
        { Id: "ok", MessageBody: "fine", MessageGroupId: "ge", MessageDeduplicationId: "fine" },
        { Id: "nogroup", MessageBody: "stray", MessageDeduplicationId: "stray" },
      ],
    }),
  );
  eq((batch.Successful ?? []).map((s) => s.Id), ["ok"], "a FIFO batch's Successful");
  eq((batch.Failed ?? []).map((f) => [f.Id, f.Code, f.SenderFault]), [["nogroup", "MissingParameter", true]], "a FIFO batch's Failed");
  eq((await receiveAll(q.url, 1)).map((m) => m.Body), ["fine"], "what the FIFO batch stored");
});

// ---------------------------------------------------------------------------------------------
// Run them, one after the other.

function withTimeout(promise, ms, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Failure(`scenario ${name} not done within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main() {
  const only = new Set(opts.only.split(",").filter(Boolean));
  const unknown = [...only].filter((n) => !scenarios.some((s) => s.name === n));
  if (unknown.length) {
    process.stderr.write(`usage error: no scenario ${unknown.join(", ")}\n`);
    process.exit(2);
  }
  const failed = [];
  for (const s of scenarios) {
    if (only.size && !only.has(s.name)) continue;
    const t0 = Date.now();
    const line = { scenario: s.name, ok: true, ms: 0 };
    try {
      await withTimeout(s.fn(), s.timeoutMs, s.name);
    } catch (err) {
      line.ok = false;
      if (err instanceof Failure) {
        line.error = err.message;
      } else {
        line.error = `unexpected ${describeError(err)}`;
        line.name = err?.name;
        if (err?.Code) line.code = err.Code;
        if (err?.$metadata?.httpStatusCode) line.status = err.$metadata.httpStatusCode;
      }
      failed.push(`${s.name}: ${line.error}`);
    }
    line.ms = Date.now() - t0;
    process.stdout.write(JSON.stringify(line) + "\n");
  }
  sqs.destroy();
  stranger.destroy();
  if (failed.length) {
    process.stderr.write(`FAILED ${failed.length} scenario(s):\n${failed.map((f) => "  " + f).join("\n")}\n`);
    process.exitCode = 1;
  } else {
    process.stderr.write("all scenarios passed\n");
  }
}

main().catch((err) => {
  process.stderr.write(`the suite itself broke: ${err?.stack ?? err}\n`);
  process.exitCode = 1;
});
