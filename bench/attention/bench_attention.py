#!/usr/bin/env python3
"""Attention kernels vs PyTorch baselines on the same tensors, in one run.

Loads the recfleet kernels through their C ABI (libattention_bench.so) and
times them next to PyTorch's varlen_attn (FlashAttention-2), padded cuDNN SDPA,
flex_attention with document/window/block masks and torch.compile references
for the GDPA activations. Throughput is useful TFLOP/s: FLOPs from the real
jagged lengths and the mask (4*d per visible pair forward, 2.5x that for the
backward), median of CUDA-event-timed warm repeats. Prints one table.

  python3 bench/attention/bench_attention.py --lib path/to/libattention_bench.so
"""

import argparse
import ctypes
import inspect
import math
import os
import random
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

ACT = {"softmax": 0, "gelu": 1, "silu": 2}
MASK = {"none": 0, "causal": 1, "window": 2, "block": 3}


class Args(ctypes.Structure):
    _fields_ = [(n, t) for n, t in [
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("q_offsets", ctypes.POINTER(ctypes.c_int64)),
        ("k_offsets", ctypes.POINTER(ctypes.c_int64)), ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("activation", ctypes.c_int32),
        ("mask", ctypes.c_int32), ("window", ctypes.c_int64), ("scale", ctypes.c_double),
        ("qk_norm", ctypes.c_int32), ("rope", ctypes.c_int32), ("rope_theta", ctypes.c_double),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
        ("dbias", ctypes.c_void_p), ("stream", ctypes.c_void_p)]]


class Ours:
    """One configured call of the recfleet kernels on given torch tensors."""

    def __init__(self, lib, q, k, v, q_lens, k_lens, act, mask, window=0, rope=False,
                 qk_norm=False, scale=0.0):
        self.lib = lib
        self.q_off = (ctypes.c_int64 * (len(q_lens) + 1))(*offsets(q_lens))
        self.k_off = (ctypes.c_int64 * (len(k_lens) + 1))(*offsets(k_lens))
        self.out = torch.empty_like(q)
        self.lse = (torch.empty(q.shape[0], q.shape[1], device=q.device, dtype=torch.float32)
                    if act == "softmax" else None)
        self.dout = torch.randn_like(q)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.tensors = (q, k, v)
        a = Args()
        a.q, a.k, a.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        a.q_offsets, a.k_offsets = self.q_off, self.k_off
        a.batch, a.heads, a.head_dim = len(q_lens), q.shape[1], q.shape[2]
        a.activation, a.mask, a.window = ACT[act], MASK[mask], window
        a.scale, a.qk_norm, a.rope, a.rope_theta = scale, int(qk_norm), int(rope), 10000.0
        a.out = self.out.data_ptr()
        a.lse = self.lse.data_ptr() if self.lse is not None else None
        a.dout, a.dq, a.dk, a.dv = (self.dout.data_ptr(), self.dq.data_ptr(),
                                    self.dk.data_ptr(), self.dv.data_ptr())
        a.stream = torch.cuda.current_stream().cuda_stream
        self.args = a
        self.err = ctypes.create_string_buffer(1024)
        self.flops = lib.rf_attention_forward_flops(ctypes.byref(a))

    def fwd(self):
        if self.lib.rf_attention_forward(ctypes.byref(self.args), self.err, 1024) != 0:
            raise RuntimeError(self.err.value.decode())

    def fwd_fp8(self):
        if self.lib.rf_attention_forward_fp8(ctypes.byref(self.args), self.err, 1024) != 0:
            raise RuntimeError(self.err.value.decode())

    def bwd(self):
        if self.lib.rf_attention_backward(ctypes.byref(self.args), self.err, 1024) != 0:
            raise RuntimeError(self.err.value.decode())

    def bwd_fp8(self):
        if self.lib.rf_attention_backward_fp8(ctypes.byref(self.args), self.err, 1024) != 0:
            raise RuntimeError(self.err.value.decode())

    def fwd_bwd(self):
        self.fwd()
        self.bwd()

    def fwd_bwd_fp8(self):
        self.fwd_fp8()
        self.bwd_fp8()


def with_env(fn, name, value):
    """fn run with environment variable `name` set to `value`."""
    def run():
        os.environ[name] = value
        try:
            fn()
        finally:
            del os.environ[name]
    return run


