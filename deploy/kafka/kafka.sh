#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft), run from Maven Central jars.
#
#   kafka.sh fetch                         jars into the cache (skipped when cached)
#   kafka.sh up   [--port P] [--data DIR]  start in the background, wait until ready,
#                 [--secure]               print the bootstrap address (127.0.0.1:P)
#   kafka.sh down [--data DIR] [--kill]    stop the broker of DIR and wait for it
#   kafka.sh status [--data DIR]           print the address if running, else exit 1
#
# --port 0 picks a free port. DIR defaults to <repo>/.run/kafka; a fresh DIR is
# formatted with a random cluster id, an existing one keeps its data and id.
# Only the bootstrap address goes to stdout; progress and errors go to stderr.
#
# --secure (on a fresh DIR): P is a SASL_SSL listener (SCRAM-SHA-512), beside an SSL
# listener that requires client certificates (mTLS) and an unauthenticated PLAINTEXT
# one (a super user: probe, ACL tool, benchmark); StandardAuthorizer, no access without
# an ACL. A CA, a broker certificate (SAN IP:127.0.0.1 only) and client certificates,
# and the SCRAM users' passwords, are made fresh in DIR/secure (mode 700): see
# DIR/secure/README. Users: admin (super user), worker, compactor, agents, api.
#
# Environment: STEPSTREAM_CACHE (default ~/.cache/stepstream), KAFKA_READY_TIMEOUT
# (seconds, default 90), KAFKA_HEAP_OPTS (default -Xms256m -Xmx512m), KAFKA_LOG4J2_CONFIG
# (the broker's log4j2 file, default log4j2.xml here: e.g. one with DEBUG for a logger). Maven's own
# repository (~/.m2) is used as usual; MAVEN_OPTS=-Dmaven.repo.local=... moves it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

kafka_version="4.3.1"   # keep in step with <kafka.version> in pom.xml
cache="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}"
kafka_home="$cache/kafka-$kafka_version"
libs="$kafka_home/libs"
stamp="$kafka_home/fetched.stamp"
ready_timeout="${KAFKA_READY_TIMEOUT:-90}"
heap_opts="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"

# True while PID runs; a dead child of this shell lingers as a zombie, which kill -0 accepts.
alive() {
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$state" && "$state" != Z ]]
}

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_in_use() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
# As the broker binds: SO_REUSEADDR, so a restart is not refused by old TIME_WAIT connections.
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
PY
}

# The pom's checksum is the stamp: editing pom.xml (a new version, a new jar) refetches.
pom_sum() { sha256sum "$here/pom.xml" | cut -d' ' -f1; }

fetch() {
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$(pom_sum)" ]]; then
        return 0
    fi
    command -v mvn >/dev/null || die "mvn not found: Maven is needed once to fetch the Kafka jars"
    mkdir -p "$kafka_home"
    # Two concurrent `make test` runs must not copy into the same directory.
    exec 9>"$kafka_home/.lock"
    flock 9
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$(pom_sum)" ]]; then
        exec 9>&-
        return 0
    fi
    log "fetching Apache Kafka $kafka_version jars from Maven Central into $libs"
    local started=$SECONDS
    rm -rf "$libs.partial"
    if ! mvn -B -ntp -f "$here/pom.xml" \
            -Dkafka.version="$kafka_version" \
            -Dstepstream.cache="$cache" \
            -Dstepstream.libs="$libs.partial" \
            -Dstyle.color=never package >"$kafka_home/fetch.log" 2>&1; then
        grep -E 'ERROR|FAIL' "$kafka_home/fetch.log" | head -n 30 >&2 || true
        die "Maven could not fetch the Kafka jars (full output: $kafka_home/fetch.log)"
    fi
    rm -rf "$libs"
    mv "$libs.partial" "$libs"
    pom_sum >"$stamp"
    exec 9>&-
    log "fetched $(ls "$libs" | wc -l) jars in $((SECONDS - started))s"
}

parse_args() {
    port=9092
    data="$repo/.run/kafka"
    hard_kill=0
    secure=0
    while (($#)); do
        case "$1" in
            --port) port="${2:?--port needs a value}"; shift 2 ;;
            --port=*) port="${1#*=}"; shift ;;
            --data) data="${2:?--data needs a value}"; shift 2 ;;
            --data=*) data="${1#*=}"; shift ;;
            --kill) hard_kill=1; shift ;;
            --secure) secure=1; shift ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    [[ "$port" =~ ^[0-9]+$ ]] || die "--port must be a number, got: $port"
    data="$(realpath -m -- "$data")"
    pid_file="$data/kafka.pid"
    addr_file="$data/bootstrap"
    secure_dir="$data/secure"
}

scram_users=(admin worker compactor agents api)

