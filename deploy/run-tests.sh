#!/usr/bin/env bash
# `make test`: start a throwaway Kafka broker and FerretDB on free ports in a temp dir,
# run pytest against them, and stop both servers however pytest ends (pass, fail, ^C).
#
#   deploy/run-tests.sh [PYTEST ARGS...]    default: -m "not soak" over tests/
#
# Tests find the servers in STEPSTREAM_TEST_BROKER (127.0.0.1:P) and
# STEPSTREAM_TEST_MONGO_URL (mongodb://127.0.0.1:P/). A server that cannot start fails
# the run with its reason and log tail. On failure the server logs are kept.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[[ -x .venv/bin/pytest ]] || { echo "run-tests.sh: .venv is missing: run 'make test' (or 'make venv')" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/stepstream-test.XXXXXX")"
kafka_pid="" mongo_pid=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # A start still in progress is stopped first, so its server cannot outlive us.
    [[ -n "$kafka_pid" ]] && kill "$kafka_pid" 2>/dev/null || true
    [[ -n "$mongo_pid" ]] && kill "$mongo_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    deploy/kafka/kafka.sh down --data "$work/kafka" 2>/dev/null || true
    deploy/ferretdb/ferretdb.sh down --data "$work/ferretdb" 2>/dev/null || true
    if ((rc == 0)); then
        rm -rf "$work"
    else
        rm -rf "$work/kafka/kraft" "$work/ferretdb/db"
        echo "run-tests.sh: exit $rc; server logs kept in $work/{kafka/logs,ferretdb}" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Both servers start at once: the broker's JVM dominates, FerretDB is ready in well under a second.
started=$SECONDS
deploy/kafka/kafka.sh up --port 0 --data "$work/kafka" >"$work/kafka.addr" &
kafka_pid=$!
deploy/ferretdb/ferretdb.sh up --port 0 --data "$work/ferretdb" >"$work/mongo.url" &
mongo_pid=$!
kafka_rc=0 mongo_rc=0
wait "$kafka_pid" || kafka_rc=$?
kafka_pid=""
wait "$mongo_pid" || mongo_rc=$?
mongo_pid=""
((kafka_rc == 0)) || { echo "run-tests.sh: the Kafka broker did not start (see above)" >&2; exit 1; }
((mongo_rc == 0)) || { echo "run-tests.sh: FerretDB did not start (see above)" >&2; exit 1; }

export STEPSTREAM_TEST_BROKER="$(cat "$work/kafka.addr")"
export STEPSTREAM_TEST_MONGO_URL="$(cat "$work/mongo.url")"
echo "run-tests.sh: servers ready in $((SECONDS - started))s: STEPSTREAM_TEST_BROKER=$STEPSTREAM_TEST_BROKER STEPSTREAM_TEST_MONGO_URL=$STEPSTREAM_TEST_MONGO_URL" >&2

# Not exec: the EXIT trap must still run to stop the servers.
.venv/bin/pytest -q -rs -m "not soak" "$@"
