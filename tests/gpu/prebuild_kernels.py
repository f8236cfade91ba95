"""Fill the kernel store (ops/common/kernel_cache.py) in parallel processes before a test run; needs no GPU.

    PADDLE_DSA_KERNEL_CACHE=/tmp/pdsa_kernels python tests/gpu/prebuild_kernels.py [--jobs N] MANIFEST... | --all

A test process compiles its kernel variants one after another (seconds each, on one core); the store lets every
later process load them instead, and this script compiles a list of them on all cores first. The list: manifest
lines (``{"module", "function", "args"}``, written by the store for each entry, e.g. the manifest a previous device
call left in $OUT, tests/gpu/kernel_manifest.jsonl), or ``--all``: every variant each seam can choose (default
knobs). A variant a test compiles with other knobs (class attributes it sets) traces to another key and is compiled
by the test itself. Prints one summary line: variants, compiled here, found in the store, failed, seconds.
"""
import argparse
import importlib
import json
import multiprocessing
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# seam module -> its compile function and variant enumeration (--all)
SEAMS = [("ops.flash_attention.fwd", "compile_variant", "all_variant_keys"),
         ("ops.flash_attention.bwd", "compile_variant", "all_variant_args"),
         ("ops.dsa.indexer.fwd", "compile_variant", "all_variant_keys"),
         ("ops.dsa.indexer.sparse", "compile_variant", "all_variant_keys"),
         ("ops.dsa.indexer.sparse_bwd", "compile_variant", "all_variant_keys"),
         ("ops.dsa.indexer.dense_bwd", "compile_variant", "all_variant_keys"),
         ("ops.dsa.attn_score.dense", "compile_variant", "all_variant_keys"),
         ("ops.dsa.attn_score.sparse", "compile_variant", "all_variant_keys"),
         ("ops.dsa.sparse_attn.fwd", "compile_variant", "all_variant_keys"),
         ("ops.dsa.sparse_attn.bwd", "compile_variant", "all_variant_keys"),
         ("ops.dsa.topk.fwd", "compile_variant", "all_variant_keys"),
         ("ops.common.segment_sum_sm90", "compile_variant", "variant_keys"),
         ("ops.common.fill_sm90", "compile_fill", "RANKS")]
# enumerations whose items are one key argument (the others are argument tuples)
KEY_ARG = {"all_variant_keys", "RANKS"}


def all_variants():
    sys.path.insert(0, ROOT)
    out = []
    for module, function, listing in SEAMS:
        items = getattr(importlib.import_module(module), listing)
        for item in (items() if callable(items) else items):
            out.append((module, function, [item] if listing in KEY_ARG else list(item)))
    return out


def read_manifests(paths):
    out = []
    for p in paths:
        with open(p) as f:
            out += [(d["module"], d["function"], d["args"]) for d in map(json.loads, filter(str.strip, f))]
    return out


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def _unique(variants):
    seen, out = set(), []
    for m, f, a in variants:
        k = (m, f, json.dumps(a))
        if k not in seen:
            seen.add(k)
            out.append((m, f, a))
    return out


def _work(batch):
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.path.insert(0, ROOT)
    from ops.common import kernel_cache
    compiled0, hits0 = kernel_cache.STATS["compiled"], kernel_cache.STATS["hits"]   # a worker may take two batches
    failed = []
    for module, function, args in batch:
        try:
            getattr(importlib.import_module(module), function)(*[_tuples(a) for a in args])
        except Exception as e:  # noqa: BLE001  (reported; the test that needs it compiles it and fails there)
            failed.append(f"{module}.{function}{tuple(args)}: {type(e).__name__}: {e}")
    return kernel_cache.STATS["compiled"] - compiled0, kernel_cache.STATS["hits"] - hits0, failed


def check_store(directory):
    """One line: the store's entries and how many this host can load (an entry needs every CPU feature of its
    builder); the features it lacks, if any."""
    sys.path.insert(0, ROOT)
    from ops.common import kernel_cache
    names = [n for n in os.listdir(directory) if n.endswith(".o")] if os.path.isdir(directory) else []
    usable, missing = 0, set()
    for n in names:
        try:
            kernel_cache._read_entry(os.path.join(directory, n))
            usable += 1
        except kernel_cache.ForeignEntry as e:
            missing |= e.missing
        except Exception:  # noqa: BLE001  (unusable for another reason: counted as not usable)
            pass
    print(f"kernel store {directory}: {len(names)} entries, {usable} loadable here"
          + (f"; this CPU lacks: {' '.join(sorted(missing))}" if missing else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifests", nargs="*")
    ap.add_argument("--all", action="store_true", help="every variant of every seam (default knobs)")
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--check", action="store_true", help="only say how many entries this host can load")
    a = ap.parse_args()
    if not os.environ.get("PADDLE_DSA_KERNEL_CACHE"):
        sys.exit("prebuild_kernels.py: set PADDLE_DSA_KERNEL_CACHE to the store's directory")
    if a.check:
        return check_store(os.environ["PADDLE_DSA_KERNEL_CACHE"])
    variants = _unique((all_variants() if a.all else []) + read_manifests(a.manifests))
    t0 = time.time()
    batches = [variants[i::a.jobs] for i in range(a.jobs)]           # interleaved: each seam spread over workers
    with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
        results = pool.map(_work, [b for b in batches if b])
    compiled, hits = sum(r[0] for r in results), sum(r[1] for r in results)
    failed = [f for r in results for f in r[2]]
    for f in failed:
        print("failed:", f)
    print(f"prebuild: {len(variants)} variants, {compiled} compiled, {hits} in the store, {len(failed)} failed, "
          f"{time.time() - t0:.0f} s, {a.jobs} processes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
