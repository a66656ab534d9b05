// The official Node SDK of Alibaba Cloud MQ's HTTP API (@aliyunmq/mq-http-sdk, unchanged) against a
// real gateway: tests/aliyun/test_aliyun_js.py makes the instance, its key, a topic and a
// mode=message group per scenario, passes them as one JSON argument, and reads one JSON line per
// scenario: {"scenario": name, "ok": true} or {"scenario": name, "ok": false, "error": "..."}.
import assert from "node:assert/strict";
import MQ from "@aliyunmq/mq-http-sdk";

const { MQClient, MessageProperties } = MQ;
const config = JSON.parse(process.argv[2]);
const SCENARIO_TIMEOUT_MS = 60000;

function client(secret) {
  return new MQClient(config.endpoint, config.keyId, secret ?? config.secret);
}

function topicOf(name) {
  return config.topics[name];
}

async function publish(name, body, tag, props) {
  const { topic } = topicOf(name);
  return client().getProducer(config.instance, topic).publishMessage(body, tag, props);
}

function consumer(name, tag) {
  const { topic, group } = topicOf(name);
  return client().getConsumer(config.instance, topic, group, tag);
}

// Consume with 1-second long polls until `count` messages came (none acked).
async function consumeUntil(c, count, orderly = false) {
  const got = [];
  const deadline = Date.now() + 30000;
  while (got.length < count) {
    assert.ok(Date.now() < deadline, `only ${got.length} of ${count} messages`);
    try {
      const res = orderly ? await c.consumeMessageOrderly(16, 1) : await c.consumeMessage(16, 1);
      assert.equal(res.code, 200);
      got.push(...res.body);
    } catch (e) {
      if (e.Code !== "MessageNotExist") throw e;
    }
  }
  return got;
}

async function nothingToConsume(c, wait = 0) {
  try {
    await c.consumeMessage(16, wait);
  } catch (e) {
    assert.equal(e.Code, "MessageNotExist");
    return;
  }
  assert.fail("a message was consumed");
}