def atomic_dq(fn):
    """fn with the backward's dQ through atomics in the dK/dV pass."""
    return with_env(fn, "RECFLEET_ATTENTION_DQ", "atomic")


def mma_backward(fn):
    """fn with the mma.sync backward passes where the launcher would pick wgmma."""
    return with_env(fn, "RECFLEET_ATTENTION_BWD", "mma")


def wgmma_dq_pass(fn):
    """fn with the Hopper backward's dQ from a separate pass instead of the
    TMA reduce-add inside the dK/dV pass."""
    return with_env(fn, "RECFLEET_ATTENTION_WGMMA_DQ", "pass")


def wgmma_dq_fused(fn):
    """fn with the Hopper backward's dQ by TMA reduce-add inside the dK/dV
    pass whatever the per-shape rule picks."""
    return with_env(fn, "RECFLEET_ATTENTION_WGMMA_DQ", "fused")


def wgmma_one_stat_buffer(fn):
    """fn with the Hopper backward's stationary tiles in one buffer (no
    prefetch of the next item's)."""
    return with_env(fn, "RECFLEET_ATTENTION_WGMMA_STAT_PREFETCH", "0")


def bwd_variants(workload, impl, flops, fn):
    """fwd+bwd rows of the backward's alternatives: the Hopper backward with
    the fused dQ and with the dQ pass forced (the default picks per shape),
    and with one stationary buffer; with --mma_bwd also the mma.sync
    backward and its atomic dQ."""
    record(workload, f"{impl}, wgmma bwd fused dQ", "fwd+bwd", flops, wgmma_dq_fused(fn))
    record(workload, f"{impl}, wgmma bwd dQ pass", "fwd+bwd", flops, wgmma_dq_pass(fn))
    record(workload, f"{impl}, wgmma bwd one stationary buffer", "fwd+bwd", flops,
           wgmma_one_stat_buffer(fn))
    if MMA_BWD[0]:
        record(workload, f"{impl}, mma.sync bwd", "fwd+bwd", flops, mma_backward(fn))
        record(workload, f"{impl}, mma.sync bwd atomic dQ", "fwd+bwd", flops, atomic_dq(fn))


def mma_forward(fn):
    """fn with the mma.sync forward wherever the launcher would pick wgmma."""
    return with_env(fn, "RECFLEET_ATTENTION_FWD", "mma")


def wgmma_plain(fn):
    """fn with the Hopper forward's turn-taking, TMA loads, query-tile
    grouping, SiLU overlap and cross-tile chaining switched off."""
    for name in ("TURNS", "TMA", "GROUP", "OVERLAP", "CHAIN"):
        fn = with_env(fn, f"RECFLEET_ATTENTION_WGMMA_{name}", "0")
    return fn


def wgmma_no_group(fn):
    """fn with the Hopper forward loading K/V once per query tile."""
    return with_env(fn, "RECFLEET_ATTENTION_WGMMA_GROUP", "0")


def wgmma_no_turns(fn):
    """fn with the Hopper forward's consumer warpgroups not taking turns."""
    return with_env(fn, "RECFLEET_ATTENTION_WGMMA_TURNS", "0")


FWD_VARIANTS = [True]
# Whether bwd_variants times the mma.sync backward too (--mma_bwd).
MMA_BWD = [False]


def wgmma_variants(workload, impl, flops, fn, switches=()):
    """Forward rows of the Hopper kernel's variants and the mma.sync kernel;
    `switches` adds a row with RECFLEET_ATTENTION_WGMMA_<name>=0 for each
    name (SiLU and GELU: CHAIN, a query tile's last P V issued with the next
    tile's first S; OVERLAP, the activation overlapping the warpgroup's own
    P V)."""
    if not FWD_VARIANTS[0]:
        return
    for name in switches:
        record(workload, f"{impl}, wgmma no {name.lower()}", "fwd", flops,
               with_env(fn, f"RECFLEET_ATTENTION_WGMMA_{name}", "0"))
    record(workload, f"{impl}, wgmma no grouping", "fwd", flops, wgmma_no_group(fn))
    record(workload, f"{impl}, wgmma no turns", "fwd", flops, wgmma_no_turns(fn))
    record(workload, f"{impl}, wgmma no turns/TMA/grouping", "fwd", flops, wgmma_plain(fn))
    record(workload, f"{impl}, mma.sync fwd", "fwd", flops, mma_forward(fn))


