#!/usr/bin/env python3
"""The random read-modify-write ceiling of the embedding Adagrad step.

The rowwise Adagrad step reads and writes each distinct id's table row and
momentum at random places of a large table. This times the least such a
kernel can do, in Triton: the distinct ids (sorted, as the backward has
them) of 65,536 bags x 32 ids uniform over 20M rows, each row and momentum
read, a rowwise-Adagrad-like update from the row itself (no gradient read),
both written back. Also the random read alone (row sums) and the sequential
copy. Rates count bytes read + written.

  python3 bench/kernels2/rmw_ceiling.py [--json OUT]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

from bench import bench


def timed(fn):
    return bench(fn, iters=15, warmup=3)


@triton.jit
def _rmw(table, mom, ids, n, DIM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    rid = tl.load(ids + offs, mask=ok, other=0)
    ptr = table + rid[:, None] * DIM + tl.arange(0, DIM)[None, :]
    row = tl.load(ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    m = tl.load(mom + rid, mask=ok, other=0.0) + tl.sum(row * row, 1) / DIM
    row = row * (1.0 - 0.001 * tl.rsqrt(m + 1.0))[:, None]
    tl.store(ptr, row.to(table.dtype.element_ty), mask=ok[:, None])
    tl.store(mom + rid, m, mask=ok)


@triton.jit
def _gather(table, ids, out, n, DIM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    rid = tl.load(ids + offs, mask=ok, other=0)
    row = tl.load(table + rid[:, None] * DIM + tl.arange(0, DIM)[None, :], mask=ok[:, None],
                  other=0.0).to(tl.float32)
    tl.store(out + offs, tl.sum(row, 1), mask=ok)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, dim, bags, per_bag = 20_000_000, 128, 65536, 32
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    copy = 4 * src.numel() / (timed(lambda: dst.copy_(src)) * 1e-3)
    del src, dst
    ids = torch.unique(torch.randint(0, rows, (bags * per_bag,), device="cuda"))
    n = ids.numel()
    res = {"copy_TBps": copy / 1e12, "distinct_ids": n, "rows": rows, "dim": dim, "rmw": {}}
    print(f"copy {copy / 1e12:.3f} TB/s; {n} distinct ids of {rows} rows, dim {dim}", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        table = torch.randn(rows, dim, device="cuda", dtype=dtype)
        mom = torch.rand(rows, device="cuda", dtype=torch.float32)
        out = torch.empty(n, device="cuda", dtype=torch.float32)
        row_bytes = dim * table.element_size()
        for block in (8, 32):
            for warps in (4, 8):
                grid = (triton.cdiv(n, block),)
                ms = timed(lambda: _rmw[grid](table, mom, ids, n, DIM=dim, BLOCK=block,
                                              num_warps=warps))
                tbs = 2 * n * (row_bytes + 4) / (ms * 1e-3) / 1e12
                ms_g = timed(lambda: _gather[grid](table, ids, out, n, DIM=dim, BLOCK=block,
                                                   num_warps=warps))
                tbs_g = n * row_bytes / (ms_g * 1e-3) / 1e12
                key = f"{str(dtype).split('.')[-1]} block{block} warps{warps}"
                res["rmw"][key] = {"rmw_ms": ms, "rmw_TBps": tbs, "gather_ms": ms_g,
                                   "gather_TBps": tbs_g}
                print(f"{key}: read-modify-write {ms:.3f} ms {tbs:.2f} TB/s "
                      f"({tbs / res['copy_TBps'] * 100:.0f}% of copy); "
                      f"random read {ms_g:.3f} ms {tbs_g:.2f} TB/s", flush=True)
        del table, mom
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
