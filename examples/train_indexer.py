"""Train a small DSA lightning indexer with indexer_kl_loss on CPU (a few seconds).

A frozen "main" MLA-style attention (query [B, S, H, Dqk], one latent kv row per token) defines the
target: for each query row, the head-summed causal attention distribution over keys. A lightning
indexer (index_q, index_k, weights: linear maps of the same hidden states) learns to match it:

1. dense warm-up: indexer_kl_loss over all causally visible keys;
2. sparse stage: the indexer's own top-k keys (indexer_score -> indexer_topk) select the set, and the
   loss is taken over that set only (the main attention's softmax_lse is the sparse one).

It prints the loss falling and the recall of the attention's top-k keys by the indexer's top-k.
Run:  python examples/train_indexer.py  [--steps 60] [--seed 0]
"""
import argparse
import math
import time

import numpy as np
import paddle

import paddle_dsa as dsa


def causal_topk_all(b, s):
    """int32 [b, s, s]: row i lists keys 0..i, then -1 (dense causal attention as sparse attention)."""
    j = np.arange(s)[None, :]
    idx = np.where(j <= np.arange(s)[:, None], j, -1).astype(np.int32)
    return paddle.to_tensor(np.broadcast_to(idx, (b, s, s)).copy())


def recall(pred_idx, true_idx):
    hits = total = 0
    for p, t in zip(pred_idx.reshape(-1, pred_idx.shape[-1]), true_idx.reshape(-1, true_idx.shape[-1])):
        t = set(t[t >= 0].tolist())
        hits += len(t & set(p[p >= 0].tolist()))
        total += len(t)
    return hits / max(total, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="dense warm-up steps (the sparse stage runs half as many)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    B, S, DM = 2, 64, 64                 # batch, sequence, model width
    H, DQK, DV = 16, 64, 32              # main attention: heads, qk dim, v dim
    HI, DI, TOPK = 16, 64, 8             # indexer: heads, head dim, top-k
    t0 = time.time()

    # Hidden states with a few recurring "topics", so that attention has structure to learn.
    topics = rng.standard_normal((4, DM))
    x_np = topics[rng.integers(0, 4, (B, S))] + 0.5 * rng.standard_normal((B, S, DM))
    x = paddle.to_tensor(x_np, dtype="float32")

    # The frozen main attention and its causal softmax_lse.
    wq = paddle.to_tensor(rng.standard_normal((DM, H * DQK)) / math.sqrt(DM), dtype="float32")
    wkv = paddle.to_tensor(rng.standard_normal((DM, DQK)) / math.sqrt(DM), dtype="float32")
    query = (x @ wq).reshape([B, S, H, DQK]) * 2.0
    kv = x @ wkv
    all_keys = causal_topk_all(B, S)
    _, lse = dsa.sparse_attention(query, kv, all_keys, v_head_dim=DV, return_softmax_lse=True)
    attn, _ = dsa.dense_attn_score_recompute(query, kv, lse)          # target (unnormalised), for recall
    attn_top = dsa.indexer_topk(paddle.where(attn > 0, attn, paddle.full_like(attn, float("-inf"))), TOPK).numpy()

    # The indexer.
    lin_q = paddle.nn.Linear(DM, HI * DI)
    lin_k = paddle.nn.Linear(DM, DI)
    lin_w = paddle.nn.Linear(DM, HI)
    params = lin_q.parameters() + lin_k.parameters() + lin_w.parameters()
    opt = paddle.optimizer.Adam(learning_rate=3e-3, parameters=params)

    def indexer_inputs():
        iq = lin_q(x).reshape([B, S, HI, DI])
        ik = lin_k(x)
        w = lin_w(x) * (HI ** -0.5 * DI ** -0.5)
        return iq, ik, w

    def indexer_recall():
        with paddle.no_grad():
            top = dsa.indexer_topk(dsa.indexer_score(*indexer_inputs()), TOPK).numpy()
        return recall(top, attn_top)

    print(f"dense warm-up: {args.steps} steps (B={B} S={S}, indexer Hi={HI} Di={DI}; attention H={H} Dqk={DQK})")
    print(f"  recall of the attention's top-{TOPK} keys before training: {indexer_recall():.3f}")
    first = last = None
    for step in range(args.steps):
        loss = dsa.indexer_kl_loss(*indexer_inputs(), query, kv, lse)
        loss.backward()
        opt.step()
        opt.clear_grad()
        last = float(loss)
        first = last if first is None else first
        if step % 10 == 0 or step == args.steps - 1:
            print(f"  step {step:3d}  KL loss {last:.4f}")
    print(f"  recall after the warm-up: {indexer_recall():.3f}")

    sparse_steps = max(1, args.steps // 2)
    print(f"sparse stage: {sparse_steps} steps over the indexer's own top-{TOPK} keys")
    sfirst = slast = None
    for step in range(sparse_steps):
        iq, ik, w = indexer_inputs()
        with paddle.no_grad():
            top = dsa.indexer_topk(dsa.indexer_score(iq, ik, w), TOPK)
            _, lse_sparse = dsa.sparse_attention(query, kv, top, v_head_dim=DV, return_softmax_lse=True)
        loss = dsa.indexer_kl_loss(iq, ik, w, query, kv, lse_sparse, topk_indices=top)
        loss.backward()
        opt.step()
        opt.clear_grad()
        slast = float(loss)
        sfirst = slast if sfirst is None else sfirst
        if step % 10 == 0 or step == sparse_steps - 1:
            print(f"  step {step:3d}  KL loss {slast:.4f}")
    print(f"dense loss {first:.4f} -> {last:.4f}; sparse loss {sfirst:.4f} -> {slast:.4f}; "
          f"final recall {indexer_recall():.3f}; {time.time() - t0:.1f} s")
    if not last < first:
        raise SystemExit("the dense loss did not fall")


if __name__ == "__main__":
    main()
