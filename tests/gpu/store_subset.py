"""Write a kernel-store tarball holding only the entries whose kernel names contain given substrings (no GPU needed).

    python tests/gpu/store_subset.py STORE_DIR OUT.tar.xz SUBSTRING...     e.g.
    python tests/gpu/store_subset.py /tmp/s .device/kernel_store.tar.xz opsdsatopk opscommonfill_sm90

A device call carries the working tree and .device/ within 64 MiB; the whole store (~3.8 MB) plus the DSL and the
peers' wheels leave ~0.2 MB of room, so a call that runs a few kernels' tests can carry only their entries (keep the
whole tarball aside and put it back afterwards). An entry's kernel name is the second line of its header
(ops/common/kernel_cache.py: magic, name, features, digest, body), e.g. cutlass___call___opsdsatopkstream_sm90...;
non-entry files (the manifest) are kept. Prints how many entries were kept of how many.
"""
import lzma
import os
import sys
import tarfile


def kernel_name(path):
    with open(path, "rb") as f:
        head = f.read(4096).split(b"\n")
    return head[1].decode(errors="replace") if len(head) > 1 else ""


def main(store, out, subs):
    names = sorted(os.listdir(store))
    keep = [n for n in names if not n.endswith(".o") or any(s in kernel_name(os.path.join(store, n)) for s in subs)]
    tmp = out + ".tmp"
    with lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for n in keep:
            tar.add(os.path.join(store, n), arcname="./" + n)
    os.replace(tmp, out)
    print(f"store_subset: {len(keep)} of {len(names)} files kept, {os.path.getsize(out)} bytes -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
