#!/usr/bin/env bash
# `make run`: the local demo stack. For now only the broker; the worker, the API and
# the demo agent are wired in here as they land (README: `make run` starts them all).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

broker="$(deploy/kafka/kafka.sh up --port "${KAFKA_PORT:-9092}" --data .run/kafka)"
echo "Kafka broker: $broker (stop it with 'make kafka-down')"
echo "The worker, API and demo agent are not wired into 'make run' yet."
