#!/usr/bin/env bash
# Step 1 / server choice: raw ASGI app (benchmarks/baseline_asgi.py) under uvicorn vs granian,
# 1 worker each, hit with wrk -t2 -c64 -d10s POSTing a small JSON body. Loopback only.
# Usage: benchmarks/server_choice.sh [duration, default 10s] [rounds, default 2]
set -u
cd "$(dirname "$0")/.."
VENV=.venv/bin
DUR=${1:-10s}
ROUNDS=${2:-2}
PORT=${PORT:-18931}
LUA=benchmarks/lua/post_baseline.lua

run_one() {  # name, command...
  local name=$1; shift
  "$@" >/tmp/server_choice_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null -X POST -d '{}' http://127.0.0.1:$PORT/ && break
    sleep 0.1
  done
  # short warm-up
  wrk -t2 -c64 -d2s -s $LUA http://127.0.0.1:$PORT/ >/dev/null 2>&1
  for r in $(seq "$ROUNDS"); do
    echo "== $name round $r: $*"
    wrk -t2 -c64 -d"$DUR" --latency -s $LUA http://127.0.0.1:$PORT/ | grep -E "Requests/sec|Latency|50%|99%|Non-2xx|Socket errors"
  done
  kill "$pid"; wait "$pid" 2>/dev/null
}

run_one uvicorn $VENV/uvicorn benchmarks.baseline_asgi:app --host 127.0.0.1 --port $PORT \
  --workers 1 --http httptools --loop uvloop --no-access-log --log-level warning
run_one granian_st $VENV/granian --interface asgi --host 127.0.0.1 --port $PORT --workers 1 \
  --runtime-mode st --runtime-threads 1 --loop uvloop --no-access-log --log-level warning --no-ws \
  benchmarks.baseline_asgi:app
run_one granian_mt2 $VENV/granian --interface asgi --host 127.0.0.1 --port $PORT --workers 1 \
  --runtime-mode mt --runtime-threads 2 --loop uvloop --no-access-log --log-level warning --no-ws \
  benchmarks.baseline_asgi:app
