#!/usr/bin/env bash
# Instructions per event of the fold-and-batch path (benchmarks/pipeline_cost.py), counted
# by callgrind: one round minus none, so imports and the corpus load cancel out. A count,
# not a time: two trees compared on a busy machine give the figures a quiet one would.
#
#   benchmarks/pipeline_instructions.sh SERVICES_DIR CORPUS_FILE
#   (a corpus: .venv/bin/python -m benchmarks.pipeline_cost write /tmp/th.bin thinking-heavy 20000)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services=$(cd "$1" && pwd) corpus=$2
py="$repo/.venv/bin/python"
command -v valgrind >/dev/null || { echo "pipeline_instructions.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
events=$("$py" -c "import msgspec,sys; print(len(msgspec.msgpack.decode(open(sys.argv[1],'rb').read())))" "$corpus")
count() {
    (cd "$repo" && PYTHONPATH="$services:$repo" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$py" -m benchmarks.pipeline_cost run "$corpus" "$1" 2>&1) | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
none=$(count 0) one=$(count 1)
echo "$services $(basename "$corpus"): $(( (one - none) / events )) instructions/event ($events events)"
