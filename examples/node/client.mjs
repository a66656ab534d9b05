#!/usr/bin/env node
// mqgate example client: Node 20, built-in fetch, no npm packages.
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

import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

const MAX_PULLS = 50; // every loop is bounded
const WAIT_S = 1; // long-poll seconds per pull
const BATCH_LIMIT = 1000; // messages per POST /mq/produce/batch

class Failure extends Error {}

function env(name, dflt) {
  const value = process.env[name] ?? dflt;
  if (value === undefined || value === "") {
    throw new Failure(`environment variable ${name} is not set`);
  }
  return value;
}

let baseUrl; // set in main()

// One API call; returns { status, envelope, headers }. Throws Failure on a
// transport error, a non-envelope answer or an unexpected status.
async function call(method, path, token, { params, json, ok = [200] } = {}) {
  const url = new URL(baseUrl + path);
  for (const [k, v] of Object.entries(params ?? {})) url.searchParams.set(k, String(v));
  const headers = { Authorization: `Bearer ${token}` };
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  let resp;
  let text;
  try {
    resp = await fetch(url, {
      method,
      headers,
      body,
      signal: AbortSignal.timeout((WAIT_S + 15) * 1000),
    });
    text = await resp.text();
  } catch (err) {
    const cause = err.cause ? ` (${err.cause.code ?? err.cause.message ?? err.cause})` : "";
    throw new Failure(`${method} ${path}: ${err.name}: ${err.message}${cause}`);
  }
  let envelope;
  try {
    envelope = JSON.parse(text);
  } catch {
    throw new Failure(
      `${method} ${path}: HTTP ${resp.status}, answer is not JSON: ${JSON.stringify(text.slice(0, 300))}`,
    );
  }
  if (envelope === null || typeof envelope !== "object" || !("result" in envelope) || !("message" in envelope)) {
    throw new Failure(`${method} ${path}: HTTP ${resp.status}, not an envelope: ${text.slice(0, 300)}`);
  }
  if (envelope.status !== resp.status) {
    throw new Failure(`${method} ${path}: envelope status ${envelope.status} != HTTP ${resp.status}`);
  }
  if (!ok.includes(resp.status)) {
    const code = envelope.result && typeof envelope.result === "object" ? envelope.result.code : undefined;
    throw new Failure(
      `${method} ${path}: HTTP ${resp.status} code=${code} message=${JSON.stringify(envelope.message)}`,
    );
  }
  return { status: resp.status, envelope, headers: resp.headers };
}

async function main() {
  baseUrl = env("MQGATE_URL").replace(/\/+$/, "");
  const topic = env("MQGATE_TOPIC");
  const producer = env("MQGATE_PRODUCER");
  const producerToken = env("MQGATE_PRODUCER_TOKEN");
  const consumer = env("MQGATE_CONSUMER");
  const consumerToken = env("MQGATE_CONSUMER_TOKEN");
  const countText = env("MQGATE_COUNT", "10");
  if (!/^\d+$/.test(countText) || Number(countText) < 1) {
    throw new Failure("MQGATE_COUNT must be an integer >= 1");
  }
  const count = Number(countText);

  // A unique prefix: the topic may hold other messages, only ours count.
  const prefix = `mqgate-example-node-${randomUUID().replaceAll("-", "")}-`;
  const bodies = Array.from({ length: count }, (_, i) => `${prefix}${i}`);
  // Small batches, so that there are several of them and both ack styles are used.
  const maxPerPull = Math.min(1024, Math.max(1, Math.floor((count + 1) / 2)));

  // ---- produce: the first message alone, the rest in batches --------------
  const one = await call("POST", "/mq/produce", producerToken, {
    json: {
      producer,
      message: bodies[0],
      keys: ["example-0"],
      tags: ["example"],
      properties: { lang: "node" },
    },
  });
  if (!one.envelope.result?.msgId) {
    throw new Failure(`POST /mq/produce: no msgId in result ${JSON.stringify(one.envelope.result)}`);
  }
  let produced = 1;

  for (let start = 1; start < count; start += BATCH_LIMIT) {
    const chunk = bodies.slice(start, start + BATCH_LIMIT);
    const messages = chunk.map((message, j) => ({
      message,
      keys: [`example-${start + j}`],
      tags: ["example"],
      properties: { lang: "node" },
    }));
    const batch = await call("POST", "/mq/produce/batch", producerToken, {
      json: { producer, messages },
    });
    const receipts = batch.envelope.result?.receipts;
    if (!Array.isArray(receipts) || receipts.length !== chunk.length) {
      throw new Failure(
        `POST /mq/produce/batch: expected ${chunk.length} receipts, got ${JSON.stringify(receipts)}`,
      );
    }
    produced += chunk.length;
  }

  // ---- consume ---------------------------------------------------------------
  const expected = new Set(bodies);
  const received = new Set();
  let pending = null; // requestId of the batch not yet acked
  let piggybackAcks = 0;

  for (let pull = 0; pull < MAX_PULLS; pull++) {
    const params = { topic, consumer, max: maxPerPull, wait: WAIT_S };
    if (pending !== null) params.requestId = pending; // acks the previous batch first
    const { status, envelope, headers } = await call("GET", "/mq/message", consumerToken, {
      params,
      ok: [200, 429],
    });
    const result = envelope.result && typeof envelope.result === "object" ? envelope.result : {};

    if (pending !== null) {
      if (result.ack === "ok") {
        piggybackAcks++;
        pending = null;
      } else if (!(status === 429 && result.ack === undefined)) {
        throw new Failure(`ack of the previous batch via requestId failed: ack=${JSON.stringify(result.ack)}`);
      } // else: rate limited before the ack was looked at, send it again
    }

    if (status === 429) {
      const delay = Number(headers.get("Retry-After") ?? "1");
      await sleep(Math.min(Math.max(Number.isFinite(delay) ? delay : 1, 0.1), 5) * 1000);
      continue;
    }

    if (result.status === "FOUND") {
      if (!result.requestId || !Array.isArray(result.msgList)) {
        throw new Failure(`FOUND without requestId or msgList: ${JSON.stringify(result)}`);
      }
      for (const item of result.msgList) {
        const body = item?.message;
        if (typeof body === "string" && body.startsWith(prefix)) {
          if (!expected.has(body)) throw new Failure(`received a body that was never produced: ${body}`);
          received.add(body);
        }
      }
      pending = result.requestId;
      if (received.size === expected.size) break;
    } else if (result.status === "NO_NEW_MSG") {
      continue;
    } else if (result.status === "PAUSED") {
      await sleep(WAIT_S * 1000);
    } else {
      throw new Failure(`GET /mq/message: unexpected result.status ${JSON.stringify(result.status)}`);
    }
  }

  // ---- explicit ack of the last batch -----------------------------------------
  if (pending !== null) {
    await call("POST", "/mq/ack", consumerToken, { json: { requestId: pending } });
    pending = null;
  }

  const missing = bodies.filter((b) => !received.has(b));
  if (missing.length > 0) {
    throw new Failure(
      `${missing.length} of ${count} messages not received after ${MAX_PULLS} pulls, e.g. ${JSON.stringify(missing.slice(0, 3))}`,
    );
  }
  if (count > maxPerPull && piggybackAcks === 0) {
    throw new Failure("no batch was acked by passing requestId on the next pull");
  }

  console.log(`OK produced=${produced} consumed=${received.size}`);
}

try {
  await main();
  process.exitCode = 0;
} catch (err) {
  console.error(`FAIL: ${err instanceof Failure ? err.message : err?.stack ?? err}`);
  process.exitCode = 1;
}