# A CA, a broker certificate and key (PKCS12 for the broker), client certificates (PEM,
# CN = the principal) for mTLS, and a random password per SCRAM user and keystore: all in
# DIR/secure, made once per data dir, never anywhere else.
make_secrets() {
    command -v openssl >/dev/null || die "openssl not found: --secure makes its certificates with it"
    local d="$secure_dir" user
    rm -rf "$d"
    mkdir -p "$d"
    chmod 700 "$d"
    (
        set -e
        umask 077
        cd "$d"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
            -subj "/CN=stepstream test CA $(date +%s)" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=stepstream-test-broker" 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >broker.ext
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile broker.ext -out broker.pem 2>/dev/null
        openssl rand -hex 24 >keystore.password
        openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
            -passout "file:keystore.password" -out broker.p12
        for user in worker agents; do
            openssl req -newkey rsa:2048 -nodes -keyout "client-$user.key" -out "client-$user.csr" -subj "/CN=$user" 2>/dev/null
            printf 'extendedKeyUsage=clientAuth\n' >client.ext
            openssl x509 -req -in "client-$user.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
                -extfile client.ext -out "client-$user.pem" 2>/dev/null
        done
        for user in "${scram_users[@]}"; do
            openssl rand -hex 24 >"$user.password"
        done
        rm -f ./*.csr ./*.ext ca.srl
    ) || die "making the test certificates and passwords in $d failed"
    cat >"$d/README" <<TXT
Made by kafka.sh up --secure for this data dir only; never commit any of it.
ca.pem                    the CA every listener's certificate chains to (clients' ssl_cafile)
client-<user>.pem/.key    client certificates for the SSL (mTLS) listener; CN=<user> is User:<user>
<user>.password           SCRAM-SHA-512 password of <user> (${scram_users[*]}); admin is a super user
listeners                 SASL_SSL, SSL and PLAINTEXT addresses (KEY=host:port)
TXT
}

scram_flags() {  # the storage tool's --add-scram flags, one per user
    local user
    for user in "${scram_users[@]}"; do
        printf -- '--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' "$user" "$(cat "$secure_dir/$user.password")"
    done
}

prepare_data() {
    mkdir -p "$data"
    # .run/ (the Makefile's data dirs) must not show up in `git status`.
    case "$data" in "$repo/.run"/*) [[ -e "$repo/.run/.gitignore" ]] || echo '*' >"$repo/.run/.gitignore" ;; esac
}

is_our_broker() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $data/server.properties"; }

# The broker of this data dir: the PID file's process if it still is that broker (PIDs
# get reused), else a java process running this dir's config (a start interrupted
# between launching the JVM and writing the PID file).
running_pid() {
    local pid
    if [[ -f "$pid_file" ]]; then
        pid="$(cat "$pid_file")"
        if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && is_our_broker "$pid"; then
            echo "$pid"
            return 0
        fi
    fi
    for pid in $(pgrep -x java); do
        if alive "$pid" && is_our_broker "$pid"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

java_tool() {  # java_tool MAIN-CLASS ARGS...: a short-lived JVM on the broker's classpath
    java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
        -Dlog4j2.configurationFile="$here/log4j2-tools.xml" \
        -cp "$libs/*" "$@"
}

cluster_id() {
    local meta="$data/kraft/meta.properties"
    if [[ -f "$meta" ]]; then
        sed -n 's/^cluster\.id=//p' "$meta"
    else
        # Kafka's Uuid text form: 16 random bytes, URL-safe base64, no padding; like
        # Kafka's Uuid.randomUuid, never one starting with "-", which the storage tool
        # would read as an option (1 start in 64 failed with "expected one argument").
        python3 -c 'import base64, os
while (u := base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")).startswith("-"): pass
print(u)'
    fi
}

fail_start() {
    log "error: $1"
    local f
    for f in "$data/logs/server.log" "$data/logs/stdout.log"; do
        if [[ -s "$f" ]]; then
            log "---- last lines of $f ----"
            tail -n 40 "$f" >&2
        fi
    done
    local pid
    if pid="$(running_pid)"; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file" "$addr_file"
    exit 1
}

# Ready means an admin call succeeds (a listening socket is not enough, though the
# broker opens its listener only once it is registered and unfenced). The admin probe
# starts when the port accepts, so its JVM does not compete with the broker's startup.
wait_ready() {
    local pid="$1" deadline=$((SECONDS + ready_timeout)) probe rc
    while ! (exec 3<>"/dev/tcp/127.0.0.1/$probe_port") 2>/dev/null; do
        alive "$pid" || fail_start "the broker exited during startup"
        ((SECONDS < deadline)) || fail_start "the broker was not listening after ${ready_timeout}s"
        sleep 0.1
    done
    printf 'default.api.timeout.ms=%s\nrequest.timeout.ms=3000\nretry.backoff.ms=100\nretry.backoff.max.ms=500\nreconnect.backoff.max.ms=500\n' \
        "$((ready_timeout * 1000))" >"$data/probe.properties"
    while :; do
        java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$probe_port" \
            --command-config "$data/probe.properties" --list >/dev/null 2>>"$data/logs/probe.log" &
        probe=$!
        while alive "$probe"; do
            if ! alive "$pid"; then
                kill "$probe" 2>/dev/null || true
                wait "$probe" 2>/dev/null || true
                fail_start "the broker exited during startup"
            fi
            if ((SECONDS >= deadline)); then
                kill "$probe" 2>/dev/null || true
                wait "$probe" 2>/dev/null || true
                fail_start "the broker was not ready after ${ready_timeout}s"
            fi
            sleep 0.1
        done
        rc=0
        wait "$probe" || rc=$?
        ((rc == 0)) && return 0
        ((SECONDS < deadline)) || fail_start "the broker was not ready after ${ready_timeout}s (admin probe: $data/logs/probe.log)"
        sleep 0.5
    done
}

up() {
    parse_args "$@"
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) with data in $data"
        cat "$addr_file" 2>/dev/null || log "its address file $addr_file is missing: stop it with 'down' and start again"
        return 0
    fi
    command -v java >/dev/null || die "java not found: the broker needs JDK 17+"
    fetch
    prepare_data

    if ((port == 0)); then
        port="$(free_port)"
    elif port_in_use "$port"; then
        die "port $port on 127.0.0.1 is already in use (another broker? try 'make kafka-down' or KAFKA_PORT=...)"
    fi
    local controller_port
    controller_port="$(free_port)"
    while ((controller_port == port)); do controller_port="$(free_port)"; done

    mkdir -p "$data/logs" "$data/kraft"
    sed -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$controller_port#g" -e "s#@DATA@#$data#g" \
        "$here/server.properties.in" >"$data/server.properties"
    probe_port="$port"
    local format_extra=()
    if ((secure)); then
        local ssl_port plain_port fresh=0
        [[ -f "$data/kraft/meta.properties" ]] || fresh=1
        ((fresh)) || [[ -f "$secure_dir/ca.pem" ]] || die "--secure on $data, which was formatted without it: use a fresh --data"
        ((fresh)) && make_secrets
        ssl_port="$(free_port)"
        plain_port="$(free_port)"
        while ((ssl_port == port || ssl_port == controller_port)); do ssl_port="$(free_port)"; done
        while ((plain_port == port || plain_port == controller_port || plain_port == ssl_port)); do plain_port="$(free_port)"; done
        sed -e "s#@PORT@#$port#g" -e "s#@SSL_PORT@#$ssl_port#g" -e "s#@PLAIN_PORT@#$plain_port#g" \
            -e "s#@CONTROLLER_PORT@#$controller_port#g" -e "s#@SECURE@#$secure_dir#g" \
            -e "s#@KEYSTORE_PASSWORD@#$(cat "$secure_dir/keystore.password")#g" \
            "$here/server-secure.properties.in" >>"$data/server.properties"
        chmod 600 "$data/server.properties"
        printf 'SASL_SSL=127.0.0.1:%s\nSSL=127.0.0.1:%s\nPLAINTEXT=127.0.0.1:%s\n' "$port" "$ssl_port" "$plain_port" \
            >"$secure_dir/listeners"
        probe_port="$plain_port"
        ((fresh)) && mapfile -t format_extra < <(scram_flags)
    fi

    local started=$SECONDS id
    id="$(cluster_id)"
    # The SCRAM passwords reach the storage tool in its argv (it has no other way) for the
    # moment it runs; they are made for this data dir only.
    java_tool kafka.tools.StorageTool format --cluster-id "$id" \
        --config "$data/server.properties" --ignore-formatted "${format_extra[@]}" >>"$data/logs/format.log" 2>&1 \
        || { log "---- $data/logs/format.log ----"; tail -n 40 "$data/logs/format.log" >&2; die "formatting $data/kraft failed"; }

    # setsid: the broker outlives this script and ignores the terminal's Ctrl-C.
    # shellcheck disable=SC2086  # heap_opts is a list of JVM flags
    setsid java -server $heap_opts \
        -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
        -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Xshare:auto \
        -Djava.awt.headless=true \
        -Dkafka.logs.dir="$data/logs" \
        -Dlog4j2.configurationFile="${KAFKA_LOG4J2_CONFIG:-$here/log4j2.xml}" \
        -cp "$libs/*" kafka.Kafka "$data/server.properties" \
        >>"$data/logs/stdout.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pid_file"
    echo "127.0.0.1:$port" >"$addr_file"

    wait_ready "$pid"
    ((secure)) && log "secure listeners and credentials: $secure_dir (see its README)"
    log "Kafka $kafka_version ready on 127.0.0.1:$port in $((SECONDS - started))s (pid $pid, data $data)"
    echo "127.0.0.1:$port"
}

down() {
    parse_args "$@"
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$pid_file"
        log "not running (data $data)"
        return 0
    fi
    if ((hard_kill)); then
        kill -KILL "$pid" 2>/dev/null || true
    else
        kill -TERM "$pid" 2>/dev/null || true
    fi
    local deadline=$((SECONDS + 30))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            log "no clean shutdown after 30s: killing pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
        fi
        sleep 0.1
    done
    rm -f "$pid_file"
    log "stopped (pid $pid)"
}

status() {
    parse_args "$@"
    local pid
    pid="$(running_pid)" || { log "not running (data $data)"; return 1; }
    log "running (pid $pid, data $data)"
    cat "$addr_file"
}

cmd="${1:-}"
shift || true
case "$cmd" in
    fetch) fetch ;;
    up) up "$@" ;;
    down) down "$@" ;;
    status) status "$@" ;;
    *) sed -n '2,23s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
