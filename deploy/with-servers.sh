#!/usr/bin/env bash
# Run a command against a throwaway Kafka broker and FerretDB (on its PostgreSQL backend;
# FERRETDB_BACKEND=sqlite for the other) on free ports in a temp
# dir, and stop both servers however the command ends (success, failure, ^C, TERM).
#
#   deploy/with-servers.sh [--no-mongo] [--secure] -- COMMAND [ARGS...]
#
# The command finds the servers in STEPSTREAM_TEST_BROKER (127.0.0.1:P) and
# STEPSTREAM_TEST_MONGO_URL (mongodb://127.0.0.1:P/). --secure also starts a locked-down
# broker (kafka.sh up --secure: SASL_SSL, mTLS, ACLs of deploy/kafka/acls.sh on the
# prefixes secure.raw., secure.dlq. and secure-group-) and exports
# STEPSTREAM_TEST_SECURE_KAFKA, the folder of its listeners, CA, certificates and passwords. A server that cannot start fails
# the run with its reason and log tail. Its exit status is the command's; on failure
# the server logs are kept (the path is printed).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

mongo=1 secure=0
while (($#)); do
    case "$1" in
        --no-mongo) mongo=0; shift ;;
        --secure) secure=1; shift ;;
        --) shift; break ;;
        *) break ;;
    esac
done
(($#)) || { echo "usage: deploy/with-servers.sh [--no-mongo] [--secure] -- COMMAND [ARGS...]" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/stepstream-test.XXXXXX")"
kafka_pid="" mongo_pid="" secure_pid=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # A start still in progress is stopped first; `down` then finds its server even
    # if the PID file was not written yet.
    [[ -n "$kafka_pid" ]] && kill "$kafka_pid" 2>/dev/null || true
    [[ -n "$mongo_pid" ]] && kill "$mongo_pid" 2>/dev/null || true
    [[ -n "$secure_pid" ]] && kill "$secure_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    deploy/kafka/kafka.sh down --data "$work/kafka" 2>/dev/null || true
    ((secure)) && { deploy/kafka/kafka.sh down --data "$work/kafka-secure" 2>/dev/null || true; }
    ((mongo)) && { deploy/ferretdb/ferretdb.sh down --data "$work/ferretdb" 2>/dev/null || true; }
    if ((rc == 0 || rc == 5)); then   # 5: pytest collected no tests
        rm -rf "$work"
    else
        # The secure broker's certificates and passwords go in any case; its logs stay.
        rm -rf "$work/kafka/kraft" "$work/ferretdb/db" "$work/ferretdb/pg" "$work/kafka-secure/kraft" "$work/kafka-secure/secure" \
            "$work/kafka-secure/server.properties"
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
if ((secure)); then
    deploy/kafka/kafka.sh up --secure --port 0 --data "$work/kafka-secure" >"$work/kafka-secure.addr" &
    secure_pid=$!
fi
kafka_rc=0 mongo_rc=0 secure_rc=0
wait "$kafka_pid" || kafka_rc=$?
kafka_pid=""
if ((secure)); then
    wait "$secure_pid" || secure_rc=$?
    secure_pid=""
fi
if ((mongo)); then
    wait "$mongo_pid" || mongo_rc=$?
    mongo_pid=""
fi
((kafka_rc == 0)) || { echo "with-servers.sh: the Kafka broker did not start (reason above)" >&2; exit 1; }
((secure_rc == 0)) || { echo "with-servers.sh: the secure Kafka broker did not start (reason above)" >&2; exit 1; }
if ((secure)); then
    # The ACLs of docs/operations.md, on test prefixes, applied over the super-user listener.
    deploy/kafka/acls.sh --apply --prefixed --bootstrap "$(sed -n 's/^PLAINTEXT=//p' "$work/kafka-secure/secure/listeners")" \
        --topic secure.raw. --dlq secure.dlq. --group secure-group- --api-ingest User:agents \
        || { echo "with-servers.sh: the secure broker's ACLs could not be applied" >&2; exit 1; }
    export STEPSTREAM_TEST_SECURE_KAFKA="$work/kafka-secure/secure"
fi
((mongo_rc == 0)) || { echo "with-servers.sh: FerretDB did not start (reason above)" >&2; exit 1; }

export STEPSTREAM_TEST_BROKER="$(cat "$work/kafka.addr")"
msg="STEPSTREAM_TEST_BROKER=$STEPSTREAM_TEST_BROKER"
if ((mongo)); then
    export STEPSTREAM_TEST_MONGO_URL="$(cat "$work/mongo.url")"
    msg+=" STEPSTREAM_TEST_MONGO_URL=$STEPSTREAM_TEST_MONGO_URL"
fi
((secure)) && msg+=" STEPSTREAM_TEST_SECURE_KAFKA=$STEPSTREAM_TEST_SECURE_KAFKA"
echo "with-servers.sh: servers ready in $((SECONDS - started))s: $msg" >&2

# Not exec: the EXIT trap must still run to stop the servers.
"$@"
