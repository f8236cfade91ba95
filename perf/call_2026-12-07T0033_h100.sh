#!/usr/bin/env bash
# session call 1 (2026-12-07): whole suite on the working tree (wip/topk-grouped-rank + portable store), the knob
# variants compiled alongside on the idle cores, the sanitizers, then the top-k knob trial and A/B while time is left;
# the store and logs to $OUT
set -u
cd "$(dirname "$0")/.."
source tests/gpu/device_env.sh
END=${END:-570}
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep 'Model name'; date -u
python3 tests/gpu/prebuild_kernels.py --check 2>&1 | grep -v Warn | tail -2
KN=BUCKETS_PER_KEY=4,KEY_BUCKET_MAX=16; K="BUCKETS_PER_KEY=4 $KN"
( nice -n 5 python3 tests/gpu/prebuild_knob_variants.py --jobs 6 --topk-knobs $KN > $OUT/prek.txt 2>&1
  for i in 0 1 2 3 4 5; do nice -n 5 python3 bench/ab_topk.py --prebuild --lengths-rows --knobs $K --part $i/6 \
    > $OUT/abpre$i.txt 2>&1 & done; wait; echo "bg prebuild done at $SECONDS s" ) > $OUT/bg.txt 2>&1 &
RUN_JOBS=4 PYTEST_TIMEOUT=400 timeout $((END - 150)) bash tests/gpu/check_project.sh tests > $OUT/tests.log 2>&1
echo "tests done at $SECONDS s"; sed -n '/================ summary/,$p' $OUT/tests.log
grep -h -o "ForeignEntry[^;]*\|another CPU[^;]*" $OUT/*.log | sort | uniq -c | head -3
RUN_JOBS=3 SAN_TIMEOUT=200 timeout $((END - 30 - SECONDS)) bash tests/gpu/check_project.sh sanitize > $OUT/sanitize.log 2>&1
echo "sanitize done at $SECONDS s"; sed -n '/================ summary/,$p' $OUT/sanitize.log
cat $OUT/bg.txt; tail -1 $OUT/prek.txt; grep -h -c prebuilt $OUT/abpre*.txt | paste -sd' '
if [ $((END - SECONDS)) -gt 100 ]; then
  TOPK_KNOBS=$KN timeout $((END - 30 - SECONDS)) python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_dsa_topk.py \
    > $OUT/knobtests.log 2>&1
  echo "test_dsa_topk TOPK_KNOBS=$KN rc=$? $(tail -1 $OUT/knobtests.log) at $SECONDS s"
  for t in racecheck memcheck; do
    [ $((END - SECONDS)) -gt 60 ] || { echo "knob $t skipped"; continue; }
    TOPK_KNOBS=$KN timeout 90 compute-sanitizer --tool $t --error-exitcode 9 python3 tests/gpu/sanitize_dsa_topk.py \
      > $OUT/knob_$t.log 2>&1
    echo "sanitize_dsa_topk $t TOPK_KNOBS=$KN rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/knob_$t.log | tail -1)"
  done
fi
if [ $((END - SECONDS)) -gt 80 ]; then
  echo "== A/B at $SECONDS s"
  timeout $((END - 20 - SECONDS)) python3 bench/ab_topk.py --lengths-rows --knobs $K 2>&1 | grep -v Warn > $OUT/ab_topk.txt
  tail -18 $OUT/ab_topk.txt
fi
tar -cf - -C "$PADDLE_DSA_KERNEL_CACHE" . | xz -1 -T0 > $OUT/kernel_store.tar.xz
echo "store: $(ls $PADDLE_DSA_KERNEL_CACHE | grep -c '\.o$') entries, $(du -h $OUT/kernel_store.tar.xz | cut -f1)"
mkdir -p $OUT/z && mv $OUT/*.log $OUT/*.table $OUT/abpre*.txt $OUT/prek.txt $OUT/bg.txt $OUT/kernel_manifest.jsonl $OUT/z/ 2>/dev/null
tar -cJf $OUT/logs1.tar.xz -C $OUT z && rm -rf $OUT/z; ls -la $OUT; date -u
