#!/usr/bin/env bash
# Check up front that a fresh machine has what `make run` / `make test` need, and say
# what is missing in one message instead of failing halfway through a build.
#
#   deploy/require.sh run|test
set -euo pipefail

need=(python3 java mvn curl)
[[ "${1:-}" == test ]] && need+=(go openssl)  # openssl: the secure test broker's certificates

missing=()
for tool in "${need[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if command -v java >/dev/null 2>&1; then
    major="$(java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}')"
    [[ "$major" =~ ^[0-9]+$ && "$major" -ge 17 ]] || missing+=("java>=17 (found ${major:-unknown})")
fi
if ((${#missing[@]})); then
    {
        echo "stepstream: missing on this machine: ${missing[*]}"
        echo "  JDK 17+ and Maven fetch and run the Kafka broker (jars from Maven Central),"
        echo "  Go builds FerretDB, promtool and kustomize (from the Go module proxy), curl probes the servers."
        echo "  On Debian/Ubuntu: apt-get install openjdk-17-jdk-headless maven golang-go curl python3-venv openssl"
    } >&2
    exit 1
fi
