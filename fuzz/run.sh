#!/usr/bin/env bash
# Build the trace-parser fuzzer with clang (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer) and run it.
#
#   fuzz/run.sh [SECONDS] [extra libFuzzer flags...]     (default 60 s; the issue-3 run used 600)
#
# Seeds: the shared traces under ../shared/traces (decompressed, the big ones cut to their first 64 KiB) and the
# small fixtures in fuzz/seeds/. Work files go to build-fuzz/ (corpus/, crashes in build-fuzz/artifacts/).
# Needs clang (apt-get install -y clang; installed on demand here as an optional dev tool).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs="${1:-60}"; shift || true
die() { echo "fuzz: error: $*" >&2; exit 1; }
[[ "$secs" =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number, got '$secs'"
if ! command -v clang++ >/dev/null; then
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq clang >/dev/null || die "could not install clang"
fi
out="$root/build-fuzz"
mkdir -p "$out/obj" "$out/corpus" "$out/artifacts" "$out/seeds"

# The readers need only the core and analysis layers; trace_writer* (the profiler's writer) is left out.
srcs=(fuzz/fuzz_trace_parse.cpp src/core/*.cpp)
for s in src/analysis/*.cpp; do case "$s" in *trace_writer*) ;; *) srcs+=("$s") ;; esac; done
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc)
objs=()
for s in "${srcs[@]}"; do
  o="$out/obj/$(echo "$s" | tr '/' '_').o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ include -nt "$o" ]; then
    echo "fuzz: compiling $s" >&2
    if [ "$s" = fuzz/fuzz_trace_parse.cpp ]; then
      nice clang++ "${flags[@]}" -c "$s" -o "$o"
    else
      nice clang++ "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$s" -o "$o"
    fi
  fi
  objs+=("$o")
done
nice clang++ "${flags[@]}" "${objs[@]}" -lfmt -lz -pthread -o "$out/fuzz_trace_parse"

# Seeds: real traces, decompressed and truncated (libFuzzer's -max_len keeps inputs small anyway).
traces="$root/../shared/traces"
if [ -d "$traces" ]; then
  find "$traces" -name '*.json.gz' | while read -r f; do
    n=$(basename "$(dirname "$f")")_$(basename "$f" .json.gz)
    [ -f "$out/seeds/$n.json" ] || { gzip -dc "$f" | head -c 65536 > "$out/seeds/$n.json" || true; }
  done
fi
cp fuzz/seeds/* "$out/seeds/" 2>/dev/null || true

echo "fuzz: running for $secs s: $out/fuzz_trace_parse -max_total_time=$secs -max_len=65536 ..." >&2
COC_FUZZ_TMP=${COC_FUZZ_TMP:-/dev/shm} ASAN_OPTIONS=detect_leaks=1 nice "$out/fuzz_trace_parse" \
  -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" "$@" "$out/corpus" "$out/seeds"
