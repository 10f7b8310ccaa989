"""Benchmarks recfleet's embedding, quantization and linear kernels against
PyTorch on the same GPU, in the same process and on the same stream.

Usage (on the GPU machine, with librecfleet_kernels2.so built by
`bazel build --config=device //bench/kernels2:librecfleet_kernels2.so`):

    python3 bench.py --lib path/to/librecfleet_kernels2.so [--json out.json]

Every number is a median of CUDA-event timings after warm-up, on fresh
random data (never zeros). Bandwidths count the fewest bytes each operation
must move (inputs read once, outputs written once) and are compared with a
device-to-device copy measured in the same run.
"""

import argparse
import ctypes
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

# recfleet::DType, GemmPrecision and ScaleBlock values.
FP32, BF16, E4M3, I64 = 0, 2, 4, 7
NATIVE, PREC_BF16, PREC_FP8 = 0, 1, 2
B1x128, B128x128, B32x32 = 0, 1, 2
HBM_DATASHEET = 4.8e12

results = {}


def log(*a):
    print(*a, flush=True)


def bench(fn, iters=20, warmup=3):
    """Median milliseconds of fn() by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.rf_last_error.restype = ctypes.c_char_p
        P, I, L, F32, U64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                             ctypes.c_uint64)
        sig = {
            "rf_embedding_bag_forward": [P, I, L, L, P, I, L, P, I, L, I, P, I, P],
            "rf_embedding_bag_backward_adagrad": [P, I, P, I, L, P, I, L, I, F32, F32, P, I, L, L,
                                                  P, P],
            "rf_quantize": [P, I, L, L, I, I, I, U64, P, P, P],
            "rf_rmsnorm_forward_fp8": [P, I, L, L, P, F32, P, P, P, P],
            "rf_quantize_pass": [P, I, L, L, I, P, P, P, P, I, I, U64, P],
            "rf_linear_forward": [P, P, I, L, L, L, P, I, I, U64, P, P],
            "rf_linear_backward_input": [P, P, I, L, L, L, P, I, I, U64, P, P],
            "rf_linear_backward_weight": [P, P, I, L, L, L, P, I, I, U64, P, P],
        }
        self.lib.rf_linear_context_new.restype = ctypes.c_void_p
        self.lib.rf_linear_context_free.argtypes = [P]
        self.lib.rf_linear_context_invalidate_weight.argtypes = [P]
        for name, args in sig.items():
            f = getattr(self.lib, name)
            f.argtypes = args
            f.restype = ctypes.c_int

    def context_new(self):
        return self.lib.rf_linear_context_new()

    def context_free(self, ctx):
        self.lib.rf_linear_context_free(ctx)

    def invalidate_weight(self, ctx):
        self.lib.rf_linear_context_invalidate_weight(ctx)

    def __getattr__(self, name):
        f = getattr(self.lib, name)

        def call(*args):
            rc = f(*args, torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"{name}: {self.lib.rf_last_error().decode()}")

        return call


def ceilings():
    n = 2 << 30  # 2 GiB copied: 4 GiB moved
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), iters=10)
    copy_bw = 2 * n / (ms * 1e-3)
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms_mm = bench(lambda: a @ b, iters=10)
    results["ceilings"] = {"copy_TBps": copy_bw / 1e12, "bf16_gemm_8192_TFLOPs":
                           2 * 8192**3 / (ms_mm * 1e-3) / 1e12}
    log(f"ceilings: D2D copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM 8192^3 "
        f"{results['ceilings']['bf16_gemm_8192_TFLOPs']:.0f} TFLOP/s")
    return copy_bw


def bag_batch(dtype, rows, dim, bags, per_bag):
    """A random table and `bags` bags of `per_bag` ids uniform over its rows."""
    n = bags * per_bag
    table = torch.randn(rows, dim, device="cuda", dtype=dtype)
    ids = torch.randint(0, rows, (n,), device="cuda", dtype=torch.int64)
    offsets = torch.arange(0, n + 1, per_bag, device="cuda", dtype=torch.int64)
    return table, ids, offsets


def adagrad_useful_bytes(table, ids, bags, unique):
    """Fewest bytes of the backward + rowwise Adagrad: the output gradient,
    each distinct row read and written, its momentum read and written, the
    int64 ids."""
    row = table.shape[1] * table.element_size()
    return bags * row + 2 * unique * row + 2 * unique * 4 + ids.numel() * 8


def embedding(lib, copy_bw, dtype, rows, dim, bags, per_bag):
    tag = f"embedding_{'fp32' if dtype == torch.float32 else 'bf16'}_dim{dim}"
    code = FP32 if dtype == torch.float32 else BF16
    n = bags * per_bag
    table, ids, offsets = bag_batch(dtype, rows, dim, bags, per_bag)
    out = torch.empty(bags, dim, device="cuda", dtype=dtype)
    esz = table.element_size()

    def ours_fwd():
        lib.rf_embedding_bag_forward(table.data_ptr(), code, rows, dim, ids.data_ptr(), I64, n,
                                     offsets.data_ptr(), I64, bags, 0, out.data_ptr(), code)

    def torch_fwd():
        return F.embedding_bag(ids, table, offsets, mode="sum", include_last_offset=True)

    ours_fwd()
    ref = torch_fwd()
    err = (out.float() - ref.float()).abs().max().item()
    t_ours = bench(ours_fwd)
    t_torch = bench(torch_fwd)
    fwd_bytes = n * dim * esz + bags * dim * esz + n * 8 + (bags + 1) * 8
    r = {"rows": rows, "dim": dim, "bags": bags, "ids_per_bag": per_bag,
         "table_GB": rows * dim * esz / 1e9, "fwd_max_abs_diff_vs_torch": err,
         "fwd_ms": t_ours, "torch_embedding_bag_fwd_ms": t_torch,
         "fwd_TBps": fwd_bytes / (t_ours * 1e-3) / 1e12,
         "torch_fwd_TBps": fwd_bytes / (t_torch * 1e-3) / 1e12}
    r["fwd_pct_of_copy"] = 100 * r["fwd_TBps"] * 1e12 / copy_bw
    r["fwd_pct_of_datasheet"] = 100 * r["fwd_TBps"] * 1e12 / HBM_DATASHEET
    log(f"{tag} fwd: ours {t_ours:.3f} ms ({r['fwd_TBps']:.2f} TB/s, "
        f"{r['fwd_pct_of_copy']:.0f}% of copy), torch {t_torch:.3f} ms "
        f"({r['torch_fwd_TBps']:.2f} TB/s), speedup {t_torch / t_ours:.2f}x, max diff {err:.2e}")

    # Backward fused with rowwise Adagrad.
    grad = torch.randn(bags, dim, device="cuda", dtype=dtype)
    momentum = torch.zeros(rows, device="cuda", dtype=torch.float32)
    unique = torch.unique(ids).numel()

    def ours_bwd():
        lib.rf_embedding_bag_backward_adagrad(grad.data_ptr(), code, ids.data_ptr(), I64, n,
                                              offsets.data_ptr(), I64, bags, 0, 0.01, 1e-8,
                                              table.data_ptr(), code, rows, dim,
                                              momentum.data_ptr())

    t_bwd = bench(ours_bwd, iters=10)
    bwd_bytes = adagrad_useful_bytes(table, ids, bags, unique)
    r.update({"unique_ids": unique, "bwd_adagrad_ms": t_bwd,
              "bwd_useful_TBps": bwd_bytes / (t_bwd * 1e-3) / 1e12})
    r["bwd_pct_of_copy"] = 100 * r["bwd_useful_TBps"] * 1e12 / copy_bw
    log(f"{tag} bwd+rowwise Adagrad: ours {t_bwd:.3f} ms ({r['bwd_useful_TBps']:.2f} TB/s useful,"
        f" {r['bwd_pct_of_copy']:.0f}% of copy)")
    # Random-row ceilings on the same table and ids: PyTorch gathers the
    # batch's distinct rows (random row reads, sequential writes) and
    # scatters them back (sequential reads, random row writes). The Adagrad
    # step reads and writes the same random rows in place.
    uniq = torch.unique(ids)
    staged = table.index_select(0, uniq)
    t_gather = bench(lambda: torch.index_select(table, 0, uniq, out=staged))
    t_scatter = bench(lambda: table.index_copy_(0, uniq, staged))
    row_bytes = 2 * uniq.numel() * dim * esz  # each: rows read + rows written
    r.update({"torch_gather_distinct_rows_ms": t_gather,
              "torch_gather_TBps": row_bytes / (t_gather * 1e-3) / 1e12,
              "torch_scatter_distinct_rows_ms": t_scatter,
              "torch_scatter_TBps": row_bytes / (t_scatter * 1e-3) / 1e12})
    log(f"{tag} random rows: torch gather {t_gather:.3f} ms ({r['torch_gather_TBps']:.2f} TB/s), "
        f"scatter {t_scatter:.3f} ms ({r['torch_scatter_TBps']:.2f} TB/s), "
        f"{uniq.numel()} rows of {dim * esz} B")
    del uniq, staged

    if dtype == torch.float32:
        # PyTorch: sparse embedding_bag gradient + torch.optim.Adagrad (its
        # sparse path; elementwise state of the table's full size).
        param = torch.nn.Parameter(table)
        opt = torch.optim.Adagrad([param], lr=0.01, foreach=False)

        def torch_step():
            o = F.embedding_bag(ids, param, offsets, mode="sum", include_last_offset=True,
                                sparse=True)
            o.backward(grad)
            opt.step()
            opt.zero_grad(set_to_none=True)

        def ours_step():
            ours_fwd()
            ours_bwd()

        t_torch_step = bench(torch_step, iters=5, warmup=2)
        t_ours_step = bench(ours_step, iters=10)
        r.update({"torch_fwd_bwd_adagrad_step_ms": t_torch_step,
                  "ours_fwd_bwd_adagrad_step_ms": t_ours_step,
                  "step_speedup": t_torch_step / t_ours_step})
        log(f"{tag} train step (fwd+bwd+optimizer): ours {t_ours_step:.3f} ms, torch sparse "
            f"Adagrad {t_torch_step:.3f} ms, speedup {t_torch_step / t_ours_step:.1f}x")
        del param, opt
    results[tag] = r
    del table, ids, offsets, out, grad, momentum
    torch.cuda.empty_cache()


def quantize(lib, copy_bw):
    rows, cols = 16384, 8192
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    r = {"shape": [rows, cols], "input": "bf16"}

    def record(key, ms, nbytes):
        bw = nbytes / (ms * 1e-3)
        r[key] = {"ms": ms, "TBps": bw / 1e12, "pct_of_copy": 100 * bw / copy_bw,
                  "bytes": nbytes}
        log(f"quantize {key}: {ms:.3f} ms, {bw / 1e12:.2f} TB/s ({100 * bw / copy_bw:.0f}% of copy)")

    for name, block, br, bc in [("1x128", B1x128, 1, 128), ("128x128", B128x128, 128, 128),
                                ("32x32", B32x32, 32, 32)]:
        for transpose in (0, 1):
            for stochastic in ((0, 1) if block == B1x128 else (0,)):
                qr, qc = (cols, rows) if transpose else (rows, cols)
                q = torch.empty(qr, qc, device="cuda", dtype=torch.uint8)
                s = torch.empty(math.ceil(qr / br), math.ceil(qc / bc), device="cuda",
                                dtype=torch.float32)
                fn = lambda: lib.rf_quantize(x.data_ptr(), BF16, rows, cols, block, transpose,
                                             stochastic, 1234, q.data_ptr(), s.data_ptr())
                key = f"{name}{'_T' if transpose else ''}{'_sr' if stochastic else ''}"
                record(key, bench(fn), x.numel() * 2 + q.numel() + s.numel() * 4)
        # Both orientations from one read of x (activations for fwd + wgrad,
        # weights for fwd + dgrad).
        q = torch.empty(rows, cols, device="cuda", dtype=torch.uint8)
        qt = torch.empty(cols, rows, device="cuda", dtype=torch.uint8)
        s = torch.empty(math.ceil(rows / br), math.ceil(cols / bc), device="cuda",
                        dtype=torch.float32)
        st = torch.empty(math.ceil(cols / br), math.ceil(rows / bc), device="cuda",
                         dtype=torch.float32)
        fn = lambda: lib.rf_quantize_pass(x.data_ptr(), BF16, rows, cols, block, q.data_ptr(),
                                          s.data_ptr(), qt.data_ptr(), st.data_ptr(), 0, 0, 0)
        record(f"{name}_and_T", bench(fn),
               x.numel() * 2 + 2 * q.numel() + (s.numel() + st.numel()) * 4)
        if block == B1x128:
            fn = lambda: lib.rf_quantize_pass(x.data_ptr(), BF16, rows, cols, block, 0, 0,
                                              qt.data_ptr(), st.data_ptr(), 1, 1, 99)
            record("1x128_T_hadamard_sr", bench(fn), x.numel() * 2 + qt.numel() + st.numel() * 4)
        del q, qt, s, st
    xf = x.float()
    q = torch.empty(rows, cols, device="cuda", dtype=torch.uint8)
    s = torch.empty(rows, cols // 128, device="cuda", dtype=torch.float32)
    fn = lambda: lib.rf_quantize(xf.data_ptr(), FP32, rows, cols, B1x128, 0, 0, 0, q.data_ptr(),
                                 s.data_ptr())
    record("1x128_fp32_input", bench(fn), xf.numel() * 4 + q.numel() + s.numel() * 4)
    del xf, q, s
    # PyTorch eager 1x128 quantization for reference.
    def torch_q():
        xr = x.view(rows, cols // 128, 128).float()
        amax = xr.abs().amax(-1, keepdim=True).clamp(min=1e-12)
        return (xr * (448.0 / amax)).to(torch.float8_e4m3fn), amax / 448.0
    ms = bench(torch_q)
    r["torch_eager_1x128_ms"] = ms
    log(f"quantize torch eager 1x128: {ms:.3f} ms")
    # RMSNorm fused with 1x128 FP8 output.
    gamma = torch.rand(cols, device="cuda") + 0.5
    y = torch.empty(rows, cols, device="cuda", dtype=torch.uint8)
    ys = torch.empty(rows, cols // 128, device="cuda", dtype=torch.float32)
    rstd = torch.empty(rows, device="cuda", dtype=torch.float32)
    ms = bench(lambda: lib.rf_rmsnorm_forward_fp8(x.data_ptr(), BF16, rows, cols,
                                                  gamma.data_ptr(), 1e-6, y.data_ptr(),
                                                  ys.data_ptr(), rstd.data_ptr()))
    nbytes = x.numel() * 3 + ys.numel() * 4 + rows * 4
    r["rmsnorm_fp8"] = {"ms": ms, "TBps": nbytes / (ms * 1e-3) / 1e12,
                        "pct_of_copy": 100 * nbytes / (ms * 1e-3) / copy_bw}
    log(f"rmsnorm+fp8 1x128: {ms:.3f} ms ({r['rmsnorm_fp8']['pct_of_copy']:.0f}% of copy)")
    results["quantize"] = r


def quantize_torch(t, block):
    """Reference-free torch quantization helpers for the _scaled_mm baselines."""
    if block == "tensor":
        s = t.abs().max().float() / 448.0
        return (t.float() / s).to(torch.float8_e4m3fn), s
    if block == "row":
        s = t.abs().amax(1, keepdim=True).float() / 448.0
        return (t.float() / s).to(torch.float8_e4m3fn), s
    if block == "1x128":
        m, k = t.shape
        tr = t.view(m, k // 128, 128).float()
        s = tr.abs().amax(-1, keepdim=True) / 448.0
        return (tr / s).to(torch.float8_e4m3fn).view(m, k), s.view(m, k // 128)
    # 128x128
    n, k = t.shape
    tr = t.view(n // 128, 128, k // 128, 128).float()
    s = tr.abs().amax((1, 3), keepdim=True) / 448.0
    return (tr / s).to(torch.float8_e4m3fn).view(n, k), s.view(n // 128, k // 128)


def torch_scaled(a8, sa, b8, sb, recipe):
    """a8 [m, k] and b8 [n, k] K-major; returns a callable computing a @ b^T."""
    if recipe in ("tensor", "row"):
        sbt = sb.t() if recipe == "row" else sb
        return lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sbt,
                                        out_dtype=torch.bfloat16)
    sa_outer = sa.t().contiguous().t()  # 1x128 scales outer-dim-major
    if recipe == "1x128_128x128":
        sb_arg = sb.t()
        rb = F.ScalingType.BlockWise128x128
    else:
        sb_arg = sb.t().contiguous().t()
        rb = F.ScalingType.BlockWise1x128
    return lambda: F.scaled_mm(a8, b8.t(), sa_outer, F.ScalingType.BlockWise1x128, sb_arg, rb,
                               output_dtype=torch.bfloat16)


def linear(lib, m, k, n):
    tag = f"linear_M{m}_K{k}_N{n}"
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    dw = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
    flops = 2 * m * n * k
    refs = {"y": x.float() @ w.float().t(), "dx": dy.float() @ w.float(),
            "dw": dy.float().t() @ x.float()}
    r = {}

    def rel(got, ref):
        return ((got.float() - ref).norm() / ref.norm()).item()

    # (name, precisions fwd | dgrad << 4 | wgrad << 8, flags, context,
    #  re-quantize the weight every step)
    recipes = [("bf16", 0x111, 0, False, False),
               ("fp8, no context (every operand quantized per call)", 0x222, 0, False, False),
               ("fp8, context", 0x222, 0, True, True),
               ("fp8 fwd+dgrad, bf16 wgrad, context", 0x122, 0, True, True),
               ("fp8, context, wgrad Hadamard + SR", 0x222, 3, True, True),
               ("fp8, context, weight kept across steps", 0x222, 0, True, False)]
    for name, prec, flags, use_ctx, per_step_weight in recipes:
        ctx = lib.context_new() if use_ctx else None
        seed = [1]

        def step(ev=None):
            if ctx is not None and per_step_weight:
                lib.invalidate_weight(ctx)
            seed[0] += 1
            if ev:
                ev[0].record()
            lib.rf_linear_forward(x.data_ptr(), w.data_ptr(), BF16, m, k, n, y.data_ptr(), prec,
                                  flags, seed[0], ctx)
            if ev:
                ev[1].record()
            lib.rf_linear_backward_input(dy.data_ptr(), w.data_ptr(), BF16, m, k, n,
                                         dx.data_ptr(), prec, flags, seed[0], ctx)
            if ev:
                ev[2].record()
            lib.rf_linear_backward_weight(dy.data_ptr(), x.data_ptr(), BF16, m, k, n,
                                          dw.data_ptr(), prec, flags, seed[0], ctx)
            if ev:
                ev[3].record()

        step()
        torch.cuda.synchronize()
        errs = {"y": rel(y, refs["y"]), "dx": rel(dx, refs["dx"]), "dw": rel(dw, refs["dw"])}
        for _ in range(3):
            step()
        iters = 20
        evs = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(iters)]
        for e in evs:
            step(e)
        torch.cuda.synchronize()
        seg = lambda a, b: sorted(e[a].elapsed_time(e[b]) for e in evs)[iters // 2]
        t = {"fwd": seg(0, 1), "dgrad": seg(1, 2), "wgrad": seg(2, 3), "step": seg(0, 3)}
        if ctx is not None:
            lib.context_free(ctx)
        r[name] = {"ms": t, "TFLOPs_step": 3 * flops / (t["step"] * 1e-3) / 1e12,
                   "rel_err_vs_fp32": errs}
        log(f"{tag} ours {name}: fwd {t['fwd']:.3f} dgrad {t['dgrad']:.3f} wgrad "
            f"{t['wgrad']:.3f} step {t['step']:.3f} ms ({r[name]['TFLOPs_step']:.0f} TFLOP/s); "
            f"rel err y {errs['y']:.2e} dx {errs['dx']:.2e} dw {errs['dw']:.2e}")
    base = r["bf16"]["ms"]["step"]
    for name in r:
        r[name]["speedup_vs_ours_bf16"] = base / r[name]["ms"]["step"]
        log(f"{tag} {name}: {base / r[name]['ms']['step']:.2f}x ours bf16")

    # PyTorch baselines on the same three GEMM shapes.
    shapes = {"fwd": (x, w), "dgrad": (dy, w.t().contiguous()), "wgrad": (dy.t().contiguous(),
                                                                          x.t().contiguous())}
    tb = {g: bench(lambda a=a, b=b: a @ b.t()) for g, (a, b) in shapes.items()}
    tb["total"] = sum(tb.values())
    r["torch_bf16_ms"] = tb
    log(f"{tag} torch bf16 matmul total {tb['total']:.3f} ms")
    for recipe in ("tensor", "row", "1x128_128x128", "1x128_1x128"):
        try:
            tt = {}
            for g, (a, b) in shapes.items():
                ab = "tensor" if recipe == "tensor" else ("row" if recipe == "row" else "1x128")
                bb = {"tensor": "tensor", "row": "row", "1x128_128x128": "128x128",
                      "1x128_1x128": "1x128"}[recipe]
                if g == "wgrad" and bb == "128x128":
                    bb = "1x128"  # wgrad's B is an activation
                a8, sa = quantize_torch(a, ab)
                b8, sb = quantize_torch(b, bb)
                rec = recipe if not (g == "wgrad" and recipe == "1x128_128x128") else "1x128_1x128"
                tt[g] = bench(torch_scaled(a8, sa, b8, sb, rec))
                del a8, b8
            tt["total"] = sum(tt.values())
            r[f"torch_scaled_mm_{recipe}_ms"] = tt
            log(f"{tag} torch _scaled_mm {recipe} (GEMMs only, pre-quantized) fwd {tt['fwd']:.3f}"
                f" dgrad {tt['dgrad']:.3f} wgrad {tt['wgrad']:.3f} total {tt['total']:.3f} ms")
        except Exception as e:  # recorded, not fatal: report what this torch supports
            r[f"torch_scaled_mm_{recipe}_error"] = str(e)[:300]
            log(f"{tag} torch _scaled_mm {recipe}: unsupported here: {str(e)[:200]}")
    results[tag] = r
    del x, w, dy, y, dx, dw, refs
    torch.cuda.empty_cache()


def profile_once(lib):
    """One launch of each kernel worth reading hardware counters on (run
    under `ncu -k regex:...`): the quantize rows (nearest and stochastic), the
    quantize tiles (1x128 of x and x^T, 128x128, stochastic 1x128 of x^T),
    RMSNorm + FP8 and the embedding backward."""
    rows, cols = 16384, 8192
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(rows, cols, device="cuda", dtype=torch.uint8)
    qt = torch.empty(cols, rows, device="cuda", dtype=torch.uint8)
    s = torch.empty(rows, cols // 32, device="cuda", dtype=torch.float32)
    st = torch.empty(cols, rows // 32, device="cuda", dtype=torch.float32)
    lib.rf_quantize(x.data_ptr(), BF16, rows, cols, B1x128, 0, 0, 0, q.data_ptr(), s.data_ptr())
    lib.rf_quantize(x.data_ptr(), BF16, rows, cols, B1x128, 0, 1, 7, q.data_ptr(), s.data_ptr())
    lib.rf_quantize_pass(x.data_ptr(), BF16, rows, cols, B1x128, q.data_ptr(), s.data_ptr(),
                         qt.data_ptr(), st.data_ptr(), 0, 0, 0)
    lib.rf_quantize(x.data_ptr(), BF16, rows, cols, B128x128, 0, 0, 0, q.data_ptr(), s.data_ptr())
    lib.rf_quantize(x.data_ptr(), BF16, rows, cols, B1x128, 1, 1, 7, qt.data_ptr(), st.data_ptr())
    gamma = torch.rand(cols, device="cuda") + 0.5
    rstd = torch.empty(rows, device="cuda", dtype=torch.float32)
    lib.rf_rmsnorm_forward_fp8(x.data_ptr(), BF16, rows, cols, gamma.data_ptr(), 1e-6,
                               q.data_ptr(), s.data_ptr(), rstd.data_ptr())
    del x, q, qt, s, st, gamma, rstd
    n_rows, dim, bags, per_bag = 20_000_000, 128, 65536, 32
    table = torch.randn(n_rows, dim, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, n_rows, (bags * per_bag,), device="cuda", dtype=torch.int64)
    offsets = torch.arange(0, bags * per_bag + 1, per_bag, device="cuda", dtype=torch.int64)
    grad = torch.randn(bags, dim, device="cuda", dtype=torch.bfloat16)
    momentum = torch.zeros(n_rows, device="cuda", dtype=torch.float32)
    lib.rf_embedding_bag_backward_adagrad(grad.data_ptr(), BF16, ids.data_ptr(), I64,
                                          bags * per_bag, offsets.data_ptr(), I64, bags, 0, 0.01,
                                          1e-8, table.data_ptr(), BF16, n_rows, dim,
                                          momentum.data_ptr())
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--json")
    p.add_argument("--skip-embedding", action="store_true")
    p.add_argument("--quantize-only", action="store_true",
                   help="only the ceilings and the quantization section")
    p.add_argument("--sections",
                   help="comma-separated subset of embedding_fp32, embedding_bf16, quantize, "
                        "linear (M=8192, K=N=4096), linear_large (default: all that the flags "
                        "above leave)")
    p.add_argument("--profile-once", action="store_true",
                   help="one launch of each profiled kernel, no timing (for ncu)")
    args = p.parse_args()
    lib = Lib(args.lib)
    if args.profile_once:
        return profile_once(lib)
    torch.manual_seed(int(time.time()))
    results["device"] = torch.cuda.get_device_name(0)
    results["torch"] = torch.__version__
    results["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    copy_bw = ceilings()
    sections = {}
    if not (args.skip_embedding or args.quantize_only):
        sections["embedding_fp32"] = lambda: embedding(lib, copy_bw, torch.float32, 20_000_000,
                                                       128, 65536, 32)
        sections["embedding_bf16"] = lambda: embedding(lib, copy_bw, torch.bfloat16, 20_000_000,
                                                       128, 65536, 32)
    sections["quantize"] = lambda: quantize(lib, copy_bw)
    if not args.quantize_only:
        sections["linear"] = lambda: linear(lib, 8192, 4096, 4096)
        sections["linear_large"] = [lambda: linear(lib, 16384, 4096, 4096),
                                    lambda: linear(lib, 16384, 8192, 8192)]
    if args.sections:
        wanted = args.sections.split(",")
        unknown = [w for w in wanted if w not in sections]
        if unknown:
            p.error(f"unknown or excluded sections: {unknown}")
        sections = {k: v for k, v in sections.items() if k in wanted}
    for s in [f for v in sections.values() for f in (v if isinstance(v, list) else [v])]:
        try:
            s()
        except Exception as e:
            log(f"section failed: {e!r}")
            results.setdefault("errors", []).append(repr(e)[:500])
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
