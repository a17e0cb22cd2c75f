#!/usr/bin/env bash
# The browser the viewer's tests drive (tests/browser): Debian's `chromium` package,
# installed with apt-get when missing, like the other servers the suite needs. Playwright
# for Python drives it through `executable_path`; nothing downloads a browser build.
#
#   chromium.sh ensure     install chromium if /usr/bin/chromium (or CHROMIUM) is missing
#   chromium.sh path       ensure, then print the browser's path (only that on stdout)
#
# Idempotent and flocked: two test runs that start together install it once. A machine
# where it cannot be installed (no root, no apt-get) fails here, loudly: the browser
# tests never skip.
set -euo pipefail

browser="${CHROMIUM:-/usr/bin/chromium}"
lock="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}/chromium.lock"

log() { printf 'chromium.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

works() { [[ -x "$browser" ]] && "$browser" --headless --no-sandbox --version >/dev/null 2>&1; }

ensure() {
    works && return 0
    command -v apt-get >/dev/null || die "$browser is missing and apt-get is not here: install Debian's chromium package"
    [[ "$(id -u)" == 0 ]] || die "$browser is missing: run 'apt-get install -y chromium' as root (the browser tests need it)"
    mkdir -p "$(dirname "$lock")"
    exec 9>"$lock"
    flock 9
    works && return 0  # another run installed it while this one waited
    log "installing Debian's chromium (once)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2
    works || die "chromium installed but $browser does not start"
}

case "${1:-}" in
    ensure) ensure ;;
    path) ensure; echo "$browser" ;;
    *) die "usage: chromium.sh ensure|path" ;;
esac
