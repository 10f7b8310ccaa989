#!/usr/bin/env python3
"""Times GEM-lite in PyTorch (gemlite_torch.py) on make_batches' batches.

  python3 bench/e2e/bench_torch.py --model DIR/model.json --batches DIR/batches.bin \
      --mode eager --steps 20 --warmup 5 --json OUT.json

One mode per process (eager or compile), so a failure or an out-of-memory in
one never poisons the other. For the mode: warm up (compilation happens
there and is timed apart), then time --steps training steps cycling over the
file's batches, each step = copy the pinned batch to the GPU, embedding
lookups, forward + backward of the dense part, fused AdamW, rowwise Adagrad.
Reports, as JSON:
  samples_per_s        samples of the timed steps / their wall time (synchronized)
  step_ms              median and all per-step times (CUDA events)
  phases_ms            median per step, from CUDA events between the phases:
                       h2d+embedding lookup, dense forward+backward, AdamW,
                       embedding backward (rowwise Adagrad)
  kernels              torch.profiler over --profile-steps steps: GPU time per
                       kernel class (embedding / attention / gemm / optimizer /
                       other, by kernel name) and GPU idle = wall - kernel time
  peak_memory_gib      torch.cuda.max_memory_allocated over the timed steps
  flops, tflops, mfu   useful model FLOPs per step from the real jagged lengths
                       (engine's count: gemlite_torch.step_flops), achieved
                       TFLOP/s at the median step, and local MFU against 989
                       (H200 dense bf16 datasheet) and 790 TFLOP/s (measured
                       bf16 GEMM on this machine kind)
  max_batch            the largest batch size (a multiple of the file's) that
                       trains 2 steps without running out of memory: doubling,
                       then bisection, within --search-s seconds
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemlite_torch as gl  # noqa: E402

PEAK_DATASHEET = 989e12
PEAK_MEASURED_GEMM = 790e12

KERNEL_CLASSES = (
    ("attention", ("flash", "fmha", "attention", "attn", "flex")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("embedding", ("embedding", "embag", "index_add", "indexselect", "indexfunc", "unique", "radix",
                   "index_copy", "segment")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "sm90_", "matmul", "bmm", "gemv",
              "addmm", "_mm_")),
)


def classify(name):
    n = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in n for k in keys):
            return cls
    return "other"


class Trainer:
    def __init__(self, spec, mode, device):
        self.spec, self.mode, self.device = spec, mode, device
        torch.manual_seed(spec["config"]["seed"])
        self.model = gl.GemLiteTorch(spec, device)
        c, k = spec["config"], spec["constants"]
        fused = {"fused": True} if device.type == "cuda" else {}
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c["learning_rate"],
                                     betas=(k["adam_beta1"], k["adam_beta2"]), eps=k["adam_epsilon"],
                                     weight_decay=c["weight_decay"], **fused)
        self.forward = self.model.forward
        if mode == "compile":
            torch._dynamo.config.cache_size_limit = 64
            self.forward = torch.compile(self.model.forward, dynamic=True)
        self.cuda = device.type == "cuda"
        # The engine's training.dense_grad_clip_norm: clip_grad_norm_ over the
        # dense parameters (the tables are not clipped there either).
        self.clip = c.get("dense_grad_clip_norm", 0.0)

    def max_len(self, db):
        # Compiled code specializes on Python ints: round the longest history
        # up to a power of two (FlashAttention only sizes its grid with it).
        if self.mode == "compile":
            return 1 << max(db.max_len - 1, 1).bit_length()
        return db.max_len

    def step(self, batch, pinned=None, events=None):
        mark = (lambda i: events[i].record()) if events else (lambda i: None)
        mark(0)
        db = gl.DeviceBatch(self.spec, batch, self.device, pinned)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            feats, hist = self.model.lookups(db)
            mark(1)
            loss = self.forward(feats, hist, db, self.max_len(db))
        loss.backward()
        mark(2)
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        mark(3)
        self.model.sparse_update(db, feats, hist)
        mark(4)
        return loss.detach()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(trainer, batches, pinned, steps, device):
    n = len(batches)
    ms, phases, losses = [], [[] for _ in range(4)], []
    t0 = time.perf_counter()
    for i in range(steps):
        if device.type == "cuda":
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
            losses.append(trainer.step(batches[i % n], pinned[i % n], ev))
            ev[-1].synchronize()
            ms.append(ev[0].elapsed_time(ev[4]))
            for p in range(4):
                phases[p].append(ev[p].elapsed_time(ev[p + 1]))
        else:
            s = time.perf_counter()
            losses.append(trainer.step(batches[i % n], pinned[i % n]))
            ms.append(1e3 * (time.perf_counter() - s))
    sync(device)
    wall = time.perf_counter() - t0
    return ms, phases, [float(x) for x in losses], wall


def profile(trainer, batches, pinned, steps, device):
    if device.type != "cuda" or steps <= 0:
        return None
    from torch.profiler import ProfilerActivity, profile as prof
    n = len(batches)
    sync(device)
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        for i in range(steps):
            trainer.step(batches[i % n], pinned[i % n])
        sync(device)
        wall_us = 1e6 * (time.perf_counter() - t0)
    per_class = {}
    top = {}
    for e in p.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = e.time_range.elapsed_us()
        cls = classify(e.name)
        per_class[cls] = per_class.get(cls, 0.0) + t
        top[e.name] = top.get(e.name, 0.0) + t
    busy = sum(per_class.values())
    out = {k: round(v / steps / 1e3, 3) for k, v in sorted(per_class.items())}
    out["gpu_idle"] = round(max(wall_us - busy, 0.0) / steps / 1e3, 3)
    return {"ms_per_step": out, "wall_ms_per_step": round(wall_us / steps / 1e3, 3),
            "top_kernels_ms_per_step": {k[:90]: round(v / steps / 1e3, 3)
                                        for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]}}


def fits(spec, mode, device, batches, size, file_batch):
    """Whether `size` samples (whole file batches, cycled) train 2 steps."""
    k = size // file_batch
    big = gl.concat_batches([batches[i % len(batches)] for i in range(k)])
    trainer = None
    try:
        trainer = Trainer(spec, mode, device)
        for _ in range(2):
            trainer.step(big)
        sync(device)
        return True, torch.cuda.max_memory_allocated() / 2**30
    except torch.OutOfMemoryError:
        return False, None
    except RuntimeError as e:  # cuBLAS / kernel workspace allocations
        if "out of memory" in str(e).lower() or "ALLOC" in str(e):
            return False, None
        raise
    finally:
        del trainer, big
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def search_max_batch(spec, mode, device, batches, budget_s, limit):
    file_batch = batches[0]["size"]
    t0 = time.perf_counter()
    tried = []
    lo, hi = 0, None
    size = file_batch
    while size <= limit and time.perf_counter() - t0 < budget_s:
        ok, gib = fits(spec, mode, device, batches, size, file_batch)
        tried.append({"batch": size, "fits": ok, "peak_gib": gib and round(gib, 2)})
        if not ok:
            hi = size
            break
        lo = size
        size *= 2
    while hi is not None and hi - lo > file_batch and time.perf_counter() - t0 < budget_s:
        mid = (lo + hi) // 2 // file_batch * file_batch
        ok, gib = fits(spec, mode, device, batches, mid, file_batch)
        tried.append({"batch": mid, "fits": ok, "peak_gib": gib and round(gib, 2)})
        if ok:
            lo = mid
        else:
            hi = mid
    exact = hi is not None and hi - lo <= file_batch
    return {"largest_fitting": lo, "smallest_failing": hi, "resolved_to_file_batch": exact,
            "stopped_by": "oom bracket" if exact else ("limit" if size > limit else "time budget"),
            "tried": tried, "seconds": round(time.perf_counter() - t0, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model.json from make_batches")
    ap.add_argument("--batches", required=True, help="batches.bin from make_batches")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--search-s", type=float, default=0, help="time for the largest-batch search (0: skip)")
    ap.add_argument("--search-limit", type=int, default=1 << 16, help="largest batch size tried")
    ap.add_argument("--probe", type=int, default=0,
                    help="only whether K file batches concatenated train 2 steps: exit 0 (fits) or 3; "
                         "one probe per process (bench/e2e/max_batch.sh)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="write the result here (also printed)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    device = torch.device(args.device)
    spec = gl.load_spec(args.model)
    batches = gl.read_batches(args.batches)
    if args.probe > 0:
        file_batch = batches[0]["size"]
        try:
            ok, gib = fits(spec, args.mode, device, batches, args.probe * file_batch, file_batch)
            what = "fits" if ok else "out of memory"
        except torch.cuda.OutOfMemoryError as e:  # raised outside fits()' own check
            ok, gib, what = False, None, f"{type(e).__name__}: {e}"[:300]
        # Any other error is not "does not fit": it propagates (exit 1), so
        # max_batch.sh stops instead of bisecting on it.
        print(f"probe batch {args.probe * file_batch} ({args.probe} x {file_batch}): {what}, "
              f"peak {gib if gib is None else round(gib, 3)} GiB", flush=True)
        return 0 if ok else 3
    res = {"label": args.label, "mode": args.mode, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "batch_size": batches[0]["size"], "batches_in_file": len(batches),
           "precision": "fp32 master weights and tables, bf16 autocast compute",
           "attention": {"sequence": gl.attention_path(spec["config"]["seq_mask"],
                                                       spec["config"]["seq_activation"], device.type == "cuda"),
                         "cross_and_pma": gl.attention_path("full", "softmax", device.type == "cuda")}}
    try:
        pinned = [gl.pin_batch(b, spec, pin_memory=device.type == "cuda") for b in batches]
        trainer = Trainer(spec, args.mode, device)
        res["dense_parameters"] = sum(p.numel() for p in trainer.model.parameters())
        res["table_parameters"] = sum(t.numel() for t in trainer.model.tables)
        t0 = time.perf_counter()
        trainer.step(batches[0], pinned[0])
        sync(device)
        res["first_step_s"] = round(time.perf_counter() - t0, 2)
        for i in range(1, args.warmup):
            trainer.step(batches[i % len(batches)], pinned[i % len(batches)])
        sync(device)
        res["warmup_s"] = round(time.perf_counter() - t0, 2)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ms, phases, losses, wall = timed_steps(trainer, batches, pinned, args.steps, device)
        if device.type == "cuda":
            res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        B = batches[0]["size"]
        med = statistics.median(ms)
        flops = statistics.mean(gl.step_flops(spec, batches[i % len(batches)]) for i in range(args.steps))
        tokens = statistics.mean(batches[i % len(batches)]["sequence"][0][0][-1] for i in range(args.steps))
        res.update({
            "samples_per_s": round(args.steps * B / wall, 1),
            "samples_per_s_at_median_step": round(B / (med / 1e3), 1),
            "step_ms": {"median": round(med, 3), "min": round(min(ms), 3), "max": round(max(ms), 3),
                        "all": [round(x, 3) for x in ms]},
            "history_tokens_per_step": round(float(tokens), 1),
            "flops_per_step": flops,
            "tflops": round(flops / (med / 1e3) / 1e12, 2),
            "mfu_vs_989": round(flops / (med / 1e3) / PEAK_DATASHEET, 4),
            "mfu_vs_790_measured_gemm": round(flops / (med / 1e3) / PEAK_MEASURED_GEMM, 4),
            "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
        })
        if phases[0]:
            names = ("h2d_and_embedding_lookup", "dense_forward_backward", "adamw", "embedding_adagrad")
            res["phases_ms"] = {n: round(statistics.median(p), 3) for n, p in zip(names, phases)}
        res["kernels"] = profile(trainer, batches, pinned, args.profile_steps, device)
        del trainer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.search_s > 0 and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            res["max_batch"] = search_max_batch(spec, args.mode, device, batches, args.search_s, args.search_limit)
        res["ok"] = True
    except Exception as e:  # reported in the JSON; the run script goes on
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        traceback.print_exc()
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
