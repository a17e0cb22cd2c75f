#!/usr/bin/env bash
# `make run`: the local stack on SQLite: a Kafka broker, the worker, the compactor, the
# read API (with its ingest route) and a demo agent; prints curl lines with fresh API
# tokens (one that reads, one that posts an event) and the run viewer's URL. Runs in the
# foreground; Ctrl-C stops the API, the compactor, the worker and the broker.
#
# Environment: KAFKA_PORT (9092), WEB_PORT (6066), COMPACTOR_PORT (6068), API_PORT (8080),
# DEMO_RUNS (40), RUN_DIR (.run).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
deploy/require.sh run
run_dir="${RUN_DIR:-.run}"
web_port="${WEB_PORT:-6066}"
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"  # absolute: RUN_DIR may be relative to the repository or not
py=.venv/bin/python
db="$run_dir/stepstream.db"

broker="$(deploy/kafka/kafka.sh status --data "$run_dir/kafka" 2>/dev/null || deploy/kafka/kafka.sh up --port "${KAFKA_PORT:-9092}" --data "$run_dir/kafka")"
echo "run: Kafka broker       $broker   (data $run_dir/kafka)"

export STEPSTREAM_BROKER="$broker"
export STEPSTREAM_STEPS_SINK="sqlite:///$db"
export STEPSTREAM_WEB_PORT="$web_port"
api_port="${API_PORT:-8080}"
export STEPSTREAM_TOKENS_FILE="$run_dir/tokens.json"

worker_pid=""
api_pid=""
compactor_pid=""
stop() {
    trap - EXIT INT TERM
    if [[ -n "$api_pid" ]]; then
        echo "run: stopping the API"
        kill "$api_pid" 2>/dev/null || true
        wait "$api_pid" 2>/dev/null || true
    fi
    if [[ -n "$compactor_pid" ]]; then
        echo "run: stopping the compactor"
        kill "$compactor_pid" 2>/dev/null || true
        wait "$compactor_pid" 2>/dev/null || true
    fi
    if [[ -n "$worker_pid" ]]; then
        echo "run: stopping the worker"
        kill "$worker_pid" 2>/dev/null || true
        wait "$worker_pid" 2>/dev/null || true
    fi
    echo "run: stopping the broker"
    deploy/kafka/kafka.sh down --data "$run_dir/kafka" || true
}
trap stop EXIT
trap 'exit 130' INT TERM

.venv/bin/stepstream worker >"$run_dir/worker.log" 2>&1 &
worker_pid=$!
for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$web_port/healthz" >/dev/null 2>&1 && break
    kill -0 "$worker_pid" 2>/dev/null || { echo "run: the worker exited; see $run_dir/worker.log" >&2; tail -20 "$run_dir/worker.log" >&2; exit 1; }
    sleep 0.2
done
echo "run: worker             pid $worker_pid, metrics http://127.0.0.1:$web_port/metrics, log $run_dir/worker.log"

compactor_port="${COMPACTOR_PORT:-6068}"
.venv/bin/stepstream compactor --web-port "$compactor_port" --interval 30 >"$run_dir/compactor.log" 2>&1 &
compactor_pid=$!
echo "run: compactor          pid $compactor_pid, metrics http://127.0.0.1:$compactor_port/metrics, log $run_dir/compactor.log"

.venv/bin/stepstream demo --runs "${DEMO_RUNS:-40}" --companies 4 --out "$run_dir/demo-events.jsonl"

"$py" - "$web_port" "$run_dir/demo-events.jsonl" <<'PY'
import sys, time, urllib.request
port, path = sys.argv[1], sys.argv[2]
want = sum(1 for line in open(path, "rb") if line.strip())
def applied():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.rpartition(" ")[2]) for l in text.splitlines() if l.startswith("stepstream_events_total{"))
deadline = time.time() + 120
while time.time() < deadline and applied() < want:
    time.sleep(0.5)
print(f"run: worker applied {applied():.0f} of {want} demo events (the idle timer flushes open thinking tails after 5s)")
PY
sleep 6

