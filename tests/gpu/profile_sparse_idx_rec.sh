#!/usr/bin/env bash
# ncu of the sparse indexer score recompute (ours, ops/dsa/indexer/sparse_sm90.py) and of cuDNN frontend's
# sparse_indexer_score_recompute_wrapper, one launch each at the bench row's shape (bench/sparse_score_shapes.py --ncu:
# Sq 4K, Sk 8K, top-k 2048, 64 heads, Di 128), on the device:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/profile_sparse_idx_rec.sh
# Writes $OUT/sparse_idx_rec_ncu.txt and $OUT/sparse_idx_rec_sass.csv (tests/gpu/profile_pair.sh).
exec bash "$(dirname "$0")/profile_pair.sh" sparse_idx_rec SparseIndexer python3 bench/sparse_score_shapes.py --ncu
