#!/usr/bin/env bash
# `make test`: pytest against a throwaway Kafka broker and FerretDB (deploy/with-servers.sh).
#
#   deploy/run-tests.sh [PYTEST ARGS...]    default: -m "not soak" over tests/
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[[ -x .venv/bin/pytest ]] || { echo "run-tests.sh: .venv is missing: run 'make test' (or 'make venv')" >&2; exit 1; }
deploy/require.sh test
# promtool and kustomize for tests/deploy, built once into the cache; a failed build stops here.
deploy/tools/tools.sh build
# -rsx names every skip and xfail; --durations lists the slowest tests, which shows the
# integration tests against the real servers ran (and what they cost).
exec deploy/with-servers.sh --secure -- .venv/bin/pytest -q -rsx --durations=20 -m "not soak" "$@"
