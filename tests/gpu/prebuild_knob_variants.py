"""Fill the kernel store with the knob variants the sparse score tests and A/B benches compile (no GPU needed).

    PADDLE_DSA_KERNEL_CACHE=/tmp/pdsa_kernels python tests/gpu/prebuild_knob_variants.py [--jobs N]
        [--topk-knobs SPEC ... [--only-topk-knobs]] [--flash-knobs SPEC ... [--only-flash-knobs]]
        [--fwd-knobs SPEC ...] [--fwd-test-knobs SPEC ...]

prebuild_kernels.py --all stores every variant of the default knobs; a test or bench that sets class knobs traces to
other keys, which a device call would otherwise compile one by one (test_dsa_sparse_scores.py's test_gather_hints:
~100 s on the device). Listed here: test_gather_hints' knob sets at its keys, bench/sparse_score_shapes.py's VARIANTS
at its key, bench/indexer_bwd_shapes.py's VARIANTS at its two rows' keys, and bench/ab_attn_score.py's knob sets
(--knobs SPEC ..., default the owed run's AB_KNOBS) at its keys, the sparse indexer backward at the dense one's
consumer count (test_dsa_indexer_dense_bwd.py compares the two bit for bit: every key with topk_length), and the
top-k's other orderings (test_dsa_topk.py's test_sort_paths), its streaming kernel's two passes alone (SAMPLE = 0:
test_sampled_and_two_pass_agree) and bench/topk_breakdown.py's --sweep and --stages variants.
Knob sets equal to a kernel's defaults are left to prebuild_kernels.py. Prints one line per variant and a summary.
"""
import argparse
import multiprocessing
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

SEAMS = {"indexer": ("ops.dsa.indexer.sparse", "ops.dsa.indexer.sparse_sm90", "SparseIndexerScoreSm90"),
         "attn": ("ops.dsa.attn_score.sparse", "ops.dsa.attn_score.sparse_sm90", "SparseAttnScoreSm90"),
         "idx_bwd": ("ops.dsa.indexer.sparse_bwd", "ops.dsa.indexer.sparse_bwd_sm90", "SparseIndexerBwdSm90"),
         "idx_dense_bwd": ("ops.dsa.indexer.dense_bwd", "ops.dsa.indexer.dense_bwd_sm90", "DenseIndexerBwdSm90"),
         "topk": ("ops.dsa.topk.fwd", "ops.dsa.topk.sort_sm90", "SelectionSort"),
         "topk_stream": ("ops.dsa.topk.fwd", "ops.dsa.topk.stream_sm90", "TopkStreamSm90"),
         "flash_bwd": ("ops.flash_attention.bwd", "ops.flash_attention.backward_fast_sm90", "FlashBwdSm90Fast"),
         "flash_fwd": ("ops.flash_attention.fwd", "ops.flash_attention.forward_sm90", "FlashFwdSm90")}
# test_gather_hints: (kind, key of its BSHD case with topk_length, key of its THD case)
GATHER_CASES = [("indexer", (128, 64, "float32", False, True), (128, 64, "float32", True, False)),
                ("attn", (576, 128, False, True), (576, 128, True, False)),
                ("attn", (512, 64, False, True), (512, 64, True, False))]
AB_KEYS = [(576, 128, False, False), (576, 64, False, False)]
SHAPES_KEY = (128, 64, "float32", False, False)
BWD_KEYS = {"idx_bwd": (128, 64, "float32", False, False, False),          # bench/indexer_bwd_shapes.py's rows
            "idx_dense_bwd": (128, 64, "float32", False, False, False)}


def gather_hint_knobs():
    """test_gather_hints' parametrization, read from the test file (one source of truth)."""
    import ast
    src = open(os.path.join(ROOT, "tests", "gpu", "test_dsa_sparse_scores.py")).read()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "test_gather_hints":
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and ast.literal_eval(dec.args[0]) == "knobs":
                    return [{kw.arg: ast.literal_eval(kw.value) for kw in d.keywords} for d in dec.args[1].elts]
    raise RuntimeError("test_gather_hints' knobs not found")


