#!/usr/bin/env bash
# FerretDB 1.x (MongoDB wire protocol over PostgreSQL or SQLite), built from the Go
# module proxy. It stands in for MongoDB in the mongodb sink's tests and benchmarks; no
# MongoDB server is in reach.
#
#   ferretdb.sh build                         binary into the cache (skipped when cached)
#   ferretdb.sh up   [--port P] [--data DIR] [--backend postgresql|sqlite]
#                                             start in the background, wait until a
#                                             `ping` succeeds, print mongodb://127.0.0.1:P/
#   ferretdb.sh down [--data DIR]             stop the server of DIR (and its PostgreSQL)
#   ferretdb.sh status [--data DIR]           print the URL if running, else exit 1
#
# --port 0 picks a free port; DIR defaults to <repo>/.run/ferretdb. The backend defaults
# to postgresql (FerretDB's production one): postgres.sh installs Debian's package when
# missing and runs a throwaway cluster in DIR/pg. Only the URL goes to stdout.
# Environment: STEPSTREAM_CACHE (default ~/.cache/stepstream), FERRETDB_BACKEND (the
# default backend), FERRETDB_READY_TIMEOUT (seconds, default 30); Go's GOMODCACHE/GOCACHE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

ferretdb_version="v1.24.0"
cache="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}"
ferretdb_home="$cache/ferretdb-$ferretdb_version"
bin="$ferretdb_home/bin/ferretdb"
ready_timeout="${FERRETDB_READY_TIMEOUT:-30}"

log() { printf 'ferretdb.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

alive() {  # a dead child of this shell lingers as a zombie, which kill -0 accepts
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$state" && "$state" != Z ]]
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_in_use() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
PY
}

# `go install ...@v1.24.0` builds, but the binary panics at start: the module zip lacks
# the generated build/version/version.txt ("Please run `bin/task gen-version`"). So:
# download the module, write that file as FerretDB's docs say, and build the copy.
build() {
    if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -qx "version: $ferretdb_version"; then
        return 0
    fi
    command -v go >/dev/null || die "go not found: Go is needed once to build FerretDB"
    mkdir -p "$ferretdb_home"
    exec 9>"$ferretdb_home/.lock"
    flock 9
    if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -qx "version: $ferretdb_version"; then
        exec 9>&-
        return 0
    fi
    log "building FerretDB $ferretdb_version from the Go module proxy into $bin (about a minute, once)"
    local started=$SECONDS json dir src="$ferretdb_home/src"
    json="$(cd "$ferretdb_home" && go mod download -json "github.com/FerretDB/FerretDB@$ferretdb_version")" \
        || die "go mod download github.com/FerretDB/FerretDB@$ferretdb_version failed: $json"
    dir="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["Dir"])' "$json")"
    rm -rf "$src"
    cp -R "$dir" "$src"
    chmod -R u+w "$src"   # the module cache is read-only
    echo "$ferretdb_version" >"$src/build/version/version.txt"
    echo "stepstream-source-build" >"$src/build/version/package.txt"
    mkdir -p "$(dirname "$bin")"
    (cd "$src" && GOFLAGS=-buildvcs=false go build -trimpath -o "$bin.partial" ./cmd/ferretdb) \
        || die "go build of FerretDB $ferretdb_version failed (output above)"
    mv "$bin.partial" "$bin"
    rm -rf "$src"
    exec 9>&-
    log "built FerretDB $ferretdb_version in $((SECONDS - started))s"
}

parse_args() {
    port=27017
    data="$repo/.run/ferretdb"
    backend="${FERRETDB_BACKEND:-postgresql}"
    while (($#)); do
        case "$1" in
            --port) port="${2:?--port needs a value}"; shift 2 ;;
            --port=*) port="${1#*=}"; shift ;;
            --data) data="${2:?--data needs a value}"; shift 2 ;;
            --data=*) data="${1#*=}"; shift ;;
            --backend) backend="${2:?--backend needs a value}"; shift 2 ;;
            --backend=*) backend="${1#*=}"; shift ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    [[ "$port" =~ ^[0-9]+$ ]] || die "--port must be a number, got: $port"
    [[ "$backend" == postgresql || "$backend" == sqlite ]] || die "--backend is postgresql or sqlite, got: $backend"
    data="$(realpath -m -- "$data")"
    pid_file="$data/ferretdb.pid"
    url_file="$data/url"
}

