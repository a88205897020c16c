#!/usr/bin/env bash
# A run on a preprocessed corpus of more than 1 GB keeps each rank's resident memory below 500 MB (issue 21): the
# .bin is memory-mapped and a rank touches only the pages of the samples it draws.
#
#   bench/data_rss.sh [COC_BINARY] [WORK_DIR]
#
# Writes ~600 MB of text (the fortunes, repeated) into WORK_DIR (default: a temporary folder), preprocesses it with
# the ByteTokenizer into a ~1.2 GB uint16 .bin, trains 5 iterations on 2 ranks with /usr/bin/time around each rank,
# prints each rank's peak RSS and fails when one reaches 500 MB. Deletes what it wrote. Heavy: not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
COC=${1:-build/bin/coc}
WORK=${2:-$(mktemp -d /tmp/coc-data-rss.XXXXXX)}
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/text"
cat /usr/share/games/fortunes/{fortunes,computers,science,literature,people} >"$WORK/one.txt"
one=$(stat -c %s "$WORK/one.txt")
for f in $(seq -w 1 20); do  # 20 documents of ~30 MB
  for _ in $(seq $(( (30 << 20) / one ))); do cat "$WORK/one.txt"; done >"$WORK/text/doc$f.txt"
done
rm "$WORK/one.txt"
echo "text: $(du -sh "$WORK/text" | cut -f1)"
"$COC" preprocess --input "$WORK/text" --output-prefix "$WORK/corpus" --workers 2
rm -rf "$WORK/text"
ls -l "$WORK"/corpus_text_document.*
bin_bytes=$(stat -c %s "$WORK/corpus_text_document.bin")
[ "$bin_bytes" -ge 1000000000 ] || { echo "the corpus is only $bin_bytes bytes"; exit 1; }
scripts/launch -n 2 -- /usr/bin/time -f "peak RSS %M KB" "$COC" train --data-path "$WORK/corpus_text_document" \
  --split 90,10,0 --eval-interval 5 --eval-iters 1 --train-iters 5 --sample-length 0 --no-progress 2>&1 |
  tee "$WORK/train.log" | grep -E "iteration|validation|peak RSS"
worst=$(grep -o "peak RSS [0-9]*" "$WORK/train.log" | awk '{print $3}' | sort -n | tail -1)
echo "worst rank: $((worst / 1024)) MB (limit 500 MB) on a $((bin_bytes >> 20)) MiB corpus"
[ "$worst" -lt $((500 * 1024)) ]