def shape_variants():
    src = open(os.path.join(ROOT, "bench", "sparse_score_shapes.py")).read()
    i, j = src.index("VARIANTS = "), src.index("HINTS = ")
    return eval(src[i + len("VARIANTS = "):j])          # noqa: S307 (the bench's own literal)


def bwd_shape_variants():
    src = open(os.path.join(ROOT, "bench", "indexer_bwd_shapes.py")).read()
    i, j = src.index("VARIANTS = "), src.index("\nDEV = ")
    return eval(src[i + len("VARIANTS = "):j])          # noqa: S307 (the bench's own literal)


def dense_twin_jobs():
    from ops.dsa.indexer import sparse_bwd
    from ops.dsa.indexer.dense_bwd_sm90 import DenseIndexerBwdSm90
    knobs = {"CONSUMERS": DenseIndexerBwdSm90.CONSUMERS}
    return [("idx_bwd", key, knobs) for key in sparse_bwd.all_variant_keys() if key[4]]


def topk_sort_jobs():
    """test_dsa_topk.py's test_sort_paths: the orderings other than the default at P >= 512, both kernels (rank 2, no
    lengths); below P 512 every ordering but the default compiles to the same kernel."""
    from ops.dsa.topk import fwd
    return [("topk", fwd.variant_key(p, False, False, stream), {"SORT": sort}) for sort in ("key", "regs", "smem")
            for p in (512, 1024, 2048) for stream in (False, True)] + \
        [("topk_stream", fwd.variant_key(p, False, False, True, col), {"SAMPLE": 0})   # the two passes alone
         for p in (64, 2048) for col in (False, True)]


def topk_bench_jobs():
    """bench/topk_breakdown.py --sweep (launch shapes at its rows' keys) and --stages (the stopped launches), each
    also with --causal-lengths (the keys with lengths)."""
    from ops.dsa.topk import fwd
    keys = [fwd.variant_key(p, hl, False, True) for p in (2048, 64) for hl in (False, True)]
    jobs = [("topk_stream", key, {"U": u, "MIN_BLOCKS": mb}) for u, mb in ((4, 2), (2, 2), (1, 3), (1, 4))
            for key in keys]
    return jobs + [("topk_stream", fwd.variant_key(2048, hl, False, True, col), {"STOP": stop})
                   for stop in ("A", "threshold", "selection") for col in (False, True) for hl in (False, True)]


def topk_knob_jobs(spec):
    """test_dsa_topk.py / sanitize_dsa_topk.py with TOPK_KNOBS=spec: every streaming-kernel key with those knobs."""
    from ops.common.switches import knob_specs
    from ops.dsa.topk import fwd
    kn = knob_specs(spec)
    return [("topk_stream", key, kn) for key in fwd.all_variant_keys() if key[3]]


def flash_knob_jobs(spec):
    """tests/gpu/owed_run.sh's flash_trial with FlashBwdSm90Fast knobs spec: the pipelined backward's mode-2 and
    ordered variants of D 64 / 96 / 128, both dtypes, dense and varlen (what bench/ab_flash_bwd.py, test_flash_bwd.py
    -k "fast2 or ordered" and sanitize_bwd.py compile). A key: (dtype, head_dim, varlen, deterministic, fast,
    ordered)."""
    from ops.common.switches import knob_specs
    kn = knob_specs(spec)
    return [("flash_bwd", (dt, d, vl, det, 2, det), kn) for dt in ("bfloat16", "float16") for vl in (False, True)
            for d in (64, 96, 128) for det in (False, True)]


def fwd_knob_jobs(spec, every):
    """owed_run.sh's fwd_ab with FlashFwdSm90 knobs spec: bench/ab_flash_fwd.py's keys (bf16, D 128 / 96 / 64 and the
    wide pairs 192 / 128, 192, 256, dense, causal and not); every: all forward keys (test_flash_fwd.py under
    FWD_TEST_KNOBS)."""
    from ops.common.switches import knob_specs
    from ops.flash_attention import fwd
    pairs = [(128, 128), (96, 96), (64, 64), (192, 128), (192, 192), (256, 256)]
    keys = fwd.all_variant_keys() if every else [fwd.variant_key("bfloat16", d, b, False, v_head_dim=dv)
                                                 for d, dv in pairs for b in (False, True)]
    return [("flash_fwd", key, knob_specs(spec)) for key in keys]