prepare_data() {
    mkdir -p "$data"
    # .run/ (the Makefile's data dirs) must not show up in `git status`.
    case "$data" in "$repo/.run"/*) [[ -e "$repo/.run/.gitignore" ]] || echo '*' >"$repo/.run/.gitignore" ;; esac
}

is_our_server() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "--state-dir=$data/state "; }

# The server of this data dir: the PID file's process if it still is that server (PIDs
# get reused), else a ferretdb process using this dir (a start interrupted between
# launching it and writing the PID file).
running_pid() {
    local pid
    if [[ -f "$pid_file" ]]; then
        pid="$(cat "$pid_file")"
        if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && is_our_server "$pid"; then
            echo "$pid"
            return 0
        fi
    fi
    for pid in $(pgrep -x ferretdb); do
        if alive "$pid" && is_our_server "$pid"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

fail_start() {
    log "error: $1"
    if [[ -s "$data/ferretdb.log" ]]; then
        log "---- last lines of $data/ferretdb.log ----"
        tail -n 40 "$data/ferretdb.log" >&2
    fi
    local pid
    if pid="$(running_pid)"; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$pid_file" "$url_file"
    "$here/postgres.sh" down --data "$data" || true
    exit 1
}

# Ready means a MongoDB `ping` command succeeds. Without pymongo at hand (before the
# venv exists) an OP_MSG ping is sent by hand: the wire format is small and stable.
ping_once() {
    python3 - "$port" <<'PY'
import socket, struct, sys
port = int(sys.argv[1])

def bson_doc(pairs):
    body = b""
    for key, value in pairs:
        k = key.encode() + b"\0"
        if isinstance(value, int):
            body += b"\x10" + k + struct.pack("<i", value)
        else:
            v = value.encode() + b"\0"
            body += b"\x02" + k + struct.pack("<i", len(v)) + v
    return struct.pack("<i", len(body) + 5) + body + b"\0"

section = b"\0" + bson_doc([("ping", 1), ("$db", "admin")])
msg = struct.pack("<I", 0) + section                    # OP_MSG flagBits + body section
header = struct.pack("<iiii", 16 + len(msg), 1, 0, 2013)  # length, requestID, responseTo, OP_MSG
try:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(header + msg)
        reply = b""
        while len(reply) < 4 or len(reply) < struct.unpack("<i", reply[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                sys.exit(1)
            reply += chunk
except OSError:
    sys.exit(1)
# An {ok: 1.0} reply carries the double 1.0 under key "ok".
sys.exit(0 if b"\x01ok\x00" + struct.pack("<d", 1.0) in reply else 1)
PY
}

up() {
    parse_args "$@"
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) with data in $data"
        cat "$url_file" 2>/dev/null || log "its address file $url_file is missing: stop it with 'down' and start again"
        return 0
    fi
    build
    prepare_data
    if ((port == 0)); then
        port="$(free_port)"
    elif port_in_use "$port"; then
        die "port $port on 127.0.0.1 is already in use (another server? try 'make mongo-down' or MONGO_PORT=...)"
    fi
    mkdir -p "$data/state"
    local started=$SECONDS handler
    if [[ "$backend" == postgresql ]]; then
        local pg_url
        pg_url="$("$here/postgres.sh" up --data "$data")" || die "PostgreSQL for FerretDB did not start (reason above)"
        # FerretDB 1.24 holds a pooled connection per update statement until its command
        # ends (handler/msg_update.go): its default pool of 50 deadlocks on 50 at once.
        handler=(--handler=postgresql --postgresql-url="$pg_url?pool_max_conns=250")
    else
        mkdir -p "$data/db"
        handler=(--handler=sqlite --sqlite-url="file:$data/db/")
    fi
    setsid "$bin" "${handler[@]}" \
        --listen-addr="127.0.0.1:$port" --state-dir="$data/state" \
        --debug-addr=- --telemetry=disable --log-level=warn \
        >>"$data/ferretdb.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pid_file"
    echo "mongodb://127.0.0.1:$port/" >"$url_file"
    local deadline=$((SECONDS + ready_timeout))
    until ping_once; do
        alive "$pid" || fail_start "FerretDB exited during startup"
        ((SECONDS < deadline)) || fail_start "FerretDB did not answer ping after ${ready_timeout}s"
        sleep 0.1
    done
    log "FerretDB $ferretdb_version ($backend) ready on 127.0.0.1:$port in $((SECONDS - started))s (pid $pid, data $data)"
    cat "$url_file"
}

down() {
    parse_args "$@"
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$pid_file"
        "$here/postgres.sh" down --data "$data"
        log "not running (data $data)"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            log "no clean shutdown after 15s: killing pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
        fi
        sleep 0.1
    done
    rm -f "$pid_file"
    "$here/postgres.sh" down --data "$data"   # after FerretDB: its pool goes first
    log "stopped (pid $pid)"
}

status() {
    parse_args "$@"
    local pid
    pid="$(running_pid)" || { log "not running (data $data)"; return 1; }
    log "running (pid $pid, data $data)"
    cat "$url_file"
}

cmd="${1:-}"
shift || true
case "$cmd" in
    build) build ;;
    up) up "$@" ;;
    down) down "$@" ;;
    status) status "$@" ;;
    *) sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