def load_lib(path):
    """libattention_bench.so at `path` with its C ABI's signatures."""
    lib = ctypes.CDLL(path)
    lib.rf_attention_forward.argtypes = [ctypes.POINTER(Args), ctypes.c_char_p, ctypes.c_int]
    lib.rf_attention_forward_fp8.argtypes = [ctypes.POINTER(Args), ctypes.c_char_p, ctypes.c_int]
    lib.rf_attention_backward.argtypes = [ctypes.POINTER(Args), ctypes.c_char_p, ctypes.c_int]
    lib.rf_attention_backward_fp8.argtypes = [ctypes.POINTER(Args), ctypes.c_char_p,
                                              ctypes.c_int]
    lib.rf_attention_forward_flops.argtypes = [ctypes.POINTER(Args)]
    lib.rf_attention_forward_flops.restype = ctypes.c_double
    return lib


def rel_diff(a, b):
    """|a - b| / |b| (Frobenius norms, in fp32)."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def offsets(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def heavy_tailed(n, max_len, mean_frac, seed):
    """n Pareto-distributed lengths in [1, max_len], mean ~mean_frac*max_len,
    the longest exactly max_len."""
    rng = random.Random(seed)
    raw = sorted(rng.paretovariate(1.1) for _ in range(n))
    lo, hi = 1e-3, 1e6
    for _ in range(100):
        s = math.sqrt(lo * hi)
        mean = sum(min(max_len, max(1, int(s * r))) for r in raw) / n
        lo, hi = (s, hi) if mean < mean_frac * max_len else (lo, s)
    lens = [min(max_len, max(1, int(lo * r))) for r in raw]
    lens[-1] = max_len
    rng.shuffle(lens)
    return lens


def timed(fn, warmup=3, reps=10):
    """Median milliseconds of fn over warm repeats, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


ROWS = []
DEADLINE = [0.0]
# Pass 1 times the kernels and the ready-made baselines, pass 2 the baselines
# that compile first (flex_attention, torch.compile), so a time budget never
# costs the main comparisons.
PASS = [1]
COMPILED = ("flex_attention", "torch.compile")
# --profile: record() runs each default recfleet row once instead of timing.
PROFILE = [False]


def is_compiled(impl):
    return impl.startswith(COMPILED)


def record(workload, impl, mode, flops, fn, note=""):
    if PROFILE[0]:
        # Only the launcher's default recfleet kernels, once, untimed.
        if PASS[0] == 1 and impl.startswith("recfleet") and ", " not in impl:
            fn()
        return
    if is_compiled(impl) != (PASS[0] == 2):
        return
    if time.time() > DEADLINE[0]:
        ROWS.append((workload, impl, mode, None, None, "skipped: time budget"))
        return
    try:
        ms = timed(fn)
        ROWS.append((workload, impl, mode, ms, flops / (ms * 1e-3) / 1e12, note))
    except Exception as e:  # a baseline missing on this PyTorch is reported, not fatal
        ROWS.append((workload, impl, mode, None, None, f"error: {type(e).__name__}: {e}"[:120]))
        traceback.print_exc(limit=2)
    r = ROWS[-1]
    print(f"  {r[0]:<34} {r[1]:<26} {r[2]:<8} "
          + (f"{r[3]:9.3f} ms {r[4]:7.1f} TF/s" if r[3] else "") + f" {r[5]}", flush=True)


def grad_of(fn, inputs):
    """fn(inputs) forward + backward with a random upstream gradient."""
    out = fn()
    g = torch.randn_like(out)

    def run():
        for t in inputs:
            t.grad = None
        fn().backward(g)
    return run


def packed(lens, h, d, dev, requires_grad=False):
    return torch.randn(sum(lens), h, d, device=dev, dtype=torch.bfloat16,
                       requires_grad=requires_grad)


def varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def call_varlen(q, k, v, cq, ck, mq, mk, causal=False, window=None):
    fn, params = varlen_fn()
    if fn is None:
        raise RuntimeError("torch.nn.attention.varlen not available")
    kw = {}
    if window is not None:
        kw["window_size"] = (window - 1, 0)
    elif causal:
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
    return fn(q, k, v, cq, ck, mq, mk, **kw)


