"""CPU: a NumPy emulation of the index logic of the top-k "key" sort (ops/dsa/topk/sort_sm90.py, SelectionSort
.key_rank_sort): the key-only bitonic network with every segment made descending by inverting the keys of ascending
segments, the thread / register / shuffle / shared-memory mapping (E = P / 512 keys a thread), the slot of each pair
by a binary search of the sorted keys, equal-key runs placed by an atomic count in any arrival order and then
ordered by column, the fallback for runs longer than GROUP_MAX. The emulation must give the stable sort's order
(descending key, ties lower column first, padding last); mutations of the rule must not. Also the column order
(SelectionSort.columns_by_bitmap: a bit a column, each thread's words counted, a CTA scan, the set bits written in
order; wider rows: the same sorts on keys ~column). The kernel itself runs in tests/gpu/test_dsa_topk.py."""
import numpy as np
import pytest

NT = 512
GROUP_MAX = 8
PAD = np.int64(-2 ** 31)


def network(keys, P, orient=True):
    """keys: int64 [P] (ks values, padding PAD) -> sorted descending, emulating the kernel's stages."""
    E = P // NT
    tid = np.arange(NT)[:, None]
    r = np.arange(E)[None, :]
    ka = keys.reshape(NT, E).copy()

    def flip(size):
        if orient and size < P:
            m = ((tid * E + r) & size) != 0
            ka[m] = ~ka[m]

    size = 2
    while size <= P:
        flip(size)
        stride = size // 2
        while stride >= 1:
            if stride < E:
                for rr in range(E):
                    j = rr ^ stride
                    if j > rr:
                        hi = np.maximum(ka[:, rr], ka[:, j])
                        ka[:, j] = np.minimum(ka[:, rr], ka[:, j])
                        ka[:, rr] = hi
            else:
                m = stride // E
                o = ka[np.arange(NT) ^ m]             # shuffle_sync_bfly or the shared-memory exchange
                lower = (np.arange(NT) & m) == 0
                ka = np.where(lower[:, None], np.maximum(ka, o), np.minimum(ka, o))
            stride //= 2
        flip(size)
        size *= 2
    return ka.reshape(P)


def key_sort(keys, cols, P, rng, orient=True, order_runs=True):
    """Slots of the (key, column) pairs, or None when a run of equal keys is longer than GROUP_MAX (fallback)."""
    srt = network(keys, P, orient)
    idx = np.arange(P)
    far = srt[np.minimum(idx + GROUP_MAX, P - 1)]
    if np.any((srt != PAD) & (idx + GROUP_MAX < P) & (far == srt)):
        return None
    out = np.full(P, 2 ** 31 - 1, dtype=np.int64)
    cnt = np.zeros(P, dtype=np.int64)
    for e in rng.permutation(P):                      # any arrival order of the atomic counts
        key = keys[e]
        if key == PAD:
            continue
        lb = 0
        for b in range(P.bit_length() - 1):
            step = P >> (b + 1)
            lb += step if srt[lb + step - 1] > key else 0
        slot = lb
        if lb + 1 < P and srt[min(lb + 1, P - 1)] == key:
            slot = lb + cnt[lb]
            cnt[lb] += 1
        out[slot] = cols[e]
    if order_runs:
        for i in range(P):
            v = srt[i]
            nxt = srt[min(i + 1, P - 1)]
            prev = srt[max(i - 1, 0)]
            if v != PAD and i + 1 < P and nxt == v and (i == 0 or prev != v):
                g = 1 + sum(1 for j in range(1, GROUP_MAX) if i + j < P and srt[min(i + j, P - 1)] == v)
                out[i:i + g] = np.sort(out[i:i + g])
    return out


def reference(keys, cols, n_sel):
    order = sorted(range(n_sel), key=lambda e: (-keys[e], cols[e]))
    return np.array([cols[e] for e in order])