def one(job):
    kind, key, knobs = job
    import importlib
    seam_name, kmod_name, cls_name = SEAMS[kind]
    seam = importlib.import_module(seam_name)
    cls = getattr(importlib.import_module(kmod_name), cls_name)
    if kind == "flash_fwd":                                  # FlashFwdSm90 knobs and BM64 (fwd.set_trial_knobs)
        seam.set_trial_knobs(knobs)
    else:
        if all(getattr(cls, n) == v for n, v in knobs.items()):
            return job, "default"
        for n, v in knobs.items():
            setattr(cls, n, v)
    seam._CACHE.clear()
    t = time.time()
    try:
        if kind == "flash_bwd":
            seam.compile_variant(*key[:4], fast=key[4], ordered=key[5])
        else:
            seam.compile_variant(key)
    except Exception as e:  # noqa: BLE001
        return job, f"failed: {type(e).__name__}: {str(e)[:160]}"
    return job, f"{time.time() - t:.1f} s"


def main(a):
    from ops.common.switches import knob_specs
    jobs = [job for sp in a.topk_knobs for job in topk_knob_jobs(sp)]
    jobs += [job for sp in a.flash_knobs for job in flash_knob_jobs(sp)]
    jobs += [job for sp in a.fwd_knobs for job in fwd_knob_jobs(sp, False)]
    jobs += [job for sp in a.fwd_test_knobs for job in fwd_knob_jobs(sp, True)]
    if not (a.only_topk_knobs or a.only_flash_knobs):
        jobs += [(kind, key, kn) for kn in gather_hint_knobs() for kind, k1, k2 in GATHER_CASES for key in (k1, k2)]
        jobs += [("indexer", SHAPES_KEY, v) for v in shape_variants()]
        jobs += [(kind, key, v) for v in bwd_shape_variants() for kind, key in BWD_KEYS.items()]
        jobs += dense_twin_jobs()
        jobs += topk_sort_jobs() + topk_bench_jobs()
        specs = a.knobs if a.knobs is not None else ["LAG=0", "LAG=3"]
        for sp in specs:
            kn = knob_specs(sp)
            jobs += [("attn", key, kn) for key in AB_KEYS]
    t0, failed = time.time(), 0
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(a.jobs, maxtasksperchild=1) as pool:     # one variant a process: knobs are class state
        for (kind, key, kn), res in pool.imap_unordered(one, jobs):
            failed += res.startswith("failed")
            print(f"{kind:8s} {str(key):36s} {kn}: {res}", flush=True)
    print(f"prebuild_knob_variants: {len(jobs)} jobs, {failed} failed, {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--knobs", nargs="*", default=None, help="bench/ab_attn_score.py knob specs NAME=INT[,NAME=INT]")
    p.add_argument("--topk-knobs", nargs="*", default=[], help="TOPK_KNOBS specs (NAME=VALUE,...): every streaming "
                   "top-k key with those TopkStreamSm90 knobs, what test_dsa_topk and sanitize_dsa_topk compile")
    p.add_argument("--only-topk-knobs", action="store_true", help="only the --topk-knobs (and --flash-knobs) variants")
    p.add_argument("--flash-knobs", nargs="*", default=[], help="FLASH_BWD_KNOBS specs (NAME=VALUE,...): the flash "
                   "backward's mode-2 and ordered keys with those FlashBwdSm90Fast knobs (owed_run.sh's flash_trial)")
    p.add_argument("--fwd-knobs", nargs="*", default=[], help="forward knob specs (fwd.set_trial_knobs: FlashFwdSm90 "
                   "knobs, BM64): bench/ab_flash_fwd.py's keys with those knobs (owed_run.sh's fwd_ab)")
    p.add_argument("--fwd-test-knobs", nargs="*", default=[], help="FLASH_FWD_KNOBS specs: every forward key with "
                   "those knobs (test_flash_fwd.py under owed_run.sh's FWD_TEST_KNOBS)")
    p.add_argument("--only-flash-knobs", action="store_true", help="only the --flash-knobs (and --topk-knobs, "
                   "--fwd-knobs, --fwd-test-knobs) variants")
    sys.exit(main(p.parse_args()))
