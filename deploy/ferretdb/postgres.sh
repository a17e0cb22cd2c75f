#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for FerretDB's PostgreSQL backend (its production one).
#
#   postgres.sh install                 Debian's postgresql package, when no server is found
#                                       (apt-get, as root; flocked, quiet, idempotent)
#   postgres.sh up   --data DIR         initdb (once) and pg_ctl start on a free 127.0.0.1 port;
#                                       print postgres://stepstream@127.0.0.1:P/postgres
#   postgres.sh down --data DIR         pg_ctl stop (fast) and wait
#
# The cluster lives in DIR/pg (owned by the user that runs it: `postgres` when run as
# root, since PostgreSQL refuses to run as root; else the caller). When that user cannot
# reach DIR (a checkout under /root), the cluster goes to a temp dir that DIR/pg links
# to, removed by `down`. TCP on 127.0.0.1 only, no Unix socket, `trust` auth for the one
# local role (no password exists anywhere). Tuned for a test server: fsync, full page
# writes and synchronous commit are off (a crash loses the cluster, which is thrown away
# anyway); every table FerretDB creates gets a GIN index on its `_id` (see id_index).
# Only the URL goes to stdout. Environment: STEPSTREAM_CACHE (the lock file),
# POSTGRES_READY_TIMEOUT (seconds, default 30).
set -euo pipefail

cache="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}"
ready_timeout="${POSTGRES_READY_TIMEOUT:-30}"
role="stepstream"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

bindir() {  # the newest installed server's bin dir (Debian: /usr/lib/postgresql/<major>/bin)
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$found" && -x "$found/initdb" && -x "$found/pg_ctl" && -x "$found/postgres" ]] || return 1
    echo "$found"
}

install() {
    bindir >/dev/null && return 0
    ((EUID == 0)) || die "no PostgreSQL server found and not root: install Debian's 'postgresql' package"
    command -v apt-get >/dev/null || die "no PostgreSQL server found and no apt-get to install one"
    mkdir -p "$cache"
    exec 8>"$cache/.postgresql-install.lock"
    flock 8
    if ! bindir >/dev/null; then
        log "installing Debian's postgresql package (once; log in $cache/postgresql-install.log)"
        local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends)
        if ! "${apt[@]}" install postgresql >"$cache/postgresql-install.log" 2>&1; then
            # A fresh machine may not have package lists yet.
            { apt-get -qq update && "${apt[@]}" install postgresql; } >>"$cache/postgresql-install.log" 2>&1 \
                || { tail -n 20 "$cache/postgresql-install.log" >&2; die "apt-get install postgresql failed"; }
        fi
        bindir >/dev/null || die "postgresql installed but no server under /usr/lib/postgresql/*/bin"
    fi
    exec 8>&-
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

parse_args() {
    data=""
    while (($#)); do
        case "$1" in
            --data) data="${2:?--data needs a value}"; shift 2 ;;
            --data=*) data="${1#*=}"; shift ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    [[ -n "$data" ]] || die "--data DIR is required"
    data="$(realpath -m -- "$data")"
    cluster="$data/pg"
    if ((EUID == 0)); then
        user="postgres"
        id -u "$user" >/dev/null 2>&1 || die "user '$user' is missing (Debian's postgresql package creates it)"
        as_user=(runuser -u "$user" --)
    else
        user="$(id -un)"
        as_user=()
    fi
}

# The cluster's own dir: DIR/pg, or the temp dir it links to.
cluster_dir() { realpath -m -- "$cluster"; }

pg_ctl() { "${as_user[@]}" "$bin/pg_ctl" "$@"; }