"$py" - "$STEPSTREAM_STEPS_SINK" "$run_dir/demo-events.jsonl" <<'PY'
import asyncio, sys
import msgspec
from stepstream.sinks import open_deep_store, open_step_store

async def main(url, path):
    companies = sorted({msgspec.json.decode(line)["company_id"] for line in open(path, "rb") if line.strip()})
    steps, deep = await open_step_store(url), await open_deep_store(url)
    for company in companies:
        runs = await steps.list_runs(company, limit=1000)
        if not runs:
            continue
        failed = sum(r.status == "failed" for r in runs)
        print(f"  {company:10s} {len(runs):3d} runs ({failed} failed), {sum(r.step_count for r in runs)} steps")
    await steps.close(); await deep.close()

print("run: what landed in SQLite:")
asyncio.run(main(sys.argv[1], sys.argv[2]))
PY

.venv/bin/stepstream api --ingest --port "$api_port" >"$run_dir/api.log" 2>&1 &
api_pid=$!
for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$api_port/healthz" >/dev/null 2>&1 && break
    kill -0 "$api_pid" 2>/dev/null || { echo "run: the API exited; see $run_dir/api.log" >&2; tail -20 "$run_dir/api.log" >&2; exit 1; }
    sleep 0.2
done
echo "run: read API           pid $api_pid, http://127.0.0.1:$api_port (log $run_dir/api.log, tokens $run_dir/tokens.json)"
company="$("$py" -c 'import sys, msgspec; print(msgspec.json.decode(open(sys.argv[1], "rb").readline())["company_id"])' "$run_dir/demo-events.jsonl")"
token="$(.venv/bin/stepstream token add --company "$company" --scope steps:read --scope deep:read 2>/dev/null)"
ingest_token="$(.venv/bin/stepstream token add --company "$company" --scope ingest 2>/dev/null)"
event="$("$py" -c 'import sys, uuid, datetime; print("{\"v\":1,\"event_id\":\"%s\",\"company_id\":\"%s\",\"run_id\":\"curl-%s\",\"seq\":0,\"ts\":\"%s\",\"type\":\"run_start\",\"payload\":{\"agent_name\":\"curl\"}}" % (uuid.uuid4(), sys.argv[1], uuid.uuid4().hex[:8], datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))' "$company")"

cat <<EOF

Read the runs of company $company through the API (a fresh token, shown once):
  curl -s -H 'Authorization: Bearer $token' 'http://127.0.0.1:$api_port/v1/companies/$company/runs?limit=5'
  (one run: .../runs/RUN_ID; its raw bodies: .../runs/RUN_ID/deep; the schema: http://127.0.0.1:$api_port/openapi.json)
Or in a browser, the run viewer (sign in with the same token):
  http://127.0.0.1:$api_port/ui/companies/$company/runs

Write an event of company $company through the API (an ingest token: it writes $company only):
  curl -s -X POST -H 'Authorization: Bearer $ingest_token' -H 'Content-Type: application/x-ndjson' \
    --data-binary '$event' 'http://127.0.0.1:$api_port/v1/companies/$company/events'
  (202 {"accepted":1} once the broker holds it; the SDK does the same: Tracer("http://127.0.0.1:$api_port", token=...))

Look at the results:
  metrics     curl -s http://127.0.0.1:$web_port/metrics | grep ^stepstream_
  readiness   curl -s http://127.0.0.1:$web_port/ready
  the rows    sqlite database $db (steps, deep companions, runs)
  more runs   .venv/bin/stepstream demo --broker $broker --runs 100
  retention   curl -s http://127.0.0.1:$compactor_port/metrics | grep -E '^stepstream_(runs_pruned|runs_abandoned|deep_bodies)'
  purge       .venv/bin/stepstream purge --steps-sink $STEPSTREAM_STEPS_SINK --company co-00 --dry-run
  offline     .venv/bin/stepstream ingest-file $run_dir/demo-events.jsonl --steps-sink sqlite:///$run_dir/offline.db
  tokens      .venv/bin/stepstream token list   (STEPSTREAM_TOKENS_FILE=$STEPSTREAM_TOKENS_FILE)
Ctrl-C stops the API, the compactor, the worker and the broker.
EOF
wait "$worker_pid"