def pad_batch(x, lens, max_len):
    """[total, H, d] jagged -> [B, H, max_len, d] zero-padded."""
    b, h, d = len(lens), x.shape[1], x.shape[2]
    out = x.new_zeros(b, max_len, h, d)
    o = 0
    for i, n in enumerate(lens):
        out[i, :n] = x[o:o + n]
        o += n
    return out.transpose(1, 2).contiguous()


def doc_ids(lens, dev):
    return torch.repeat_interleave(torch.arange(len(lens), device=dev),
                                   torch.tensor(lens, device=dev))


def positions(lens, dev):
    return torch.cat([torch.arange(n, device=dev) for n in lens])


def flex_bench(name, q, k, v, mask_mod, total, flops, with_bwd):
    if PASS[0] != 2 or time.time() > DEADLINE[0]:
        return
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention)
    kw = {"_compile": True} if "_compile" in inspect.signature(create_block_mask).parameters else {}
    bm = create_block_mask(mask_mod, 1, 1, total, total, device=q.device, **kw)
    qf, kf, vf = (t.detach().transpose(0, 1).unsqueeze(0).requires_grad_(with_bwd)
                  for t in (q, k, v))
    record(name, "flex_attention", "fwd", flops, lambda: flex(qf, kf, vf, block_mask=bm))
    if with_bwd:
        record(name, "flex_attention", "fwd+bwd", 3.5 * flops,
               grad_of(lambda: flex(qf, kf, vf, block_mask=bm), (qf, kf, vf)))


def check_close(name, ours, ref):
    if PASS[0] != 1:
        return
    err = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"  check {name}: |ours - baseline| / |baseline| = {err:.2e}", flush=True)
    ROWS.append((name, "check vs baseline", "fwd", None, None, f"rel err {err:.1e}"))


def jagged_self(lib, d, dev, lens, with_flex):
    h = 8
    name = f"jagged self d={d}"
    q, k, v = (packed(lens, h, d, dev) for _ in range(3))
    ours = Ours(lib, q, k, v, lens, lens, "softmax", "none")
    flops = ours.flops
    record(name, "recfleet JFA", "fwd", flops, ours.fwd)
    if d == 128:
        wgmma_variants(name, "recfleet JFA", flops, ours.fwd)
    else:
        record(name, "recfleet JFA, mma.sync fwd", "fwd", flops, mma_forward(ours.fwd))
    record(name, "recfleet JFA", "fwd+bwd", 3.5 * flops, ours.fwd_bwd)
    bwd_variants(name, "recfleet JFA", 3.5 * flops, ours.fwd_bwd)
    cu = torch.tensor(offsets(lens), device=dev, dtype=torch.int32)
    mx = max(lens)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    ours.fwd()
    try:
        check_close(name, ours.out, call_varlen(q, k, v, cu, cu, mx, mx))
    except Exception as e:
        print("  check skipped:", e)
    record(name, "varlen_attn (FA2)", "fwd", flops, lambda: call_varlen(q, k, v, cu, cu, mx, mx))
    record(name, "varlen_attn (FA2)", "fwd+bwd", 3.5 * flops,
           grad_of(lambda: call_varlen(qg, kg, vg, cu, cu, mx, mx), (qg, kg, vg)))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qp, kp, vp = (pad_batch(t, lens, mx) for t in (q, k, v))

    def sdpa_padded():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp)
    record(name, "padded SDPA cuDNN", "fwd", flops, sdpa_padded)
    del qp, kp, vp
    if with_flex:
        doc = doc_ids(lens, dev)
        flex_bench(name, q, k, v, lambda b, hh, qi, ki: doc[qi] == doc[ki], sum(lens), flops,
                   True)
    # HSTU-style: SiLU, causal (the generative-recommenders workload).
    silu = Ours(lib, q, k, v, lens, lens, "silu", "causal")
    record(f"{name} SiLU causal", "recfleet GDPA", "fwd", silu.flops, silu.fwd)
    if d == 128:
        wgmma_variants(f"{name} SiLU causal", "recfleet GDPA", silu.flops, silu.fwd,
                       ("CHAIN", "OVERLAP"))
    else:
        record(f"{name} SiLU causal", "recfleet GDPA, mma.sync fwd", "fwd", silu.flops,
               mma_forward(silu.fwd))
    record(f"{name} SiLU causal", "recfleet GDPA", "fwd+bwd", 3.5 * silu.flops, silu.fwd_bwd)
    bwd_variants(f"{name} SiLU causal", "recfleet GDPA", 3.5 * silu.flops, silu.fwd_bwd)


