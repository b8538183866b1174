#!/usr/bin/env python3
"""Reads a graphward checkpoint (examples/checkpoint.h's layout) with the standard library alone:
its tensors by name (dtype, shape and raw little-endian bytes) and its integers, the magic, the
version and the FNV-1a hash checked. scripts/gpt2_torch.py builds PyTorch tensors from it.

  graphward_checkpoint.py CKPT      prints every tensor's name, dtype and shape and every integer
"""
import struct
import sys

MAGIC = b"graphwardckpt"
DTYPES = {0: "float32", 1: "float64", 2: "int32", 3: "bfloat16"}
SIZES = {0: 4, 1: 8, 2: 4, 3: 2}


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def read(path, check_hash_below=50_000_000):
    """(tensors, integers): tensors[name] = (dtype name, shape tuple, bytes); integers[name] = int.
    The hash is checked for files below check_hash_below bytes (pure Python is slow)."""
    data = open(path, "rb").read()
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 20:
        raise ValueError(f"{path}: not a graphward checkpoint")
    body, stored = data[:-8], struct.unpack("<Q", data[-8:])[0]
    at = len(MAGIC)
    version, n_tensors, n_ints = struct.unpack_from("<III", body, at)
    at += 12
    if version != 1:
        raise ValueError(f"{path}: version {version}; expected 1")
    if len(body) < check_hash_below and fnv1a(body) != stored:
        raise ValueError(f"{path}: its checksum does not match its contents")
    tensors, ints = {}, {}
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<I", body, at)
        name = body[at + 4:at + 4 + n].decode()
        at += 4 + n
        code, rank = struct.unpack_from("<BB", body, at)
        at += 2
        shape = struct.unpack_from("<" + "q" * rank, body, at)
        at += 8 * rank
        (nbytes,) = struct.unpack_from("<Q", body, at)
        at += 8
        count = 1
        for s in shape:
            count *= s
        if code not in DTYPES or nbytes != count * SIZES[code] or at + nbytes > len(body):
            raise ValueError(f"{path}: tensor '{name}' is malformed")
        tensors[name] = (DTYPES[code], tuple(shape), body[at:at + nbytes])
        at += nbytes
    for _ in range(n_ints):
        (n,) = struct.unpack_from("<I", body, at)
        name = body[at + 4:at + 4 + n].decode()
        at += 4 + n
        (ints[name],) = struct.unpack_from("<q", body, at)
        at += 8
    if at != len(body):
        raise ValueError(f"{path}: {len(body) - at} bytes after its last record")
    return tensors, ints


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tensors, ints = read(sys.argv[1])
    for name, (dtype, shape, raw) in tensors.items():
        first = struct.unpack_from("<f", raw)[0] if dtype == "float32" and raw else None
        print(f"{name} {dtype} {list(shape)}" + (f" first {first:.6g}" if first is not None else ""))
    for name, v in ints.items():
        print(f"{name} = {v}")
