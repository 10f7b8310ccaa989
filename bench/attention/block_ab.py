#!/usr/bin/env python3
"""BlockAttention: builds of libattention_bench.so against each other, SDPA
cuDNN on pre-made blocks and the device's copy bandwidth, in one process.

  python3 bench/attention/block_ab.py OUT_JSON NAME=LIB [NAME=LIB ...]
  python3 bench/attention/block_ab.py --profile NAME=LIB [NAME=LIB ...]

--profile runs each build's forward + backward once more between
cudaProfilerStart/Stop and exits (for `ncu --profile-from-start off`).

The first NAME is the reference build of the output checks. Workload as in
bench_attention.py's "block" section: 32 sequences, heavy-tailed up to 16384
(mean ~8192), H=8, d=128, softmax, 64-token blocks, RoPE fused (ours) or
applied and reshaped into zero-padded [blocks, H, 64, d] outside the timing
(SDPA cuDNN). 3 rounds in rotating order, each timing
bench_attention.timed (median of 10 after 3 warm-up). Every row is also
rated against the HBM roofline of the layout at the copy bandwidth measured
in the same run (bytes that must move: bench/RESULTS.md).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import bench_attention as ba  # noqa: E402



def copy_bandwidth(dev):
    """Device-to-device copy of 2 GiB, bytes read + written per second."""
    x = torch.empty(1 << 30, dtype=torch.int16, device=dev)
    y = torch.empty_like(x)
    ms = ba.timed(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / (ms * 1e-3)


def main():
    out_json = sys.argv[1]
    profile = out_json == "--profile"
    builds = {}
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        builds[name] = ba.load_lib(path)
    base = next(iter(builds))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    h, d = 8, 128
    lens = ba.heavy_tailed(32, 16384, 0.5, seed=5)
    q, k, v = (ba.packed(lens, h, d, dev) for _ in range(3))
    ours = {b: ba.Ours(lib, q, k, v, lens, lens, "softmax", "block", rope=True)
            for b, lib in builds.items()}
    for b in builds:
        ours[b].dout.copy_(ours[base].dout)
        ours[b].fwd_bwd()
    torch.cuda.synchronize()
    if profile:
        torch.cuda.profiler.start()
        for b in builds:
            ours[b].fwd_bwd()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": sum(lens),
           "checks": {}, "times": {}}
    for b in builds:
        if b != base:
            out["checks"][b] = {t: ba.rel_diff(getattr(ours[b], t), getattr(ours[base], t))
                                for t in ("out", "dq", "dk", "dv", "lse")}
    print(json.dumps(out["checks"]), flush=True)

    pos = ba.positions(lens, dev)
    padded = [((n + 63) // 64) * 64 for n in lens]
    index = torch.cat([torch.arange(n, device=dev) + o for n, o in zip(lens, ba.offsets(padded))])
    nb = sum(padded) // 64
    qb, kb, vb = (x.new_zeros(sum(padded), h, d) for x in (q, k, v))
    qb[index], kb[index], vb[index] = ba.rope_torch(q, pos), ba.rope_torch(k, pos), v
    qb, kb, vb = (x.view(nb, 64, h, d).transpose(1, 2) for x in (qb, kb, vb))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qb, kb, vb)
    qbg, kbg, vbg = (x.detach().requires_grad_(True) for x in (qb, kb, vb))

    def sdpa_grad():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qbg, kbg, vbg)
    full = pos < torch.tensor([n // 64 * 64 for n in lens], device=dev).repeat_interleave(
        torch.tensor(lens, device=dev))
    out["checks"]["sdpa_vs_" + base] = ba.rel_diff(
        sdpa().transpose(1, 2).reshape(-1, h, d)[index][full], ours[base].out[full])

    fns = {}
    for b in builds:
        fns[(b, "fwd")] = ours[b].fwd
        fns[(b, "fwd+bwd")] = ours[b].fwd_bwd
    fns[("SDPA cuDNN on 64-blocks", "fwd")] = sdpa
    fns[("SDPA cuDNN on 64-blocks", "fwd+bwd")] = ba.grad_of(sdpa_grad, (qbg, kbg, vbg))
    order = list(dict.fromkeys(b for b, _ in fns))
    copies = []
    for rnd in range(3):
        copies.append(copy_bandwidth(dev))
        rot = order[rnd % len(order):] + order[:rnd % len(order)]
        for mode in ("fwd", "fwd+bwd"):
            for b in rot:
                ms = ba.timed(fns[(b, mode)])
                out["times"].setdefault(f"{b}|{mode}", []).append(ms)
                print(f"round {rnd} {b:<28} {mode:<8} {ms:8.3f} ms", flush=True)
    bw = statistics.median(copies)
    tokens_heads = sum(lens) * h
    # Bytes that must move: fwd reads q, k, v and writes o (2d bytes each)
    # and lse (4); the backward reads q, k, v, dO and writes dq, dk, dv.
    need = {"fwd": tokens_heads * (4 * 2 * d + 4)}
    need["fwd+bwd"] = need["fwd"] + tokens_heads * 7 * 2 * d
    flops = ours[base].flops
    out.update(copy_tb_s=[c / 1e12 for c in copies], flops_fwd=flops, bytes=need)
    print(f"\ncopy bandwidth (2 GiB D2D, read + write) per round: "
          f"{' / '.join(f'{c / 1e12:.3f}' for c in copies)} TB/s, median {bw / 1e12:.3f}")
    print("\n| implementation | pass | ms r0 / r1 / r2 | median | spread | TFLOP/s | "
          "HBM roofline ms | % of roofline |")
    print("|---|---|---|---|---|---|---|---|")
    for key, t in out["times"].items():
        b, mode = key.split("|")
        med = statistics.median(t)
        f = flops * (3.5 if mode == "fwd+bwd" else 1.0)
        roof = need[mode] / bw * 1e3
        print(f"| {b} | {mode} | {' / '.join(f'{x:.3f}' for x in t)} | {med:.3f} | "
              f"{(max(t) - min(t)) / med * 100:.1f}% | {f / (med * 1e-3) / 1e12:.1f} | "
              f"{roof:.3f} | {roof / med * 100:.1f}% |")
    with open(out_json, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
