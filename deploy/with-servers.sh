#!/usr/bin/env bash
# Run a command against a throwaway Kafka broker and FerretDB (on its PostgreSQL backend;
# FERRETDB_BACKEND=sqlite for the other) on free ports in a temp
# dir, and stop both servers however the command ends (success, failure, ^C, TERM).
#
#   deploy/with-servers.sh [--no-mongo] -- COMMAND [ARGS...]
#
# The command finds the servers in STEPSTREAM_TEST_BROKER (127.0.0.1:P) and
# STEPSTREAM_TEST_MONGO_URL (mongodb://127.0.0.1:P/). A server that cannot start fails
# the run with its reason and log tail. Its exit status is the command's; on failure
# the server logs are kept (the path is printed).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

mongo=1
while (($#)); do
    case "$1" in
        --no-mongo) mongo=0; shift ;;
        --) shift; break ;;
        *) break ;;
    esac
done
(($#)) || { echo "usage: deploy/with-servers.sh [--no-mongo] -- COMMAND [ARGS...]" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/stepstream-test.XXXXXX")"
kafka_pid="" mongo_pid=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # A start still in progress is stopped first; `down` then finds its server even
    # if the PID file was not written yet.
    [[ -n "$kafka_pid" ]] && kill "$kafka_pid" 2>/dev/null || true
    [[ -n "$mongo_pid" ]] && kill "$mongo_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    deploy/kafka/kafka.sh down --data "$work/kafka" 2>/dev/null || true
    ((mongo)) && { deploy/ferretdb/ferretdb.sh down --data "$work/ferretdb" 2>/dev/null || true; }
    if ((rc == 0 || rc == 5)); then   # 5: pytest collected no tests
        rm -rf "$work"
    else
        rm -rf "$work/kafka/kraft" "$work/ferretdb/db" "$work/ferretdb/pg"
        echo "with-servers.sh: exit $rc; server logs kept in $work" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Both start at once: the broker's JVM dominates, FerretDB answers in well under a second.
started=$SECONDS
deploy/kafka/kafka.sh up --port 0 --data "$work/kafka" >"$work/kafka.addr" &
kafka_pid=$!
if ((mongo)); then
    deploy/ferretdb/ferretdb.sh up --port 0 --data "$work/ferretdb" >"$work/mongo.url" &
    mongo_pid=$!
fi
kafka_rc=0 mongo_rc=0
wait "$kafka_pid" || kafka_rc=$?
kafka_pid=""
if ((mongo)); then
    wait "$mongo_pid" || mongo_rc=$?
    mongo_pid=""
fi
((kafka_rc == 0)) || { echo "with-servers.sh: the Kafka broker did not start (reason above)" >&2; exit 1; }
((mongo_rc == 0)) || { echo "with-servers.sh: FerretDB did not start (reason above)" >&2; exit 1; }

export STEPSTREAM_TEST_BROKER="$(cat "$work/kafka.addr")"
msg="STEPSTREAM_TEST_BROKER=$STEPSTREAM_TEST_BROKER"
if ((mongo)); then
    export STEPSTREAM_TEST_MONGO_URL="$(cat "$work/mongo.url")"
    msg+=" STEPSTREAM_TEST_MONGO_URL=$STEPSTREAM_TEST_MONGO_URL"
fi
echo "with-servers.sh: servers ready in $((SECONDS - started))s: $msg" >&2

# Not exec: the EXIT trap must still run to stop the servers.
"$@"
