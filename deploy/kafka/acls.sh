#!/usr/bin/env bash
# Print (or, with --apply, run) the kafka-acls commands of least privilege for stepstream
# (docs/operations.md, "Kafka ACLs"). Nothing else is granted: the broker must run an
# authorizer with allow.everyone.if.no.acl.found=false.
#
#   deploy/kafka/acls.sh [--bootstrap HOST:PORT] [--command-config FILE]
#                        [--topic RAW] [--dlq DLQ] [--group GROUP] [--prefixed]
#                        [--agents PRINCIPAL] [--worker PRINCIPAL] [--compactor PRINCIPAL]
#                        [--worker-creates-topics] [--api-ingest PRINCIPAL] [--api-transactional-id PREFIX]
#                        [--otlp-topic OTLP] [--apply]
#
# Defaults: --topic stepstream.events, --dlq RAW.dlq, --group stepstream-worker (the
# worker's app id), principals User:agents, User:worker, User:compactor. --prefixed
# grants on every name starting with RAW, DLQ and GROUP (test brokers; least privilege
# means literal names). --worker-creates-topics also lets the worker CREATE both topics
# (else run it with --no-create-topics and let an admin create them). The API needs no
# ACL, unless it serves the ingest route (stepstream api --ingest): --api-ingest
# PRINCIPAL grants that principal WRITE on the raw topic, like the agents, and WRITE and
# DESCRIBE on the transactional ids starting with PREFIX (stepstream-api, the API's
# STEPSTREAM_INGEST_TRANSACTIONAL_ID): its producers are transactional. --otlp-topic
# OTLP (STEPSTREAM_OTLP_TOPIC) lets the worker READ it, and the --api-ingest principal
# WRITE it (POST /v1/traces); an OpenTelemetry Collector writing to it needs WRITE too. --apply
# runs each command with the Kafka jars kafka.sh fetched (KAFKA_LIBS, or the cache);
# FILE holds the admin client's settings (security.protocol, sasl.*, ssl.*).
set -euo pipefail

bootstrap="127.0.0.1:9092" command_config="" topic="stepstream.events" dlq="" group="stepstream-worker"
agents="User:agents" worker="User:worker" compactor="User:compactor"
pattern="literal" creates=0 apply=0 api="" otlp="" txn_prefix="stepstream-api"
while (($#)); do
    case "$1" in
        --bootstrap) bootstrap="${2:?}"; shift 2 ;;
        --command-config) command_config="${2:?}"; shift 2 ;;
        --topic) topic="${2:?}"; shift 2 ;;
        --dlq) dlq="${2:?}"; shift 2 ;;
        --group) group="${2:?}"; shift 2 ;;
        --agents) agents="${2:?}"; shift 2 ;;
        --worker) worker="${2:?}"; shift 2 ;;
        --compactor) compactor="${2:?}"; shift 2 ;;
        --prefixed) pattern="prefixed"; shift ;;
        --worker-creates-topics) creates=1; shift ;;
        --api-ingest) api="${2:?}"; shift 2 ;;
        --api-transactional-id) txn_prefix="${2:?}"; shift 2 ;;
        --otlp-topic) otlp="${2:?}"; shift 2 ;;
        --apply) apply=1; shift ;;
        -h|--help) sed -n '2,24s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "acls.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
dlq="${dlq:-$topic.dlq}"

base=(--bootstrap-server "$bootstrap")
[[ -n "$command_config" ]] && base+=(--command-config "$command_config")
base+=(--add)
named=(--resource-pattern-type "$pattern")  # topics and groups; the cluster is always literal

grants=()  # one command per line, arguments separated by tabs
grant() { local IFS=$'\t'; grants+=("$*"); }
note() { grants+=("#$*"); }

