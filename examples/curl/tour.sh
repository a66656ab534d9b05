#!/usr/bin/env bash
# mqgate example client: bash + curl (python3 only to read and write JSON).
#
# Produces MQGATE_COUNT messages (one with POST /mq/produce as a form body,
# the rest with POST /mq/produce/batch as JSON), consumes them with
# GET /mq/message (long poll, wait=1, at most 50 pulls), acks every batch but
# the last by passing its requestId on the next pull, acks the last batch with
# POST /mq/ack, checks that every produced body came back and prints
#
#     OK produced=<n> consumed=<n>
#
# Configuration comes from the environment only: MQGATE_URL, MQGATE_TOPIC,
# MQGATE_PRODUCER, MQGATE_PRODUCER_TOKEN, MQGATE_CONSUMER,
# MQGATE_CONSUMER_TOKEN, MQGATE_COUNT (default 10).
# On any failure the reason goes to stderr and the exit status is 1.

set -euo pipefail

MAX_PULLS=50  # every loop is bounded
WAIT_S=1      # long-poll seconds per pull
BATCH_LIMIT=1000

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

for var in MQGATE_URL MQGATE_TOPIC MQGATE_PRODUCER MQGATE_PRODUCER_TOKEN MQGATE_CONSUMER MQGATE_CONSUMER_TOKEN; do
  [[ -n "${!var:-}" ]] || fail "environment variable $var is not set"
done
command -v curl >/dev/null || fail "curl is not installed"
command -v python3 >/dev/null || fail "python3 is not installed"

BASE_URL="${MQGATE_URL%/}"
COUNT="${MQGATE_COUNT:-10}"
[[ "$COUNT" =~ ^[0-9]+$ ]] && ((COUNT >= 1)) || fail "MQGATE_COUNT must be an integer >= 1"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# A unique prefix: the topic may hold other messages, only ours count.
PREFIX="mqgate-example-curl-$(python3 -c 'import uuid; print(uuid.uuid4().hex)')-"
# Small batches, so that there are several of them and both ack styles are used.
MAX_PER_PULL=$(((COUNT + 1) / 2))
((MAX_PER_PULL <= 1024)) || MAX_PER_PULL=1024

# Checks the envelope in $WORK/body against the HTTP status; exits non-zero
# with the reason on stderr if it is not an envelope or the status is not in
# the allowed list.   args: body-file http-status allowed(comma-separated) what
CHECK_ENVELOPE='
import json, sys
path, code, allowed, what = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
text = open(path, encoding="utf-8", errors="replace").read()
try:
    env = json.loads(text)
except ValueError:
    sys.exit(f"FAIL: {what}: HTTP {code}, answer is not JSON: {text[:300]!r}")
if not isinstance(env, dict) or "result" not in env or "message" not in env:
    sys.exit(f"FAIL: {what}: HTTP {code}, not an envelope: {text[:300]}")
status, message = env.get("status"), env["message"]
if status != code:
    sys.exit(f"FAIL: {what}: envelope status {status!r} != HTTP {code}")
if str(code) not in allowed:
    result = env["result"] if isinstance(env["result"], dict) else {}
    error_code = result.get("code")
    sys.exit(f"FAIL: {what}: HTTP {code} code={error_code} message={message!r}")
'

# api METHOD PATH TOKEN ALLOWED-STATUSES [curl args...]
# Leaves the answer in $WORK/body and $WORK/headers and the status in $HTTP_CODE.
api() {
  local method=$1 path=$2 token=$3 allowed=$4
  shift 4
  local get=()
  [[ "$method" == GET ]] && get=(-G)
  HTTP_CODE=$(curl -sS "${get[@]}" -X "$method" --max-time $((WAIT_S + 15)) \
    -H "Authorization: Bearer $token" \
    -o "$WORK/body" -D "$WORK/headers" -w '%{http_code}' \
    "$@" "$BASE_URL$path") || fail "$method $path: curl failed (exit $?)"
  python3 -c "$CHECK_ENVELOPE" "$WORK/body" "$HTTP_CODE" "$allowed" "$method $path" >&2 ||
    exit 1
}

# ---- produce: the first message alone (form body), the rest in JSON batches --
api POST /mq/produce "$MQGATE_PRODUCER_TOKEN" 200 \
  --data-urlencode "producer=$MQGATE_PRODUCER" \
  --data-urlencode "message=${PREFIX}0" \
  --data-urlencode "keys=example-0" \
  --data-urlencode "tags=example" \
  --data-urlencode 'properties={"lang":"curl"}'
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]
if not isinstance(r, dict) or not r.get("msgId"):
    sys.exit(f"FAIL: POST /mq/produce: no msgId in result {r!r}")
' "$WORK/body" || exit 1
PRODUCED=1

for ((start = 1; start < COUNT; start += BATCH_LIMIT)); do
  end=$((start + BATCH_LIMIT < COUNT ? start + BATCH_LIMIT : COUNT))
  python3 -c '