const scenarios = {
  async publish_consume_ack_tags_keys_properties() {
    for (const [i, tag] of ["TagA", "TagB", "TagC"].entries()) {
      const props = new MessageProperties();
      props.messageKey(`order-${i}`);
      props.putProperty("color", "blue");
      const res = await publish("basic", `order ${i} <&> ünïcode`, tag, props);
      assert.equal(res.code, 201);
      assert.ok(res.body.MessageId && res.body.MessageBodyMD5);
    }
    const c = consumer("basic", "TagA||TagC");
    const got = await consumeUntil(c, 2);
    assert.deepEqual(got.map((m) => m.MessageTag).sort(), ["TagA", "TagC"]);
    for (const m of got) {
      const i = m.MessageBody.split(" ")[1];
      assert.equal(m.MessageBody, `order ${i} <&> ünïcode`);
      assert.equal(m.MessageKey, `order-${i}`);
      assert.equal(m.Properties.color, "blue");
      assert.equal(Number(m.ConsumedTimes), 1);
      assert.ok(Number(m.PublishTime) <= Number(m.FirstConsumeTime));
      assert.ok(Number(m.NextConsumeTime) > Date.now() + 20000);
    }
    const ack = await c.ackMessage(got.map((m) => m.ReceiptHandle));
    assert.equal(ack.code, 204);
    await nothingToConsume(c);
  },

  async long_poll_woken_by_publish() {
    const c = consumer("longpoll");
    const started = Date.now();
    const polling = c.consumeMessage(4, 20);
    await publish("longpoll", "wake up");
    const res = await polling;
    assert.deepEqual(res.body.map((m) => m.MessageBody), ["wake up"]);
    assert.ok(Date.now() - started < 15000);
    await c.ackMessage([res.body[0].ReceiptHandle]);
  },

  async delayed_message() {
    const start = Date.now() + 2500;
    const props = new MessageProperties();
    props.startDeliverTime(start);
    await publish("delay", "later", "TagD", props);
    const c = consumer("delay");
    await nothingToConsume(c);
    const [m] = await consumeUntil(c, 1);
    assert.ok(Date.now() >= start - 50);
    assert.equal(m.MessageBody, "later");
    assert.equal(Number(m.StartDeliverTime), start);
    await c.ackMessage([m.ReceiptHandle]);
  },

  async redelivery_and_bad_handles() {
    await publish("redelivery", "again");
    const c = consumer("redelivery");
    const [first] = await consumeUntil(c, 1);
    const [second] = await consumeUntil(c, 1); // the group's invisible time is 1 s
    assert.equal(second.MessageId, first.MessageId);
    assert.equal(Number(second.ConsumedTimes), 2);
    assert.equal(second.FirstConsumeTime, first.FirstConsumeTime);
    const ack = await c.ackMessage([first.ReceiptHandle, "not-a-handle", second.ReceiptHandle]);
    assert.equal(ack.code, 404);
    const codes = Object.fromEntries(ack.body.map((e) => [e.ReceiptHandle, e.ErrorCode]));
    assert.deepEqual(codes, { [first.ReceiptHandle]: "MessageNotExist", "not-a-handle": "ReceiptHandleError" });
    await nothingToConsume(c);
  },

  async ordered_consume() {
    const keys = ["k0", "k1", "k2"];
    for (let i = 0; i < 4; i++) {
      for (const k of keys) {
        const props = new MessageProperties();
        props.shardingKey(k);
        await publish("ordered", `${k}:${i}`, "", props);
      }
    }
    const c = consumer("ordered");
    const seen = Object.fromEntries(keys.map((k) => [k, []]));
    const deadline = Date.now() + 30000;
    while (Object.values(seen).flat().length < 12) {
      assert.ok(Date.now() < deadline, JSON.stringify(seen));
      let res;
      try {
        res = await c.consumeMessageOrderly(2, 1);
      } catch (e) {
        if (e.Code !== "MessageNotExist") throw e;
        continue;
      }
      for (const m of res.body) {
        const [k, i] = m.MessageBody.split(":");
        assert.equal(m.ShardingKey, k);
        seen[k].push(Number(i));
      }
      assert.equal((await c.ackMessage(res.body.map((m) => m.ReceiptHandle))).code, 204);
    }
    assert.deepEqual(seen, Object.fromEntries(keys.map((k) => [k, [0, 1, 2, 3]])));
  },

  async transaction_commit_rollback_check() {
    const { topic, group } = topicOf("trans");
    const trans = client().getTransProducer(config.instance, topic, group);
    const half = async (body, checkS) => {
      const props = new MessageProperties();
      props.transCheckImmunityTime(checkS);
      const res = await trans.publishMessage(body, "TagT", props);
      assert.equal(res.code, 201);
      assert.ok(res.body.ReceiptHandle);
      return res.body;
    };
    const committed = await half("committed", 60);
    const rolledBack = await half("rolled back", 60);
    await half("checked", 1);
    const c = consumer("trans");
    await nothingToConsume(c);
    assert.equal((await trans.commit(committed.ReceiptHandle)).code, 204);
    assert.equal((await trans.rollback(rolledBack.ReceiptHandle)).code, 204);
    const [m] = await consumeUntil(c, 1);
    assert.equal(m.MessageBody, "committed");
    await c.ackMessage([m.ReceiptHandle]);
    let popped = [];
    const deadline = Date.now() + 30000;
    while (popped.length === 0) {
      assert.ok(Date.now() < deadline);
      try {
        popped = (await trans.consumeHalfMessage(16, 1)).body;
      } catch (e) {
        if (e.Code !== "MessageNotExist") throw e;
      }
    }
    assert.deepEqual(popped.map((p) => p.MessageBody), ["checked"]);
    // The SDK (1.0.4) reads __TransCheckT into StartDeliverTime.
    assert.equal(popped[0].StartDeliverTime, 1);
    assert.equal((await trans.commit(popped[0].ReceiptHandle)).code, 204);
    const [checked] = await consumeUntil(c, 1);
    assert.equal(checked.MessageBody, "checked");
    assert.equal(checked.StartDeliverTime, undefined); // a committed message is no longer transactional
    await c.ackMessage([checked.ReceiptHandle]);
    await nothingToConsume(c);
  },

  async wrong_secret() {
    const { topic } = topicOf("basic");
    try {
      // Another first character: "x" + the rest was the secret itself when it began with "x".
      const wrong = (config.secret[0] === "x" ? "y" : "x") + config.secret.slice(1);
      await client(wrong).getProducer(config.instance, topic).publishMessage("x", "");
    } catch (e) {
      assert.equal(e.Code, "SignatureDoesNotMatch");
      assert.ok(e.RequestId);
      return;
    }
    assert.fail("published with a wrong secret");
  },

  async unknown_topic() {
    try {
      await client().getProducer(config.instance, "no-such-topic").publishMessage("x", "");
    } catch (e) {
      assert.equal(e.Code, "TopicNotExist");
      return;
    }
    assert.fail("published to a topic that does not exist");
  },
};

for (const [name, run] of Object.entries(scenarios)) {
  let timer;
  try {
    await Promise.race([
      run(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`not done within ${SCENARIO_TIMEOUT_MS} ms`)), SCENARIO_TIMEOUT_MS);
      }),
    ]);
    console.log(JSON.stringify({ scenario: name, ok: true }));
  } catch (e) {
    console.log(JSON.stringify({ scenario: name, ok: false, error: `${e.Code ?? ""} ${e.stack ?? e}` }));
  } finally {
    clearTimeout(timer);
  }
}
