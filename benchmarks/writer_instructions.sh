#!/usr/bin/env bash
# Instructions per event of each process of the write path (benchmarks/worker_profile.py:
# the worker's pipeline into SQLite, its step and deep writer processes), counted by
# callgrind on every process: a run over the corpus minus a run over its first event, so
# imports, start-up and the schema cancel out. A count, not a time (see
# pipeline_instructions.sh): two trees compared on a busy machine give a quiet one's figures.
#
#   benchmarks/writer_instructions.sh SERVICES_DIR CORPUS_FILE
#   (a corpus: .venv/bin/python -m benchmarks.pipeline_cost write /tmp/th.bin thinking-heavy 20000)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services=$(cd "$1" && pwd) corpus=$2
py="$repo/.venv/bin/python"
command -v valgrind >/dev/null || { echo "writer_instructions.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
events=$("$py" -c "import msgspec,sys; print(len(msgspec.msgpack.decode(open(sys.argv[1],'rb').read())))" "$corpus")
"$py" -c "import msgspec,sys; b=msgspec.msgpack.decode(open(sys.argv[1],'rb').read()); open(sys.argv[2],'wb').write(msgspec.msgpack.encode(b[:1]))" "$corpus" "$work/one.bin"
count() {  # prints "main N", "steps N", "deep N" for a run over $1
    mkdir -p "$work/$2"
    (cd "$repo" && PYTHONPATH="$services:$repo" valgrind --tool=callgrind --trace-children=yes \
        --callgrind-out-file="$work/$2/cg.%p" "$py" -m benchmarks.worker_profile "$1" >/dev/null 2>&1)
    for f in "$work/$2"/cg.*; do
        cmd=$(sed -n 's/^cmd: //p' "$f")
        total=$(sed -n 's/^totals: \([0-9]*\).*/\1/p' "$f")
        case "$cmd" in
            *sqlite_writer*steps*) echo "steps $total" ;;
            *sqlite_writer*deep*) echo "deep $total" ;;
            *worker_profile*) echo "main $total" ;;
        esac
    done
}
count "$corpus" all >"$work/all.txt"
count "$work/one.bin" one >"$work/one.txt"
for part in main steps deep; do
    a=$(awk -v p=$part '$1 == p {s += $2} END {printf "%.0f\n", s}' "$work/all.txt")
    o=$(awk -v p=$part '$1 == p {s += $2} END {printf "%.0f\n", s}' "$work/one.txt")
    echo "$services $(basename "$corpus") $part: $(( (a - o) / events )) instructions/event ($events events)"
done
