#!/usr/bin/env bash
# The ops tools `make test` checks deploy/ with, built from the Go module proxy at pinned
# versions and cached outside the clone (like FerretDB):
#
#   promtool   github.com/prometheus/prometheus/cmd/promtool   (Prometheus 3.16.0)
#   kustomize  sigs.k8s.io/kustomize/kustomize/v5
#   builder    go.opentelemetry.io/collector/cmd/builder        (the Collector Builder, ocb)
#   otelcol    the OpenTelemetry Collector of deploy/otel/builder.yaml, built by builder
#              (OTLP receiver, batch processor, contrib kafkaexporter); its cache
#              directory is named after the manifest's hash, so editing it rebuilds
#
#   tools.sh build             build every tool that is not cached yet
#   tools.sh path TOOL         build TOOL if needed, print its path (only that on stdout)
#
# A failed build exits non-zero with Go's output: the checks never skip a missing tool.
# Environment: STEPSTREAM_CACHE (default ~/.cache/stepstream); Go's GOMODCACHE/GOCACHE apply.
set -euo pipefail

promtool_module="github.com/prometheus/prometheus/cmd/promtool"
promtool_version="v0.316.0"
kustomize_module="sigs.k8s.io/kustomize/kustomize/v5"
kustomize_version="v5.8.1"
builder_module="go.opentelemetry.io/collector/cmd/builder"
builder_version="v0.165.0"
otelcol_manifest="$(cd "$(dirname "${BASH_SOURCE[0]}")/../otel" && pwd)/builder.yaml"

cache="${STEPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stepstream}"

log() { printf 'tools.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

module_of() {
    case "$1" in
        promtool) echo "$promtool_module@$promtool_version" ;;
        kustomize) echo "$kustomize_module@$kustomize_version" ;;
        builder) echo "$builder_module@$builder_version" ;;
        otelcol) echo "deploy/otel/builder.yaml@$(sha256sum "$otelcol_manifest" | cut -c1-12)" ;;
        *) die "unknown tool: $1 (promtool, kustomize, builder, otelcol)" ;;
    esac
}

bin_of() {
    local module="$(module_of "$1")"
    echo "$cache/$1-${module##*@}/bin/$1"
}

works() {  # the cached binary runs
    [[ -x "$1" ]] && "$1" --help >/dev/null 2>&1
}

build_one() {
    local tool="$1" module bin home
    module="$(module_of "$tool")"
    bin="$(bin_of "$tool")"
    works "$bin" && return 0
    command -v go >/dev/null || die "go not found: Go is needed once to build $tool ($module)"
    home="$(dirname "$(dirname "$bin")")"
    mkdir -p "$home"
    exec 9>"$home/.lock"
    flock 9
    if ! works "$bin"; then
        log "building $tool from the Go module proxy ($module) into $bin (a few minutes, once)"
        local started=$SECONDS out="$home/build.log"
        if [[ "$tool" == otelcol ]]; then
            build_otelcol "$home" "$bin" "$out"
        else
            rm -rf "$home/gobin"
            if ! (cd "$home" && GOFLAGS=-buildvcs=false GOBIN="$home/gobin" GOTOOLCHAIN=local \
                    go install -trimpath "$module") >"$out" 2>&1; then
                tail -40 "$out" >&2
                die "go install $module failed (full log: $out)"
            fi
            mkdir -p "$(dirname "$bin")"
            mv "$home/gobin/$tool" "$bin"
            rm -rf "$home/gobin"
        fi
        works "$bin" || die "$bin was built but does not run"
        log "built $tool in $((SECONDS - started))s"
    fi
    exec 9>&-
}

build_otelcol() {  # HOME BIN LOG: the builder generates and compiles the manifest's collector
    local home="$1" bin="$2" out="$3" builder dist="$1/dist"
    builder="$(bin_of builder)"
    rm -rf "$dist"
    mkdir -p "$dist"
    # The manifest with output_path pointing into the cache (builder has no flag for it).
    sed "s|^dist:\$|dist:\\n  output_path: $dist|" "$otelcol_manifest" >"$home/builder.yaml"
    if ! (cd "$home" && GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
            "$builder" --config="$home/builder.yaml") >"$out" 2>&1; then
        tail -40 "$out" >&2
        die "the Collector Builder failed on deploy/otel/builder.yaml (full log: $out)"
    fi
    mkdir -p "$(dirname "$bin")"
    mv "$dist/otelcol-stepstream" "$bin"
    rm -rf "$dist"
}

case "${1:-}" in
    build)
        build_one promtool
        build_one kustomize
        build_one builder
        build_one otelcol
        ;;
    path)
        tool="${2:?usage: tools.sh path TOOL}"
        [[ "$tool" == otelcol ]] && build_one builder
        build_one "$tool"
        bin_of "$tool"
        ;;
    *)
        echo "usage: tools.sh build | path TOOL" >&2
        exit 2
        ;;
esac