import json, sys
producer, prefix, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
messages = [{"message": f"{prefix}{i}", "keys": [f"example-{i}"], "tags": ["example"],
             "properties": {"lang": "curl"}} for i in range(start, end)]
json.dump({"producer": producer, "messages": messages}, sys.stdout)
' "$MQGATE_PRODUCER" "$PREFIX" "$start" "$end" >"$WORK/batch.json"
  api POST /mq/produce/batch "$MQGATE_PRODUCER_TOKEN" 200 \
    -H "Content-Type: application/json" --data-binary "@$WORK/batch.json"
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]
n = int(sys.argv[2])
receipts = r.get("receipts") if isinstance(r, dict) else None
if not isinstance(receipts, list) or len(receipts) != n:
    sys.exit(f"FAIL: POST /mq/produce/batch: expected {n} receipts, got {receipts!r}")
' "$WORK/body" $((end - start)) || exit 1
  PRODUCED=$((PRODUCED + end - start))
done

# ---- consume -------------------------------------------------------------------
# Reads one pull's answer; appends our bodies to $WORK/received and prints
# "<result.status> <requestId or -> <ack or ->" on one line.
READ_PULL='
import json, sys
path, received, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(path, encoding="utf-8"))["result"]
r = r if isinstance(r, dict) else {}
kind = r.get("status")
if kind == "FOUND":
    if not r.get("requestId") or not isinstance(r.get("msgList"), list):
        sys.exit(f"FAIL: FOUND without requestId or msgList: {r!r}")
    expected = {f"{prefix}{i}" for i in range(count)}
    with open(received, "a", encoding="utf-8") as out:
        for item in r["msgList"]:
            body = item.get("message") if isinstance(item, dict) else None
            if isinstance(body, str) and body.startswith(prefix):
                if body not in expected:
                    sys.exit(f"FAIL: received a body that was never produced: {body!r}")
                out.write(body + "\n")
ack = r.get("ack")
print(kind or "-", r.get("requestId") or "-", "-" if ack is None else json.dumps(ack).replace(" ", "_"))
'
: >"$WORK/received"
PENDING=""  # requestId of the batch not yet acked
PIGGYBACK_ACKS=0
RECEIVED=0

for ((pull = 0; pull < MAX_PULLS; pull++)); do
  args=(--data-urlencode "topic=$MQGATE_TOPIC" --data-urlencode "consumer=$MQGATE_CONSUMER"
    --data-urlencode "max=$MAX_PER_PULL" --data-urlencode "wait=$WAIT_S")
  # Passing the previous batch's requestId acks that batch first.
  if [[ -n "$PENDING" ]]; then args+=(--data-urlencode "requestId=$PENDING"); fi
  api GET /mq/message "$MQGATE_CONSUMER_TOKEN" 200,429 "${args[@]}"
  line=$(python3 -c "$READ_PULL" "$WORK/body" "$WORK/received" "$PREFIX" "$COUNT") || exit 1
  read -r kind request_id ack <<<"$line"

  if [[ -n "$PENDING" ]]; then
    if [[ "$ack" == '"ok"' ]]; then
      PIGGYBACK_ACKS=$((PIGGYBACK_ACKS + 1))
      PENDING=""
    elif ! [[ "$HTTP_CODE" == 429 && "$ack" == - ]]; then
      fail "ack of the previous batch via requestId failed: ack=$ack"
    fi # else: rate limited before the ack was looked at, send it again
  fi

  if [[ "$HTTP_CODE" == 429 ]]; then
    delay=$(tr -d '\r' <"$WORK/headers" | awk 'tolower($1) == "retry-after:" { print $2 }')
    [[ "$delay" =~ ^[0-9]+$ ]] || delay=1
    ((delay <= 5)) || delay=5
    sleep "$delay"
    continue
  fi

  case "$kind" in
  FOUND)
    PENDING="$request_id"
    RECEIVED=$(($(sort -u "$WORK/received" | wc -l)))
    if ((RECEIVED == COUNT)); then break; fi
    ;;
  NO_NEW_MSG) ;;
  PAUSED) sleep "$WAIT_S" ;;
  *) fail "GET /mq/message: unexpected result.status $kind" ;;
  esac
done

# ---- explicit ack of the last batch ------------------------------------------------
if [[ -n "$PENDING" ]]; then
  api POST /mq/ack "$MQGATE_CONSUMER_TOKEN" 200 --data-urlencode "requestId=$PENDING"
  PENDING=""
fi

RECEIVED=$(($(sort -u "$WORK/received" | wc -l)))
if ((RECEIVED != COUNT)); then
  fail "$((COUNT - RECEIVED)) of $COUNT messages not received after $MAX_PULLS pulls"
fi
if ((COUNT > MAX_PER_PULL && PIGGYBACK_ACKS == 0)); then
  fail "no batch was acked by passing requestId on the next pull"
fi

echo "OK produced=$PRODUCED consumed=$RECEIVED"
