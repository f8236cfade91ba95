"""The framework side of the deterministic DSA backwards for the GPU tests (torch; paddle_dsa's is
paddle_dsa/kernels/dsa.py DeterministicWorkspace; the contract: ops/common/deterministic_rows.py). Buffers come
poisoned: the staging buffer NaN (a read of a row the kernel did not write puts NaN into the gradient), the keys 0 (a
real key: an entry whose key the kernel did not write adds its row there), unless poison=False (the benchmarks:
torch.empty). chunks counts the staged chunks."""
import torch


class TorchWorkspace:
    def __init__(self, poison=True):
        self.chunks, self.poison = 0, poison

    def alloc(self, shape, dtype):
        dt = getattr(torch, dtype)
        self.chunks += dtype == "int32"
        if not self.poison:
            return torch.empty(shape, device="cuda", dtype=dt)
        return torch.full(shape, 0 if dtype == "int32" else float("nan"), device="cuda", dtype=dt)

    @staticmethod
    def export(t):
        return t

    @staticmethod
    def sort_keys(keys, n_kv):
        """Entries by key (-1 as n_kv, last), equal keys by entry: one sort of the unique int64 key * E + entry."""
        n = keys.shape[0]
        s = torch.sort(torch.where(keys < 0, n_kv, keys).long() * n + torch.arange(n, device=keys.device)).values
        return (s // n).int(), (s % n).int()
