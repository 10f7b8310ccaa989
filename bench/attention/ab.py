#!/usr/bin/env python3
"""Builds of libattention_bench.so against each other and the PyTorch
baselines, on the same tensors in one process.

  python3 bench/attention/ab.py OUT_JSON NAME=LIB [NAME=LIB ...] [--sections S] [--rounds N]
  python3 bench/attention/ab.py --profile - NAME=LIB ...  # each build's forward once (ncu)

The first NAME is the reference of the output checks. Workloads as in
bench_attention.py (d=128, bf16): "window" (64 sequences heavy-tailed to
4096, H=8, softmax, sliding window W=256; FA2 varlen_attn window (255, 0)),
"cross" (GDPA cross softmax, 1152 sequences of Q 256..2048, K/V=256, H=4;
FA2 varlen_attn, padded cuDNN SDPA forward), "jagged" (the window's
lengths, no mask; FA2), "jagged64" (the same at d=64), "silu" (the same
lengths, SiLU causal, the HSTU shape) and "cross_silu" / "cross_gelu" (the
cross shape with that activation, no baseline). Every build but the first is also timed forward with the variant
switches given by --variants (LABEL:ENV=VALUE, the environment variable set
around each call).
Each round runs the rows in its own shuffled order (seeded by the round), so
that no row always follows the same one; each row is bench_attention.timed
(median of 10 after 3 warm-up). Prints per row the milliseconds per round,
their median and spread, useful TFLOP/s and the ratio to the first build.
"""
import argparse
import json
import os
import random
import statistics
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import bench_attention as ba  # noqa: E402


def workload(name, dev):
    """(q, k, v, q_lens, k_lens, activation, mask, window, FA2 kwargs)."""
    if name.startswith("cross"):
        import random
        b, h, d, lk = 1152, 4, 128, 256
        rng = random.Random(3)
        q_lens = [rng.randint(256, 2048) for _ in range(b)]
        k_lens = [lk] * b
        q = ba.packed(q_lens, h, d, dev)
        k, v = ba.packed(k_lens, h, d, dev), ba.packed(k_lens, h, d, dev)
        act = name[len("cross_"):] or "softmax"
        return q, k, v, q_lens, k_lens, act, "none", 0, {} if act == "softmax" else None
    lens = ba.heavy_tailed(64, 4096, 0.5, seed=1)
    d = 64 if name == "jagged64" else 128
    q, k, v = (ba.packed(lens, 8, d, dev) for _ in range(3))
    if name == "window":
        return q, k, v, lens, lens, "softmax", "window", 256, {"window": 256}
    if name == "silu":
        return q, k, v, lens, lens, "silu", "causal", 0, None
    return q, k, v, lens, lens, "softmax", "none", 0, {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json", help="where the results go as JSON ('-': nowhere)")
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--sections", default="window,cross,jagged,silu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="",
                    help="comma-separated LABEL:ENV=VALUE forward rows of every build but the first")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    builds = {}
    for arg in args.builds:
        name, path = arg.split("=", 1)
        builds[name] = ba.load_lib(path)
    base = next(iter(builds))
    variants = []
    for spec in filter(None, args.variants.split(",")):
        label, env = spec.split(":", 1)
        var, value = env.split("=", 1)
        variants.append((label, var, value))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": {},
           "rows": []}
    print(f"# {out['gpu']} torch {out['torch']}", flush=True)
    for section in args.sections.split(","):
        try:
            run_section(section, dev, builds, base, variants, args, out)
        except Exception:  # the other sections still run
            traceback.print_exc()
        torch.cuda.empty_cache()
    if args.out_json != "-":
        with open(args.out_json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def run_section(section, dev, builds, base, variants, args, out):
    """Checks and times one workload (module docstring), rows into out."""
    q, k, v, q_lens, k_lens, act, mask, window, fa2 = workload(section, dev)
    ours = {b: ba.Ours(lib, q, k, v, q_lens, k_lens, act, mask, window=window)
            for b, lib in builds.items()}
    flops = ours[base].flops
    if args.profile:
        for b in builds:
            ours[b].fwd()
        torch.cuda.synchronize()
        return
    for b in builds:
        ours[b].dout.copy_(ours[base].dout)
        ours[b].fwd_bwd()
    torch.cuda.synchronize()
    checks = {b: {t: ba.rel_diff(getattr(ours[b], t), getattr(ours[base], t))
                  for t in ("out", "dq", "dk", "dv")} for b in builds if b != base}
    rows = []  # (label, pass, fn)
    for b in builds:
        rows.append((b, "fwd", ours[b].fwd))
        rows.append((b, "fwd+bwd", ours[b].fwd_bwd))
        for label, var, value in variants if b != base else ():
            rows.append((f"{b} {label}", "fwd", ba.with_env(ours[b].fwd, var, value)))
    if fa2 is not None:
        cq = torch.tensor(ba.offsets(q_lens), device=dev, dtype=torch.int32)
        ck = torch.tensor(ba.offsets(k_lens), device=dev, dtype=torch.int32)
        mq, mk = max(q_lens), max(k_lens)
        ref = ba.call_varlen(q, k, v, cq, ck, mq, mk, **fa2)
        checks["FA2"] = {"out": ba.rel_diff(ref, ours[base].out)}
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        rows.append(("FA2 varlen_attn", "fwd",
                     lambda: ba.call_varlen(q, k, v, cq, ck, mq, mk, **fa2)))
        rows.append(("FA2 varlen_attn", "fwd+bwd",
                     ba.grad_of(lambda: ba.call_varlen(qg, kg, vg, cq, ck, mq, mk, **fa2),
                                (qg, kg, vg))))
    if section == "cross":  # softmax only
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        b_, h, d = len(q_lens), q.shape[1], q.shape[2]
        qp = ba.pad_batch(q, q_lens, max(q_lens))
        kp, vp = (t.view(b_, k_lens[0], h, d).transpose(1, 2).contiguous() for t in (k, v))

        def sdpa_padded():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qp, kp, vp)
        rows.append(("padded SDPA cuDNN", "fwd", sdpa_padded))
    out["checks"][section] = checks
    print(f"# {section} checks: {json.dumps(checks)}", flush=True)
    times = {(r[0], r[1]): [] for r in rows}
    for rnd in range(args.rounds):
        # A row's time depends on the row before it (a forward timed right
        # after a forward+backward ran up to 7% slower, the same library
        # against itself), so each round runs the rows in a new order.
        order = list(rows)
        random.Random(rnd).shuffle(order)
        for label, mode, fn in order:
            times[(label, mode)].append(ba.timed(fn))
    for (label, mode), ms in times.items():
        med = statistics.median(ms)
        ref = statistics.median(times[(base, mode)])
        mult = 3.5 if mode == "fwd+bwd" else 1.0
        row = {"section": section, "impl": label, "pass": mode, "ms": ms, "median": med,
               "spread": (max(ms) - min(ms)) / med,
               "tflops": mult * flops / (med * 1e-3) / 1e12, "x_first": ref / med}
        out["rows"].append(row)
        print(f"| {section} | {label} | {mode} | {' / '.join(f'{x:.3f}' for x in ms)} | "
              f"{med:.3f} | {100 * row['spread']:.1f}% | {row['tflops']:.1f} | "
              f"{row['x_first']:.3f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
