#!/usr/bin/env bash
# The fuzz targets (libFuzzer through cargo-fuzz, nightly). See README.md here.
#
#   fuzz/run.sh install              nightly and cargo-fuzz, when missing
#   fuzz/run.sh seeds                (re)write the seed inputs into fuzz/corpus/<target>/
#   fuzz/run.sh run TARGET [SECS] [RUNS]
#                                    fuzz one target until SECS seconds (default 60) or RUNS
#                                    executions (default unlimited), growing its corpus; the
#                                    log goes to fuzz/logs/TARGET.log
#   fuzz/run.sh all [SECS]           each target in turn, SECS each (default 60)
#   fuzz/run.sh cmin [TARGET...]     minimise the corpora (all by default) to what adds coverage
#   fuzz/run.sh smoke                the stable replay of corpora and reproducers (the test
#                                    suite's `cargo test -p triage-fuzz`)
#   fuzz/run.sh list                 the targets
#
# Targets are built without a sanitizer (-s none): their code is safe Rust, where AddressSanitizer
# finds nothing that a panic would not, at a tenth of the speed. Debug assertions and overflow
# checks stay on (cargo-fuzz's default), so an arithmetic overflow is a crash.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
export PATH="$HOME/.cargo/bin:$PATH"
TARGETS=(wire http_entry kafka_classify amqp_classify config)
FUZZ=(cargo +nightly fuzz)
BUILD=(-s none)

install() {
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
}

run_one() {
    local target="$1" secs="${2:-60}" runs="${3:--1}"
    mkdir -p "fuzz/corpus/$target" fuzz/logs
    echo "fuzzing $target for ${secs}s or $runs runs (log: fuzz/logs/$target.log)"
    "${FUZZ[@]}" run "${BUILD[@]}" "$target" "fuzz/corpus/$target" -- \
        -max_total_time="$secs" -runs="$runs" -print_final_stats=1 \
        >"fuzz/logs/$target.log" 2>&1 || {
        echo "$target: crashed or failed; see fuzz/logs/$target.log and fuzz/artifacts/$target/" >&2
        return 1
    }
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' \
        "fuzz/logs/$target.log" || true
    echo "corpus: $(find "fuzz/corpus/$target" -type f | wc -l) inputs"
}

case "${1:-}" in
    install) install ;;
    seeds)
        cargo run -q -p triage-fuzz --example seeds -- fuzz/corpus ;;
    run)
        install
        run_one "${2:?target}" "${3:-60}" "${4:--1}" ;;
    all)
        install
        for t in "${TARGETS[@]}"; do run_one "$t" "${2:-60}"; done ;;
    cmin)
        install
        shift
        for t in "${@:-${TARGETS[@]}}"; do
            # Set-cover merging keeps the fewest inputs that together reach every feature
            # (plain -merge=1 keeps each input that adds one, in size order: about twice as
            # many for http_entry), so the committed corpora stay small for the replay.
            "${FUZZ[@]}" cmin "${BUILD[@]}" "$t" "fuzz/corpus/$t" -- -set_cover_merge=1
        done ;;
    smoke)
        cargo test -p triage-fuzz ;;
    list)
        printf '%s\n' "${TARGETS[@]}" ;;
    *)
        sed -n '2,16p' "$0"
        exit 2 ;;
esac