def draw(rng, P, n_sel, kind):
    if kind == "distinct":
        vals = rng.choice(2 ** 31 - 2, size=n_sel, replace=False) - 2 ** 30
    elif kind == "pairs":                             # runs of 2..GROUP_MAX equal keys
        base = rng.choice(2 ** 20, size=n_sel, replace=False)
        vals = base[rng.integers(0, max(1, n_sel // 3), size=n_sel)]
        vals = np.array(vals, dtype=np.int64)
        for v in np.unique(vals):                     # cap each run at GROUP_MAX
            where = np.flatnonzero(vals == v)
            vals[where[GROUP_MAX:]] = base[-1] + 1 + where[GROUP_MAX:]
    elif kind == "extremes":                          # ks near INT_MIN / INT_MAX, still above padding
        vals = np.concatenate([rng.choice(4096, size=n_sel // 2, replace=False) - 2 ** 31 + 1,
                               2 ** 31 - 1 - rng.choice(4096, size=n_sel - n_sel // 2, replace=False)])
    keys = np.full(P, PAD, dtype=np.int64)
    keys[:n_sel] = vals
    cols = np.full(P, 2 ** 31 - 1, dtype=np.int64)
    cols[:n_sel] = rng.choice(70000, size=n_sel, replace=False)
    perm = rng.permutation(P)                          # the selection is appended in any order
    return keys[perm], cols[perm]


@pytest.mark.parametrize("P", [512, 1024, 2048])
@pytest.mark.parametrize("kind", ["distinct", "pairs", "extremes"])
def test_key_sort_matches_stable_sort(P, kind):
    rng = np.random.default_rng(P + len(kind))
    for n_sel in (P, P - 1, P // 2 + 3, 1):
        keys, cols = draw(rng, P, n_sel, kind)
        out = key_sort(keys, cols, P, rng)
        assert out is not None
        ref = reference(keys, cols, P)[:n_sel] if n_sel == P else reference(
            keys[keys != PAD], cols[keys != PAD], n_sel)
        np.testing.assert_array_equal(out[:n_sel], ref)


def test_long_run_falls_back():
    rng = np.random.default_rng(1)
    P = 2048
    keys, cols = draw(rng, P, P, "distinct")
    keys[:GROUP_MAX + 1] = 12345                      # a run of GROUP_MAX + 1 equal keys
    assert key_sort(keys, cols, P, rng) is None
    keys[GROUP_MAX] = 12346                           # GROUP_MAX: ordered in place
    out = key_sort(keys, cols, P, rng)
    np.testing.assert_array_equal(out, reference(keys, cols, P))


@pytest.mark.parametrize("mutation", ["no_orient", "no_run_order"])
def test_mutations_fail(mutation):
    """The emulation can fail: without the inversion of ascending segments the network does not sort; without the
    run ordering equal keys come out in arrival order."""
    rng = np.random.default_rng(7)
    P = 2048
    keys, cols = draw(rng, P, P, "distinct" if mutation == "no_orient" else "pairs")
    out = key_sort(keys, cols, P, rng, orient=mutation != "no_orient", order_runs=mutation != "no_run_order")
    assert out is not None and not np.array_equal(out, reference(keys, cols, P))


def bitmap_columns(cols, width):
    """Emulation of columns_by_bitmap: NT threads, thread t owns words [t wpt, (t + 1) wpt)."""
    nw = (width + 31) // 32
    wpt = (nw + NT - 1) // NT
    bits = np.zeros(max(nw, 1), dtype=np.uint64)
    for c in cols:
        bits[c >> 5] |= np.uint64(1) << np.uint64(c & 31)
    counts = [sum(bin(int(bits[w])).count("1") for w in range(t * wpt, min((t + 1) * wpt, nw))) for t in range(NT)]
    base = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = np.full(len(cols), -7, dtype=np.int64)
    for t in range(NT):
        pos = base[t]
        for w in range(t * wpt, min((t + 1) * wpt, nw)):
            for b in range(32):
                if (int(bits[w]) >> b) & 1:
                    out[pos] = w * 32 + b
                    pos += 1
    return out


@pytest.mark.parametrize("width,n", [(1, 1), (17, 5), (4097, 2048), (32768, 2048), (131072, 2048), (70000, 300)])
def test_column_order_bitmap(width, n):
    rng = np.random.default_rng(width + n)
    cols = rng.choice(width, size=min(n, width), replace=False)
    np.testing.assert_array_equal(bitmap_columns(cols, width), np.sort(cols))


def test_column_order_by_keys():
    """Rows wider than the bitmap: keys ks = ~column through the "key" sort give ascending columns (unique keys, so
    no runs and never the fallback)."""
    rng = np.random.default_rng(3)
    P, n = 2048, 1500
    cols = np.full(P, 2 ** 31 - 1, dtype=np.int64)
    cols[:n] = rng.choice(300000, size=n, replace=False)
    keys = np.where(np.arange(P) < n, ~cols, PAD)          # padding keeps ks = INT_MIN (u = 0)
    perm = rng.permutation(P)
    out = key_sort(keys[perm], cols[perm], P, rng)
    assert out is not None
    np.testing.assert_array_equal(out[:n], np.sort(cols[:n]))
