#!/usr/bin/env bash
# `make test`: pytest against a throwaway Kafka broker and FerretDB (deploy/with-servers.sh).
#
#   deploy/run-tests.sh [PYTEST ARGS...]    default: -m "not soak" over tests/
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[[ -x .venv/bin/pytest ]] || { echo "run-tests.sh: .venv is missing: run 'make test' (or 'make venv')" >&2; exit 1; }
exec deploy/with-servers.sh -- .venv/bin/pytest -q -rs -m "not soak" "$@"
