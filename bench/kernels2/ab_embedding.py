"""Embedding backward + rowwise Adagrad of two or more builds in ONE process.

Loads each build's librecfleet_kernels2.so side by side (ctypes, RTLD_LOCAL)
and times them in rotating order for several rounds, on the same tables and
ids, so that every ratio has a baseline from the same process and rounds
show the device's drift. A variant is LABEL=PATH[:NAME=VALUE,...]; the
environment variables are set around its calls, for builds that read a
kernel switch from the environment (the same .so under two labels).

Before timing, each round runs one step of every variant from the same
starting table and momentum, on fresh random ids, and reports the largest
absolute difference of the updated table and the largest relative
difference of the momentum against the first variant.

    python3 ab_embedding.py --variant base=base.so --variant new=new.so \\
        [--rounds 3] [--json out.json]
"""

import argparse
import json
import os

import torch

from bench import BF16, FP32, I64, Lib, adagrad_useful_bytes, bag_batch, bench, ceilings, log


def parse_variant(text):
    label, _, rest = text.partition("=")
    path, _, env = rest.partition(":")
    pairs = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return label, Lib(path), pairs


def call_with_env(env, fn):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def round_of(variants, copy_bw, dtype, rows, dim, bags, per_bag, order, out):
    code = FP32 if dtype == torch.float32 else BF16
    n = bags * per_bag
    table, ids, offsets = bag_batch(dtype, rows, dim, bags, per_bag)
    grad = torch.randn(bags, dim, device="cuda", dtype=dtype)
    momentum = torch.rand(rows, device="cuda", dtype=torch.float32)
    unique = torch.unique(ids).numel()
    useful = adagrad_useful_bytes(table, ids, bags, unique)

    def step(lib, t, m):
        lib.rf_embedding_bag_backward_adagrad(grad.data_ptr(), code, ids.data_ptr(), I64, n,
                                              offsets.data_ptr(), I64, bags, 0, 0.01, 1e-8,
                                              t.data_ptr(), code, rows, dim, m.data_ptr())

    # Same start, one step each: the updated rows must agree with the first
    # variant's.
    checks, first = {}, None
    for label, lib, env in variants:
        t, m = table.clone(), momentum.clone()
        call_with_env(env, lambda: step(lib, t, m))
        torch.cuda.synchronize()
        if first is None:
            first = (t, m)
        t0, m0 = first
        checks[label] = {
            "table_max_abs_diff": (t.float() - t0.float()).abs().max().item(),
            "momentum_max_rel_diff": ((m - m0).abs() / (m0.abs() + 1e-30)).max().item(),
            "rows_changed": int((t != table).any(dim=1).sum().item()),
        }
        del t, m
    del first
    tag = f"{'fp32' if dtype == torch.float32 else 'bf16'}_dim{dim}"
    times = {}
    for i in order:
        label, lib, env = variants[i]
        times[label] = call_with_env(env, lambda: bench(lambda: step(lib, table, momentum),
                                                        iters=20))
    for label, _, _ in variants:
        ms = times[label]
        pct = 100 * useful / (ms * 1e-3) / copy_bw
        c = checks[label]
        log(f"{tag} {label}: {ms:.3f} ms ({pct:.1f}% of copy); vs {variants[0][0]}: "
            f"table max|diff| {c['table_max_abs_diff']:.2e}, momentum max rel "
            f"{c['momentum_max_rel_diff']:.2e}, rows changed {c['rows_changed']} of {unique}")
        out.setdefault(tag, {}).setdefault(label, []).append(
            {"ms": ms, "pct_of_copy": pct, **c})
    del table, ids, offsets, grad, momentum
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", required=True, help="LABEL=PATH[:ENV=V,...]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--json")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    torch.manual_seed(1234)
    copy_bw = ceilings()
    out = {"device": torch.cuda.get_device_name(0), "copy_TBps": copy_bw / 1e12}
    for r in range(args.rounds):
        order = [(i + r) % len(variants) for i in range(len(variants))]
        log(f"round {r}: order {[variants[i][0] for i in order]}")
        for d in args.dtypes.split(","):
            dtype = torch.float32 if d == "fp32" else torch.bfloat16
            round_of(variants, copy_bw, dtype, 20_000_000, 128, 65536, 32, order, out)
    for tag, by_label in out.items():
        if not isinstance(by_label, dict):
            continue
        base = sorted(x["ms"] for x in by_label[variants[0][0]])
        for label, xs in by_label.items():
            ms = sorted(x["ms"] for x in xs)
            pct = sorted(x["pct_of_copy"] for x in xs)
            med, med_base = ms[len(ms) // 2], base[len(base) // 2]
            log(f"median {tag} {label}: {med:.3f} ms ({pct[len(pct) // 2]:.1f}% of copy), "
                f"{med_base / med:.3f}x the speed of {variants[0][0]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