def reference_fp32(q, k, v, lens, causal):
    """Softmax attention per sequence in fp32 (the bf16 inputs are exact in
    fp32), [total, h, d]."""
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    start = 0
    for n in lens:
        if n > 0:
            qs, ks, vs = (t[start:start + n].float().transpose(0, 1)[None] for t in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            out[start:start + n] = o[0].transpose(0, 1)
        start += n
    return out


def kernel_times(fn, reps=10):
    """Mean device milliseconds per call of each CUDA kernel fn launches
    (torch.profiler), as {kernel name: ms}."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us > 0:
            times[e.key] = us / 1e3 / reps
    return times


def reference_grads_fp32(q, k, v, dout, lens, causal):
    """dq, dk, dv of softmax attention per sequence in fp32 (autograd through
    the math SDPA), each [total, h, d]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    grads = [torch.zeros(t.shape, device=t.device, dtype=torch.float32) for t in (q, k, v)]
    start = 0
    for n in lens:
        if n > 0:
            xs = [t[start:start + n].float().transpose(0, 1)[None].requires_grad_()
                  for t in (q, k, v)]
            with sdpa_kernel(SDPBackend.MATH):
                o = F.scaled_dot_product_attention(*xs, is_causal=causal)
            o.backward(dout[start:start + n].float().transpose(0, 1)[None])
            for g, x in zip(grads, xs):
                g[start:start + n] = x.grad[0].transpose(0, 1)
        start += n
    return grads


def fp8_forward(lib, dev, lens):
    """The FP8 (e4m3) forward and backward against our bf16 ones on the same
    tensors: whole calls (quantize pre-passes included), the kernels alone
    (profiler), and outputs and gradients against an fp32 reference."""
    h, d = 8, 128
    q, k, v = (packed(lens, h, d, dev) for _ in range(3))
    for mask in ("none", "causal"):
        name = f"jagged self d=128 {mask} FP8"
        ours = Ours(lib, q, k, v, lens, lens, "softmax", mask)
        flops = ours.flops
        record(name, "recfleet JFA bf16", "fwd", flops, ours.fwd)
        record(name, "recfleet JFA FP8 (+quantize)", "fwd", flops, ours.fwd_fp8)
        # The backward alone reads the last forward's out and lse (bf16's).
        ours.fwd()
        record(name, "recfleet JFA bf16", "bwd", 2.5 * flops, ours.bwd)
        record(name, "recfleet JFA FP8 (+quantize)", "bwd", 2.5 * flops, ours.bwd_fp8)
        record(name, "recfleet JFA FP8 (+quantize), dQ pass 64-key tiles", "bwd", 2.5 * flops,
               with_env(ours.bwd_fp8, "RECFLEET_ATTENTION_FP8_DQ_KEYS", "64"))
        record(name, "recfleet JFA bf16", "fwd+bwd", 3.5 * flops, ours.fwd_bwd)
        record(name, "recfleet JFA FP8 (+quantize)", "fwd+bwd", 3.5 * flops, ours.fwd_bwd_fp8)
        if PASS[0] != 1 or PROFILE[0]:
            continue
        ours.fwd()
        for label, fn in (("bf16 bwd", ours.bwd), ("FP8 bwd", ours.bwd_fp8)):
            for kname, ms in sorted(kernel_times(fn).items(), key=lambda x: -x[1]):
                print(f"  kernel {label:<8} {ms:8.3f} ms {2.5 * flops / (ms * 1e-3) / 1e12:7.1f} "
                      f"TF/s  {kname[:90]}", flush=True)
        refs = reference_grads_fp32(q, k, v, ours.dout, lens, mask == "causal")
        results = {}
        for label, fn in (("bf16", ours.bwd), ("FP8", ours.bwd_fp8)):
            for g in (ours.dq, ours.dk, ours.dv):
                g.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            results[label] = [g.clone() for g in (ours.dq, ours.dk, ours.dv)]
        for label in ("bf16", "FP8"):
            errs = [rel_diff(g, r) for g, r in zip(results[label], refs)]
            unwritten = sum(int(g.isnan().sum().item()) for g in results[label])
            text = (f"dq {errs[0]:.3e} dk {errs[1]:.3e} dv {errs[2]:.3e}, {unwritten} NaN")
            print(f"  check {name} bwd {label} vs fp32 reference: {text}", flush=True)
            ROWS.append((name, f"check bwd {label} vs fp32 reference", "bwd", None, None, text))
        del refs, results
        for label, fn in (("bf16", ours.fwd), ("FP8", ours.fwd_fp8)):
            for kname, ms in sorted(kernel_times(fn).items(), key=lambda x: -x[1]):
                print(f"  kernel {label:<5} {ms:8.3f} ms {flops / (ms * 1e-3) / 1e12:7.1f} TF/s  "
                      f"{kname[:90]}", flush=True)
        ref = reference_fp32(q, k, v, lens, mask == "causal")
        # Poisoned before each call, so that an element left unwritten shows.
        ours.out.fill_(float("nan"))
        ours.fwd()
        bf16_out = ours.out.clone()
        ours.out.fill_(float("nan"))
        ours.fwd_fp8()
        torch.cuda.synchronize()
        for label, out, base in (("bf16", bf16_out, ref), ("FP8", ours.out, ref),
                                 ("FP8 vs bf16", ours.out, bf16_out)):
            err = rel_diff(out, base)
            unwritten = int(out.isnan().sum().item())
            print(f"  check {name} {label}: |out - base| / |base| = {err:.3e} "
                  f"(base: {'bf16 output' if base is bf16_out else 'fp32 reference'}), "
                  f"{unwritten} NaN", flush=True)
            ROWS.append((name, f"check {label}" + ("" if base is bf16_out else " vs fp32 reference"),
                         "fwd", None, None, f"rel err {err:.3e}, {unwritten} NaN"))
        del ref, bf16_out


def sliding_window(lib, dev, lens, with_flex):
    h, d, w = 8, 128, 256
    name = "sliding window W=256 d=128"
    q, k, v = (packed(lens, h, d, dev) for _ in range(3))
    ours = Ours(lib, q, k, v, lens, lens, "softmax", "window", window=w)
    flops = ours.flops
    record(name, "recfleet JFA window", "fwd", flops, ours.fwd)
    wgmma_variants(name, "recfleet JFA window", flops, ours.fwd)
    record(name, "recfleet JFA window", "fwd+bwd", 3.5 * flops, ours.fwd_bwd)
    bwd_variants(name, "recfleet JFA window", 3.5 * flops, ours.fwd_bwd)
    cu = torch.tensor(offsets(lens), device=dev, dtype=torch.int32)
    mx = max(lens)
    try:
        ours.fwd()
        check_close(name, ours.out, call_varlen(q, k, v, cu, cu, mx, mx, window=w))
    except Exception as e:
        print("  check skipped:", e)
    record(name, "varlen_attn(window)", "fwd", flops,
           lambda: call_varlen(q, k, v, cu, cu, mx, mx, window=w))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    record(name, "varlen_attn(window)", "fwd+bwd", 3.5 * flops,
           grad_of(lambda: call_varlen(qg, kg, vg, cu, cu, mx, mx, window=w), (qg, kg, vg)))
    if with_flex:
        doc, pos = doc_ids(lens, dev), positions(lens, dev)
        flex_bench(name, q, k, v,
                   lambda b, hh, qi, ki: (doc[qi] == doc[ki]) & (pos[ki] <= pos[qi])
                   & (pos[qi] - pos[ki] < w), sum(lens), flops, False)


def gdpa_cross(lib, dev, with_compile):
    b, h, d, lk = 1152, 4, 128, 256
    rng = random.Random(3)
    q_lens = [rng.randint(256, 2048) for _ in range(b)]
    k_lens = [lk] * b
    name = "GDPA cross Q<=2048 KV=256 B=1152"
    q, = (packed(q_lens, h, d, dev),)
    k, v = packed(k_lens, h, d, dev), packed(k_lens, h, d, dev)
    for act in ("silu", "gelu", "softmax"):
        ours = Ours(lib, q, k, v, q_lens, k_lens, act, "none")
        record(f"{name} {act}", "recfleet GDPA", "fwd", ours.flops, ours.fwd)
        wgmma_variants(f"{name} {act}", "recfleet GDPA", ours.flops, ours.fwd,
                       ("CHAIN", "OVERLAP") if act != "softmax" else ())
        record(f"{name} {act}", "recfleet GDPA", "fwd+bwd", 3.5 * ours.flops, ours.fwd_bwd)
        bwd_variants(f"{name} {act}", "recfleet GDPA", 3.5 * ours.flops, ours.fwd_bwd)
    flops_jagged = ours.flops
    cq = torch.tensor(offsets(q_lens), device=dev, dtype=torch.int32)
    ck = torch.tensor(offsets(k_lens), device=dev, dtype=torch.int32)
    try:
        ours.fwd()
        check_close(f"{name} softmax", ours.out, call_varlen(q, k, v, cq, ck, max(q_lens), lk))
    except Exception as e:
        print("  check skipped:", e)
    record(f"{name} softmax", "varlen_attn (FA2)", "fwd", flops_jagged,
           lambda: call_varlen(q, k, v, cq, ck, max(q_lens), lk))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    record(f"{name} softmax", "varlen_attn (FA2)", "fwd+bwd", 3.5 * flops_jagged,
           grad_of(lambda: call_varlen(qg, kg, vg, cq, ck, max(q_lens), lk), (qg, kg, vg)))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qp = pad_batch(q, q_lens, max(q_lens))
    kp, vp = (t.view(b, lk, h, d).transpose(1, 2).contiguous() for t in (k, v))

    def sdpa_padded():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp)
    record(f"{name} softmax", "padded SDPA cuDNN", "fwd", flops_jagged, sdpa_padded)
    del qp
    if with_compile:
        # The torch.compile reference on a dense Q=1024 batch (its own FLOPs).
        qd = torch.randn(b, h, 1024, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        kd, vd = (t.detach().requires_grad_(True) for t in (kp, vp))
        dense_flops = 4.0 * d * b * h * 1024 * lk
        scale = 1.0 / math.sqrt(d)
        for act, f in (("silu", F.silu), ("gelu", F.gelu)):
            ref = torch.compile(lambda a, bb, c, f=f: f(a @ bb.transpose(-1, -2) * scale) @ c)
            record(f"{name} {act}", "torch.compile (dense Q=1024)", "fwd", dense_flops,
                   lambda: ref(qd, kd, vd))
            record(f"{name} {act}", "torch.compile (dense Q=1024)", "fwd+bwd", 3.5 * dense_flops,
                   grad_of(lambda: ref(qd, kd, vd), (qd, kd, vd)))


def rope_torch(x, pos, theta=10000.0):
    """Rotate-half RoPE on [N, H, d] at integer positions [N] (the baseline's
    unfused RoPE)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float32) * 2 / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)


def block_attention(lib, dev, with_flex):
    h, d = 8, 128
    lens = heavy_tailed(32, 16384, 0.5, seed=5)
    name = "BlockAttention+RoPE L<=16k d=128"
    q, k, v = (packed(lens, h, d, dev) for _ in range(3))
    ours = Ours(lib, q, k, v, lens, lens, "softmax", "block", rope=True)
    flops = ours.flops
    record(name, "recfleet BlockAttention", "fwd", flops, ours.fwd)
    record(name, "recfleet BlockAttention", "fwd+bwd", 3.5 * flops, ours.fwd_bwd)
    pos = positions(lens, dev)
    # SDPA on the sequences reshaped into 64-token blocks (each padded to 64).
    padded = [((n + 63) // 64) * 64 for n in lens]
    index = torch.cat([torch.arange(n, device=dev) + o
                       for n, o in zip(lens, offsets(padded))])
    nb = sum(padded) // 64
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def blocks_sdpa(qq, kk, vv):
        def to_blocks(x):
            out = x.new_zeros(sum(padded), h, d)
            out[index] = x
            return out.view(nb, 64, h, d).transpose(1, 2)
        qb, kb, vb = to_blocks(rope_torch(qq, pos)), to_blocks(rope_torch(kk, pos)), to_blocks(vv)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qb, kb, vb)
        return o.transpose(1, 2).reshape(-1, h, d)[index]
    if PASS[0] == 1:
        # Rows of full 64-blocks only: the baseline's zero-padded keys in a
        # sequence's last, partial block enter its softmax.
        full = pos < torch.tensor([n // 64 * 64 for n in lens], device=dev).repeat_interleave(
            torch.tensor(lens, device=dev))
        ours.fwd()
        check_close(name, ours.out[full], blocks_sdpa(q, k, v)[full])
    record(name, "SDPA cuDNN on 64-blocks+RoPE", "fwd", flops, lambda: blocks_sdpa(q, k, v))
    # The same with RoPE and the reshape into blocks done outside the timing.
    qb, kb, vb = (x.new_zeros(sum(padded), h, d) for x in (q, k, v))
    qb[index], kb[index], vb[index] = rope_torch(q, pos), rope_torch(k, pos), v
    qb, kb, vb = (x.view(nb, 64, h, d).transpose(1, 2) for x in (qb, kb, vb))

    def sdpa_blocks_only():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qb, kb, vb)
    record(name, "SDPA cuDNN on 64-blocks only", "fwd", flops, sdpa_blocks_only)
    qbg, kbg, vbg = (x.detach().requires_grad_(True) for x in (qb, kb, vb))

    def sdpa_blocks_only_grad():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qbg, kbg, vbg)
    record(name, "SDPA cuDNN on 64-blocks only", "fwd+bwd", 3.5 * flops,
           grad_of(sdpa_blocks_only_grad, (qbg, kbg, vbg)))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    record(name, "SDPA cuDNN on 64-blocks+RoPE", "fwd+bwd", 3.5 * flops,
           grad_of(lambda: blocks_sdpa(qg, kg, vg), (qg, kg, vg)))
    if with_flex:
        doc = doc_ids(lens, dev)
        qr, kr = rope_torch(q, pos), rope_torch(k, pos)
        flex_bench(name + " (RoPE outside)", qr, kr, v,
                   lambda b, hh, qi, ki: (doc[qi] == doc[ki]) & (pos[qi] // 64 == pos[ki] // 64),
                   sum(lens), flops, True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--budget_s", type=float, default=420.0,
                    help="skip the remaining timings after this many seconds")
    ap.add_argument("--no_flex", action="store_true")
    ap.add_argument("--no_compile", action="store_true")
    ap.add_argument("--sections", default="jagged128,gdpa,block,window,jagged64",
                    help="comma-separated subset of the workloads to run, in this order "
                         "(also: fp8, the FP8 forward and backward against the bf16 ones)")
    ap.add_argument("--no_fwd_variants", action="store_true",
                    help="skip the rows of the Hopper forward's switched-off variants")
    ap.add_argument("--mma_bwd", action="store_true",
                    help="also time the mma.sync backward and its atomic dQ")
    ap.add_argument("--profile", action="store_true",
                    help="only run the selected sections' default recfleet kernels once each "
                         "(fwd, then fwd+bwd), untimed and without the baselines (for ncu)")
    args = ap.parse_args()
    DEADLINE[0] = time.time() + args.budget_s
    FWD_VARIANTS[0] = not args.no_fwd_variants
    MMA_BWD[0] = args.mma_bwd
    lib = load_lib(args.lib)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    lens = heavy_tailed(64, 4096, 0.5, seed=1)
    PROFILE[0] = args.profile
    print(f"# jagged batch: 64 seqs, max {max(lens)}, mean {sum(lens) / 64:.0f}", flush=True)
    workloads = {
        "jagged128": lambda: jagged_self(lib, 128, dev, lens, not args.no_flex),
        "gdpa": lambda: gdpa_cross(lib, dev, not args.no_compile),
        "block": lambda: block_attention(lib, dev, not args.no_flex),
        "window": lambda: sliding_window(lib, dev, lens, not args.no_flex),
        "jagged64": lambda: jagged_self(lib, 64, dev, lens, False),
        "fp8": lambda: fp8_forward(lib, dev, lens),
    }
    sections = [workloads[name] for name in args.sections.split(",")]
    for PASS[0] in (1,) if args.profile else (1, 2):
        for s in sections:
            try:
                s()
            except Exception:
                traceback.print_exc()
            torch.cuda.empty_cache()
    if args.profile:
        torch.cuda.synchronize()
        return 0
    print("\n| workload | implementation | pass | ms | useful TFLOP/s | note |")
    print("|---|---|---|---|---|---|")
    for w, i, m, ms, tf, note in ROWS:
        print(f"| {w} | {i} | {m} | {'' if ms is None else f'{ms:.3f}'} | "
              f"{'' if tf is None else f'{tf:.1f}'} | {note} |")


if __name__ == "__main__":
    sys.exit(main())
