"""Racecheck / memcheck of small backward configs (simple non-deterministic, deterministic (both kernels), varlen,
and the pipelined "fast" kernel; GQA 2:1, causal; D 64, 96, 128).

Usage (on the GPU machine, repo root):
    compute-sanitizer --tool racecheck python tests/gpu/sanitize_bwd.py
    compute-sanitizer --tool memcheck  python tests/gpu/sanitize_bwd.py
    python tests/gpu/sanitize_bwd.py --all      # runs both tools on itself and fails on any reported error
FLASH_BWD_KNOBS (test_flash_bwd.py) applies here too.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once():
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    sys.path.insert(0, HERE)
    from test_flash_bwd import check
    check("sanitize dense", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=64, causal=True)
    check("sanitize det", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=64, causal=True, deterministic=True)
    check("sanitize varlen", H=2, Hkv=1, D=64, causal=True, cu_q=[0, 1, 70, 70], cu_k=[0, 3, 80, 90],
          Tq=75, Tk=96)
    # pipelined kernel (PADDLE_DSA_BWD_FAST=1): TMA ring, named barriers, smem dQ + bulk reduce-add
    check("sanitize fast dense", B=1, Sq=300, Sk=260, H=2, Hkv=1, D=128, causal=True, fast=True)
    check("sanitize fast dense D64", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=64, fast=True)
    check("sanitize fast2 dense", B=1, Sq=300, Sk=260, H=2, Hkv=1, D=128, causal=True, fast=2)
    # mode 2 at D 64: mode 1's kernel by default (the column-split one in the ordered form, or with
    # FLASH_BWD_KNOBS=DQ_COLS_DIMS=64:128)
    check("sanitize fast2 dense D64", B=1, Sq=300, Sk=260, H=2, Hkv=1, D=64, causal=True, fast=2)
    check("sanitize fast varlen", H=2, Hkv=1, D=64, causal=True, cu_q=[0, 1, 70, 70], cu_k=[0, 3, 80, 90],
          Tq=75, Tk=96, fast=True)
    # D = 96 (64-byte swizzled tiles): simple, deterministic and pipelined kernels
    check("sanitize D96", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=96, causal=True)
    check("sanitize det D96", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=96, causal=True, deterministic=True)
    check("sanitize fast D96", B=1, Sq=300, Sk=260, H=2, Hkv=1, D=96, causal=True, fast=True)
    # the deterministic mode's ordered kernel (turn counters, ordered bulk reduces): grids of 2-3 key blocks, so every
    # CTA is resident at once whatever order the tools run them in (a wait can not outlive its writer's CTA)
    check("sanitize ordered D128", B=1, Sq=300, Sk=260, H=2, Hkv=1, D=128, causal=True, deterministic=True,
          det="ordered")
    check("sanitize ordered D64 varlen", H=2, Hkv=1, D=64, cu_q=[0, 1, 70, 70], cu_k=[0, 3, 80, 90], Tq=75,
          Tk=96, deterministic=True, det="ordered")
    check("sanitize ordered D96 window", B=1, Sq=200, Sk=257, H=2, Hkv=2, D=96, window=(100, 7),
          deterministic=True, det="ordered")
    # the wide pairs' split form (dV, dK, dQ launches): dense (192, 128) and varlen (256, 256)
    check("sanitize wide 192/128", B=1, Sq=130, Sk=100, H=2, Hkv=1, D=192, Dv=128, causal=True)
    check("sanitize wide 256 varlen", H=2, Hkv=1, D=256, causal=True, cu_q=[0, 1, 70, 70], cu_k=[0, 3, 80, 90],
          Tq=75, Tk=96)
    torch.cuda.synchronize()
    print("sanitize_bwd: run ok")


def main():
    if "--all" in sys.argv:
        bad = 0
        for tool in ("racecheck", "memcheck"):
            cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable,
                   os.path.abspath(__file__)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            tail = (r.stdout + r.stderr)[-3000:]
            print(f"== {tool}: rc={r.returncode}\n{tail}")
            bad |= r.returncode != 0
        sys.exit(1 if bad else 0)
    run_once()


if __name__ == "__main__":
    main()