# FerretDB 1.24 pushes an `{_id: v}` filter down as `_jsonb->$1 @> $2` (a containment,
# so that an array holding v matches too: internal/backends/postgresql/query.go), while
# the only index it creates on _id is a btree on `_jsonb->'_id'`, which serves `=` and
# never `@>`: every update and point read scans its table (PostgreSQL's EXPLAIN says Seq
# Scan; 40 ms an update at 20,000 documents). An event trigger gives each table FerretDB
# creates a GIN index (jsonb_path_ops) on `_jsonb->'_id'`, which serves `@>`; it only
# matches the query's `_jsonb->$1` once $1 is planned as the constant '_id', hence
# plan_cache_mode=force_custom_plan above (a generic plan of FerretDB's cached statement
# would scan again). FerretDB's own metadata does not list the index (listIndexes
# shows only its own); a dropped collection drops it with its table.
id_index() {
    "${as_user[@]}" "$bin/psql" -h 127.0.0.1 -p "$1" -U "$role" -d postgres -X -q -v ON_ERROR_STOP=1 \
        >>"$data/initdb.log" 2>&1 <<'SQL' || die "creating the _id index trigger failed (log: $data/initdb.log)"
CREATE OR REPLACE FUNCTION stepstream_id_index() RETURNS event_trigger LANGUAGE plpgsql AS $body$
DECLARE created record;
BEGIN
    FOR created IN SELECT objid, object_identity FROM pg_event_trigger_ddl_commands()
                   WHERE command_tag = 'CREATE TABLE' AND object_type = 'table' LOOP
        IF EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = created.objid AND attname = '_jsonb' AND NOT attisdropped) THEN
            EXECUTE format('CREATE INDEX ON %s USING gin ((_jsonb -> ''_id'') jsonb_path_ops)',
                           created.object_identity);
        END IF;
    END LOOP;
END
$body$;
DROP EVENT TRIGGER IF EXISTS stepstream_id_index;
CREATE EVENT TRIGGER stepstream_id_index ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
    EXECUTE FUNCTION stepstream_id_index();
SQL
}

up() {
    parse_args "$@"
    install
    bin="$(bindir)"
    mkdir -p "$data"
    local dir
    if [[ ! -e "$cluster" ]]; then
        if "${as_user[@]}" test -x "$data" 2>/dev/null; then
            mkdir -p "$cluster"
        else
            dir="$(mktemp -d "${TMPDIR:-/tmp}/stepstream-pg.XXXXXX")"
            ln -s "$dir" "$cluster"
            log "$data is out of reach of user $user: cluster in $dir"
        fi
        dir="$(cluster_dir)"
        chown "$user" "$dir" 2>/dev/null || true
        chmod 700 "$dir"
        "${as_user[@]}" "$bin/initdb" -D "$dir" -U "$role" --auth=trust --no-sync -E UTF8 --locale=C.UTF-8 \
            >"$data/initdb.log" 2>&1 || { tail -n 20 "$data/initdb.log" >&2; die "initdb failed"; }
    fi
    dir="$(cluster_dir)"
    if pg_ctl -D "$dir" status >/dev/null 2>&1; then
        cat "$data/postgres.url"
        return 0
    fi
    local port
    port="$(free_port)"
    # The log is the cluster's (the user may not write $data).
    pg_ctl -D "$dir" -l "$dir/server.log" -w -t "$ready_timeout" start -o "-p $port \
        -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c max_connections=300 \
        -c fsync=off -c full_page_writes=off -c synchronous_commit=off -c shared_buffers=128MB \
        -c plan_cache_mode=force_custom_plan" \
        >/dev/null || { tail -n 30 "$dir/server.log" >&2; die "PostgreSQL did not start"; }
    id_index "$port"
    echo "postgres://$role@127.0.0.1:$port/postgres" >"$data/postgres.url"
    log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') ready on 127.0.0.1:$port (data $dir)"
    cat "$data/postgres.url"
}

down() {
    parse_args "$@"
    [[ -e "$cluster" ]] || return 0
    local dir
    dir="$(cluster_dir)"
    bin="$(bindir)" || return 0
    if [[ -f "$dir/postmaster.pid" ]]; then
        pg_ctl -D "$dir" -w -t 20 stop -m fast >/dev/null 2>&1 \
            || pg_ctl -D "$dir" -w -t 10 stop -m immediate >/dev/null 2>&1 || true
    fi
    rm -f "$data/postgres.url"
    cp -f "$dir/server.log" "$data/postgres.log" 2>/dev/null || true
    if [[ -L "$cluster" ]]; then  # the temp dir of a cluster out of DIR's reach
        rm -rf -- "$dir"
        rm -f -- "$cluster"
    fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
    install) install ;;
    up) up "$@" ;;
    down) down "$@" ;;
    *) sed -n '2,18s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