note " agents ($agents): the SDK, stepstream demo and import --publish. WRITE on the raw topic only;"
note " IdempotentWrite on the cluster is what brokers before Kafka 3.2 ask of an idempotent producer."
grant --allow-principal "$agents" --operation Write "${named[@]}" --topic "$topic"
grant --allow-principal "$agents" --operation IdempotentWrite --cluster
note " worker ($worker): READ on the raw topic and its group, WRITE on the dead-letter topic."
grant --allow-principal "$worker" --operation Read "${named[@]}" --topic "$topic" --group "$group"
grant --allow-principal "$worker" --operation Write "${named[@]}" --topic "$dlq"
grant --allow-principal "$worker" --operation IdempotentWrite --cluster
if [[ -n "$otlp" ]]; then
    note " worker: READ on the OTLP topic (STEPSTREAM_OTLP_TOPIC), in the same group, and WRITE on the raw"
    note " topic: its OTLP stage republishes one record per span event there (docs/otel.md)."
    grant --allow-principal "$worker" --operation Read "${named[@]}" --topic "$otlp"
    grant --allow-principal "$worker" --operation Write "${named[@]}" --topic "$topic"
fi
if ((creates)); then
    note " worker: CREATE both topics (without it: stepstream worker --no-create-topics)."
    grant --allow-principal "$worker" --operation Create "${named[@]}" --topic "$topic" --topic "$dlq"
fi
note " compactor ($compactor): WRITE on the raw topic (its run_close events)."
grant --allow-principal "$compactor" --operation Write "${named[@]}" --topic "$topic"
grant --allow-principal "$compactor" --operation IdempotentWrite --cluster
if [[ -n "$api" ]]; then
    note " api ($api), serving the ingest route (stepstream api --ingest): WRITE on the raw topic, as the agents."
    grant --allow-principal "$api" --operation Write "${named[@]}" --topic "$topic"
    grant --allow-principal "$api" --operation IdempotentWrite --cluster
    note " api: WRITE and DESCRIBE on its transactional ids ($txn_prefix-HOST-PID-...: its producers are transactional)."
    grant --allow-principal "$api" --operation Write --operation Describe --resource-pattern-type prefixed \
        --transactional-id "$txn_prefix"
    if [[ -n "$otlp" ]]; then
        note " api: WRITE on the OTLP topic (POST /v1/traces)."
        grant --allow-principal "$api" --operation Write "${named[@]}" --topic "$otlp"
    fi
else
    note " api: none (it reads the stores, not Kafka; with --ingest see --api-ingest)."
fi

if ((!apply)); then
    for line in "${grants[@]}"; do
        if [[ "$line" == "#"* ]]; then
            echo "$line"
        else
            IFS=$'\t' read -r -a args <<<"$line"
            printf 'kafka-acls'
            printf ' %q' "${base[@]}" "${args[@]}"
            printf '\n'
        fi
    done
    exit 0
fi

cache="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}"
libs="${KAFKA_LIBS:-$cache/kafka-4.3.1/libs}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ -d "$libs" ]] || { echo "acls.sh: no Kafka jars in $libs: run deploy/kafka/kafka.sh fetch" >&2; exit 1; }
# The same ACLs as printed, with the principals of identical grants in one command
# (kafka-acls takes several --allow-principal): fewer JVMs, each a second or two to start.
for who in "$agents" "$worker" "$compactor"; do
    [[ "$who" != *[[:space:]]* ]] || { echo "acls.sh: --apply takes principals without spaces (print the commands instead)" >&2; exit 2; }
done
declare -A principals=()
order=()
for line in "${grants[@]}"; do
    [[ "$line" == "#"* ]] && continue
    IFS=$'\t' read -r -a args <<<"$line"
    rest="${args[*]:2}"
    [[ -v "principals[$rest]" ]] || order+=("$rest")
    principals[$rest]+=" --allow-principal ${args[1]}"
done
pids=()
for rest in "${order[@]}"; do
    # shellcheck disable=SC2086  # principals and grant words: no spaces inside any of them
    java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
        -Dlog4j2.configurationFile="$here/log4j2-tools.xml" -cp "$libs/*" \
        org.apache.kafka.tools.AclCommand "${base[@]}" ${principals[$rest]} $rest >/dev/null &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
((rc == 0)) || { echo "acls.sh: a kafka-acls command failed (output above)" >&2; exit 1; }
echo "acls.sh: ${#pids[@]} ACL commands applied on $bootstrap" >&2
