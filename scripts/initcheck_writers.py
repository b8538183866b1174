#!/usr/bin/env python3
"""Which GEMM wrote the memory initcheck says was never written.

Reads compute-sanitizer initcheck's log and cuBLASLt's trace of the same process
(CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=...: every cublasLtMatmul with its C and D pointers,
types, rows, columns, leading dimensions and algorithm) and counts the reports by reading kernel
and by the GEMM output, if any, that holds the address read. A diagnostic: a report at a GEMM's
output is a read of memory the tool did not see the GEMM write (Note [GEMM outputs and initcheck],
kernels/gemm.cu); one elsewhere is not explained by it. An address is matched against every GEMM
of the process, not the latest writer: a block reused by the caching allocator can match a GEMM
that wrote it earlier.

  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=lt.log compute-sanitizer --tool initcheck \\
      --print-limit 200000 PROGRAM ... > initcheck.log 2>&1
  scripts/initcheck_writers.py initcheck.log lt.log
"""
import collections
import re
import sys

SIZES = {"R_16BF": 2, "R_16F": 2, "R_32F": 4, "R_64F": 8, "R_8I": 1, "R_32I": 4}


def gemm_outputs(path):
    """(start, end, description) of each distinct C and D a cublasLtMatmul was given."""
    out = []
    for line in open(path, errors="replace"):
        if "cublasLtMatmul]" not in line and "cublasLtMatmul(" not in line:
            continue
        algo = re.search(r"algoId=(\d+)", line)
        tile = re.search(r"tile=(\w+)", line)
        epilogue = re.search(r"epilogue=(\w+)", line)
        for tag in ("D", "C"):
            ptr = re.search(r"\b%s=(0[xX][0-9a-fA-F]+)" % tag, line)
            desc = re.search(r"\b%sdesc=\[([^\]]*)\]" % tag, line)
            if not ptr or not desc:
                continue
            kv = dict(re.findall(r"(\w+)=([\w.]+)", desc.group(1)))
            try:
                rows, cols, ld = int(kv["rows"]), int(kv["cols"]), int(kv["ld"])
                batch = int(kv.get("batchCount", 1))
                stride = int(kv.get("stridedBatchOffset", 0))
            except (KeyError, ValueError):
                continue
            size = SIZES.get(kv.get("type", ""), 4)
            start = int(ptr.group(1), 16)
            end = start + ((batch - 1) * stride + (cols - 1) * ld + rows) * size
            out.append((start, end, "%s %sx%s algo %s %s %s" % (
                kv.get("type"), rows, cols, algo.group(1) if algo else "?",
                tile.group(1) if tile else "", epilogue.group(1) if epilogue else "")))
    return list(dict.fromkeys(out))


def reports(path):
    """(reading kernel, address) of each initcheck report."""
    current = None
    for line in open(path, errors="replace"):
        if "Uninitialized __global__ memory read" in line:
            current = {}
        elif current is not None and re.match(r"=========\s+at ", line) and "kernel" not in current:
            current["kernel"] = re.sub(r"\+0x[0-9a-f]+.*", "", line.split(" at ", 1)[1].strip())
        elif current is not None and "Address 0x" in line:
            address = int(re.search(r"Address (0x[0-9a-fA-F]+)", line).group(1), 16)
            yield current.get("kernel", "?"), address
            current = None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    outputs = gemm_outputs(sys.argv[2])
    memo, counts, total = {}, collections.Counter(), 0
    for kernel, address in reports(sys.argv[1]):
        total += 1
        if address not in memo:
            hits = [d for (s, e, d) in outputs if s <= address < e]
            memo[address] = "a GEMM's output: " + hits[-1] if hits else "no GEMM's output"
        counts[(kernel[:80], memo[address])] += 1
    print("%d cublasLtMatmul outputs, %d reports" % (len(outputs), total))
    for (kernel, where), n in counts.most_common():
        print("%8d  %s  <- %s" % (n, kernel, where))


if __name__ == "__main__":
    main()
