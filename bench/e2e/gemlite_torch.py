"""GEM-lite in PyTorch: the baseline twin of recfleet's engine (engine/model.cc).

Built from the model.json that bench/e2e/make_batches writes (every
GemLiteConfig field and the feature schema, from the engine's own JobSpec
mapping) and trained on the batches.bin it writes beside it, so both sides
train the same network on the same samples. Layer for layer, as
engine/layers/*.cc computes it:

  sparse     one fp32 table [rows, dim] per schema table, N(0, embedding_init_std);
             id-list features pooled by sum or mean (F.embedding_bag); history
             tokens = sum of the sequence fields' embeddings; rowwise Adagrad on
             the touched rows (per distinct id: momentum += mean(g^2),
             row -= lr g / (sqrt(momentum) + eps)), outside autograd like the
             engine's fused embedding backward
  tokens     one per id-list feature, plus Linear(num_dense -> dim) of the
             numeric features (F tokens per sample)
  sequence   seq_layers pre-norm blocks x + O(attn(Q n, K n, V n)), n = RMSNorm(x),
             q/k/v without bias, o with bias; QK-norm = L2 normalization of each
             head vector (eps 1e-6); RoPE rotate-half at the token's position in
             its sequence; scale 1/sqrt(head_dim); softmax, or GELU/SiLU without
             normalization (GDPA); masks full / causal / sliding window /
             64-token blocks; then a final RMSNorm
  cross      tokens + O(softmax attn(Q tokens, K h, V h)) over the sample's
             whole history (no positions)
  PMA        O(softmax attn(queries, K h, V h)), P learned queries N(0, 1)
  dense      x0 = [cross tokens, PMA tokens] (D = (F + P) dim); DCN
             x_{c+1} = x0 * (W_c x_c + b_c) + x_c; softmax-gated mixture of
             experts act(l2(act(l1(z)))), every expert on every sample
  heads      CTR and CVR towers l2(act(l1(y))) (both run forward, as in the
             engine); mean BCE with logits of each head that has labels, summed
  optimizer  AdamW (decoupled decay, bias-corrected) on every dense parameter

Precision: fp32 master weights (parameters, AdamW state, embedding tables and
their momenta) with bf16 autocast compute: GEMMs and attention in bf16, fp32
accumulation; the residual stream and norms stay fp32 under autocast.

Attention kernels, the fastest jagged path PyTorch has for each case (no
padding where a kernel allows it):
  softmax, full/causal/sliding window   FlashAttention-2 varlen
        (torch.nn.attention.varlen.varlen_attn, window_size for the masks)
  softmax, block                        the same varlen kernel with every
        64-token block as its own sequence (exactly BlockAttention)
  GELU/SiLU, block                      blocks gathered into [blocks, H, 64, d]
        batched GEMMs, activation and key mask between (compile fuses them)
  GELU/SiLU, full/causal/window         padded [B, H, Lmax, Lmax] GEMMs: no
        PyTorch kernel computes unnormalized activations jagged (flex_attention
        always normalizes with softmax); memory grows with B Lmax^2
  cross-attention and PMA               varlen_attn with Q lengths F and P
Without varlen_attn (older PyTorch) softmax falls back to padded SDPA.

Parameter initialization follows the engine's distributions (Linear N(0, 1/in),
bias 0, RMSNorm gain 1) but not its random stream, so losses match in
distribution, not bit for bit.
"""

import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"RFBATCH1"


# ---- batches.bin (bench/e2e/batch_file.h) ---------------------------------------

def read_batches(path):
    """The batches of a batch file as dicts of numpy arrays (format in batch_file.h)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())  # writable, so torch.from_numpy shares it without a warning
    pos = 0

    def ints(n):
        nonlocal pos
        a = np.frombuffer(data, dtype="<i8", count=n, offset=pos)
        pos += 8 * n
        return a

    def floats(n):
        nonlocal pos
        a = np.frombuffer(data, dtype="<f4", count=n, offset=pos)
        pos += 4 * n
        return a

    def id_list():
        n_off, n_ids = ints(2)
        return ints(int(n_off)), ints(int(n_ids))

    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a batch file (magic {data[:8]!r})")
    pos = 8
    (count,) = ints(1)
    batches = []
    for _ in range(int(count)):
        (size,) = ints(1)
        (n,) = ints(1)
        lists = [id_list() for _ in range(int(n))]
        (n,) = ints(1)
        seq = [id_list() for _ in range(int(n))]
        (n,) = ints(1)
        dense = floats(int(n))
        (n,) = ints(1)
        ctr = floats(int(n))
        (n,) = ints(1)
        cvr = floats(int(n))
        size = int(size)
        batches.append({"size": size, "id_lists": lists, "sequence": seq,
                        "dense": dense.reshape(size, -1) if size else dense.reshape(0, 0),
                        "ctr": ctr if len(ctr) else None, "cvr": cvr if len(cvr) else None})
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    return batches


def concat_batches(batches):
    """One batch of all samples of `batches` (for batch sizes beyond the file's)."""
    def cat_lists(lists):
        offs, ids, base = [np.zeros(1, np.int64)], [], 0
        for o, i in lists:
            offs.append(o[1:] + base)
            ids.append(i)
            base += len(i)
        return np.concatenate(offs), np.concatenate(ids)

    first = batches[0]
    labels = lambda key: (None if first[key] is None
                          else np.concatenate([b[key] for b in batches]))
    return {"size": sum(b["size"] for b in batches),
            "id_lists": [cat_lists([b["id_lists"][f] for b in batches])
                         for f in range(len(first["id_lists"]))],
            "sequence": [cat_lists([b["sequence"][f] for b in batches])
                         for f in range(len(first["sequence"]))],
            "dense": np.concatenate([b["dense"] for b in batches]),
            "ctr": labels("ctr"), "cvr": labels("cvr")}


# ---- useful FLOPs (engine/layers/layer.h FlopCounter) ----------------------------

def visible_pairs(lengths, mask, window, block):
    """Visible (query, key) pairs of self-attention over sequences of `lengths`."""
    L = lengths.astype(np.float64)
    if mask == "full":
        return float((L * L).sum())
    if mask == "causal":
        return float((L * (L + 1) / 2).sum())
    if mask == "sliding_window":
        w = float(window)
        short = np.minimum(L, w)
        return float((short * (short + 1) / 2 + np.maximum(L - w, 0) * w).sum())
    if mask == "block":
        full, rest = np.floor_divide(L, block), np.mod(L, block)
        return float((full * block * block + rest * rest).sum())
    raise ValueError(f"unknown mask {mask}")


def step_flops(spec, batch):
    """Model FLOPs of one training step from the batch's real jagged lengths,
    counted as the engine counts them: 2 M N K per linear forward, 4 d per
    visible query/key pair and head, backward 2x linear and 2.5x attention."""
    c, s = spec["config"], spec["schema"]
    d, H, B = c["dim"], c["heads"], batch["size"]
    off = batch["sequence"][0][0]
    lengths = np.diff(off)
    L = float(off[-1])
    F_ = len(s["id_lists"]) + (1 if s["num_dense"] > 0 else 0)
    P = c["pma_queries"]
    D = (F_ + P) * d
    lin = 0.0
    if s["num_dense"] > 0:
        lin += B * s["num_dense"] * d
    lin += c["seq_layers"] * 4 * L * d * d
    if c["cross_attention"]:
        lin += 2 * B * F_ * d * d + 2 * L * d * d
    if P > 0:
        lin += 2 * L * d * d + B * P * d * d
    lin += c["dcn_layers"] * B * D * D
    lin += B * D * c["num_experts"]
    lin += c["num_experts"] * B * (D * c["expert_hidden"] + c["expert_hidden"] * c["expert_out"])
    lin += 2 * B * (c["expert_out"] * c["tower_hidden"] + c["tower_hidden"])
    lin *= 2
    pairs = c["seq_layers"] * visible_pairs(lengths, c["seq_mask"], c["seq_window"],
                                            spec["constants"]["attention_block_size"])
    if c["cross_attention"]:
        pairs += F_ * L
    pairs += P * L
    attn = 4.0 * d * pairs  # 4 * head_dim * heads per pair
    return 3.0 * lin + 3.5 * attn


# ---- batches on the device --------------------------------------------------------

class DeviceBatch:
    """A batch's tensors on the GPU plus the host-side lengths the kernels need."""

    def __init__(self, spec, batch, device, pinned=None):
        t = pinned if pinned is not None else pin_batch(batch, spec, pin_memory=False)
        cuda = lambda x: x.to(device, non_blocking=True)
        self.size = batch["size"]
        self.id_lists = [(cuda(o), cuda(i)) for o, i in t["id_lists"]]
        self.sequence = [cuda(i) for i in t["sequence_ids"]]
        self.seq_offsets = cuda(t["seq_offsets"])
        self.dense = cuda(t["dense"])
        self.ctr = cuda(t["ctr"]) if t["ctr"] is not None else None
        self.cvr = cuda(t["cvr"]) if t["cvr"] is not None else None
        off = batch["sequence"][0][0]
        lengths = np.diff(off)
        self.tokens = int(off[-1])
        self.max_len = int(lengths.max()) if len(lengths) else 0
        self.lengths = cuda(t["seq_lengths"])
        if "block_offsets" in t:
            self.block_offsets = cuda(t["block_offsets"])
            self.block_slot = cuda(t["block_slot"])
        self.positions = cuda(t["positions"])
        self.seq_cu = cuda(t["seq_cu"])


def pin_batch(batch, spec, pin_memory=True):
    """Host tensors of a batch, pinned (what a data loader hands the trainer)
    unless pin_memory is False (CPU runs, one-off batches), with the index
    arrays the attention needs, computed on the host once per batch."""
    def pin(a):
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory() if pin_memory else t
    off = batch["sequence"][0][0]
    lengths = np.diff(off)
    extra = {}
    if spec["config"]["seq_mask"] == "block":
        # Every 64-token block as a sequence of its own (its end offsets), and
        # where each token sits in a [blocks, 64] grid.
        block = spec["constants"]["attention_block_size"]
        nblk = (lengths + block - 1) // block
        first_block = np.concatenate([[0], np.cumsum(nblk)[:-1]]).astype(np.int64)
        block_in_seq = np.arange(int(nblk.sum())) - np.repeat(first_block, nblk)
        ends = np.minimum(np.repeat(off[:-1], nblk) + (block_in_seq + 1) * block, np.repeat(off[1:], nblk))
        pos = np.arange(off[-1]) - np.repeat(off[:-1], lengths)
        extra = {"block_offsets": pin(np.concatenate([[0], ends]).astype(np.int32)),
                 "block_slot": pin((np.repeat(first_block, lengths) * block + pos).astype(np.int64))}
    return {**extra, "id_lists": [(pin(o), pin(i)) for o, i in batch["id_lists"]],
            "sequence_ids": [pin(i) for _, i in batch["sequence"]],
            "seq_offsets": pin(off),
            "seq_cu": pin(off.astype(np.int32)),
            "seq_lengths": pin(lengths),
            "positions": pin(np.arange(off[-1]) - np.repeat(off[:-1], lengths)),
            "dense": pin(batch["dense"].astype(np.float32)),
            "ctr": pin(batch["ctr"]) if batch["ctr"] is not None else None,
            "cvr": pin(batch["cvr"]) if batch["cvr"] is not None else None}


# ---- attention --------------------------------------------------------------------

def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


VARLEN = _varlen()


# FlashAttention-2 puts the sequences on a grid dimension of at most 65,535
# blocks, so larger batches (the largest-batch probes) go through it in
# slices of whole sequences.
_VARLEN_MAX_SEQS = 65535


def _varlen_sliced(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    """varlen_attn over any number of sequences: slices of at most
    _VARLEN_MAX_SEQS sequences each, offsets rebased to the slice."""
    n = cu_q.shape[0] - 1
    if n <= _VARLEN_MAX_SEQS:
        return VARLEN(q, k, v, cu_q, cu_k, max_q, max_k, **kw)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    out = []
    for s in range(0, n, _VARLEN_MAX_SEQS):
        e = min(s + _VARLEN_MAX_SEQS, n)
        q0, q1, k0, k1 = bounds_q[s], bounds_q[e], bounds_k[s], bounds_k[e]
        out.append(VARLEN(q[q0:q1], k[k0:k1], v[k0:k1], cu_q[s:e + 1] - q0, cu_k[s:e + 1] - k0,
                          max_q, max_k, **kw))
    return torch.cat(out)


def _flash(x):
    """Whether the FlashAttention varlen kernel can take x (CUDA only)."""
    return VARLEN is not None and x.is_cuda


def attention_path(mask, activation, cuda=True):
    """Which implementation the attention functions use for a mask and activation."""
    if activation == "softmax" and VARLEN is not None and cuda:
        return "varlen_attn (FlashAttention-2)" + (", one sequence per 64-token block" if mask == "block" else "")
    if mask == "block":
        return "blocked bmm [blocks, H, 64, 64]"
    return "padded " + ("SDPA" if activation == "softmax" else "bmm") + " [B, H, Lmax, Lmax]"


def _act(s, activation):
    return F.gelu(s) if activation == "gelu" else F.silu(s)


def _padded(x, offsets, lengths, batch, max_len):
    """[T, H, d] jagged -> [B, H, max_len, d] zero-padded, and the row index."""
    T = x.shape[0]
    seq = torch.repeat_interleave(torch.arange(batch, device=x.device), lengths, output_size=T)
    pos = torch.arange(T, device=x.device) - offsets[:-1].repeat_interleave(lengths, output_size=T)
    out = x.new_zeros(batch, max_len, x.shape[1], x.shape[2])
    out[seq, pos] = x
    return out.transpose(1, 2), seq, pos


def self_attention(q, k, v, db, mask, activation, window, scale, max_len):
    """Self-attention of the history tokens [T, H, d] (Lq = Lk per sequence)."""
    if activation == "softmax" and _flash(q):
        if mask == "block":
            return _varlen_sliced(q, k, v, db.block_offsets, db.block_offsets, 64, 64, scale=scale)
        ws = {"full": (-1, -1), "causal": (-1, 0), "sliding_window": (window - 1, 0)}[mask]
        return _varlen_sliced(q, k, v, db.seq_cu, db.seq_cu, max_len, max_len, scale=scale, window_size=ws)
    if mask == "block":
        H, d = q.shape[1], q.shape[2]
        num_blocks = db.block_offsets.shape[0] - 1
        grid = num_blocks * 64
        def blocks(x):
            g = x.new_zeros(grid, H, d)
            g[db.block_slot] = x
            return g.view(num_blocks, 64, H, d).transpose(1, 2)
        valid = torch.zeros(grid, dtype=torch.bool, device=q.device)
        valid[db.block_slot] = True
        valid = valid.view(num_blocks, 1, 1, 64)
        s = torch.matmul(blocks(q), blocks(k).transpose(-1, -2)) * scale
        if activation == "softmax":
            p = torch.softmax(s.float().masked_fill(~valid, float("-inf")), dim=-1).to(v.dtype)
        else:
            p = _act(s, activation).masked_fill(~valid, 0)
        o = torch.matmul(p, blocks(v)).transpose(1, 2).reshape(grid, H, d)
        return o[db.block_slot]
    B = db.lengths.shape[0]
    qp, seq, pos = _padded(q, db.seq_offsets, db.lengths, B, max_len)
    kp, _, _ = _padded(k, db.seq_offsets, db.lengths, B, max_len)
    vp, _, _ = _padded(v, db.seq_offsets, db.lengths, B, max_len)
    i = torch.arange(max_len, device=q.device)
    keep = (i[None, :] < db.lengths[:, None])[:, None, None, :]  # key exists
    if mask in ("causal", "sliding_window"):
        lower = i[None, :] <= i[:, None]
        if mask == "sliding_window":
            lower &= i[None, :] > i[:, None] - window
        keep = keep & lower
    if activation == "softmax":
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=keep, scale=scale)
    else:
        s = torch.matmul(qp, kp.transpose(-1, -2)) * scale
        o = torch.matmul(_act(s, activation).masked_fill(~keep, 0), vp)
    return o.transpose(1, 2)[seq, pos]


def pooling_attention(q, k, v, q_per_sample, db, scale, max_len):
    """Softmax attention of q_per_sample queries per sample [B * n, H, d] over
    the sample's whole history (cross-attention and PMA)."""
    B = db.lengths.shape[0]
    if _flash(q):
        cu_q = torch.arange(0, (B + 1) * q_per_sample, q_per_sample, device=q.device, dtype=torch.int32)
        return _varlen_sliced(q, k, v, cu_q, db.seq_cu, q_per_sample, max_len, scale=scale)
    kp, _, _ = _padded(k, db.seq_offsets, db.lengths, B, max_len)
    vp, _, _ = _padded(v, db.seq_offsets, db.lengths, B, max_len)
    qp = q.view(B, q_per_sample, q.shape[1], q.shape[2]).transpose(1, 2)
    keep = (torch.arange(max_len, device=q.device)[None, :] < db.lengths[:, None])[:, None, None, :]
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=keep, scale=scale)
    return o.transpose(1, 2).reshape(B * q_per_sample, q.shape[1], q.shape[2])


# ---- the model --------------------------------------------------------------------

def linear(n_in, n_out, bias):
    """engine/layers/linear.cc: W ~ N(0, 1/in), b = 0."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(layer.weight, 0.0, 1.0 / math.sqrt(n_in))
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


class RmsNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps)


class Rope:
    """Rotate-half RoPE, angle = position * theta^(-2c/d), c < d/2."""

    def __init__(self, head_dim, theta, device):
        c = torch.arange(head_dim // 2, device=device, dtype=torch.float64)
        self.inv_freq = (theta ** (-2.0 * c / head_dim)).float()

    def angles(self, positions):
        """cos and sin [T, 1, d/2] of the tokens' positions (once per batch)."""
        angle = positions.float()[:, None] * self.inv_freq[None, :]
        return angle.cos()[:, None, :], angle.sin()[:, None, :]

    @staticmethod
    def apply(x, cos_sin):
        cos, sin = cos_sin
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def qk_normalize(x, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().sum(-1, keepdim=True) + eps)).to(x.dtype)


class SelfAttentionBlock(nn.Module):
    def __init__(self, spec):
        super().__init__()
        c, k = spec["config"], spec["constants"]
        d = c["dim"]
        self.heads, self.mask, self.act = c["heads"], c["seq_mask"], c["seq_activation"]
        self.window, self.qk_norm, self.rope = c["seq_window"], c["qk_norm"], c["rope"]
        self.qk_eps = k["qk_norm_epsilon"]
        self.norm = RmsNorm(d, k["rms_norm_epsilon"])
        self.q, self.k, self.v = linear(d, d, False), linear(d, d, False), linear(d, d, False)
        self.o = linear(d, d, True)

    def forward(self, x, db, cos_sin, max_len):
        T, d = x.shape
        dh = d // self.heads
        n = self.norm(x)
        q, k, v = (p(n).view(T, self.heads, dh) for p in (self.q, self.k, self.v))
        if self.qk_norm:
            q, k = qk_normalize(q, self.qk_eps), qk_normalize(k, self.qk_eps)
        if self.rope:
            q, k = Rope.apply(q, cos_sin), Rope.apply(k, cos_sin)
        a = self_attention(q, k, v, db, self.mask, self.act, self.window, 1.0 / math.sqrt(dh), max_len)
        return x + self.o(a.reshape(T, d))


class GemLiteTorch(nn.Module):
    """The dense part of GEM-lite (everything after the embedding lookups) as
    nn.Modules, plus the tables and their rowwise Adagrad as plain tensors."""

    def __init__(self, spec, device):
        super().__init__()
        self.spec = spec
        c, s, k = spec["config"], spec["schema"], spec["constants"]
        d = self.dim = c["dim"]
        self.heads = c["heads"]
        self.num_dense = s["num_dense"]
        self.F = len(s["id_lists"]) + (1 if self.num_dense > 0 else 0)
        self.P = c["pma_queries"]
        D = (self.F + self.P) * d
        act = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[c["mlp_activation"]]
        self.mlp_act = act
        # Registration order of engine/model.cc.
        self.dense_proj = linear(self.num_dense, d, True) if self.num_dense > 0 else None
        self.blocks = nn.ModuleList([SelfAttentionBlock(spec) for _ in range(c["seq_layers"])])
        self.final_norm = RmsNorm(d, k["rms_norm_epsilon"])
        if c["cross_attention"]:
            self.cross_q, self.cross_k, self.cross_v = (linear(d, d, False) for _ in range(3))
            self.cross_o = linear(d, d, True)
        self.cross = c["cross_attention"]
        if self.P > 0:
            self.pma_queries = nn.Parameter(torch.randn(self.P, d))
            self.pma_k, self.pma_v = linear(d, d, False), linear(d, d, False)
            self.pma_o = linear(d, d, True)
        self.dcn = nn.ModuleList([linear(D, D, True) for _ in range(c["dcn_layers"])])
        E, hid, out = c["num_experts"], c["expert_hidden"], c["expert_out"]
        self.gate = linear(D, E, True)
        # Every expert sees every sample, so the E first layers are one GEMM
        # [B, D] x [D, E * hidden] and the second layers one batched GEMM:
        # the same parameters and FLOPs as E separate MLPs, fewer launches.
        self.experts_l1 = linear(D, E * hid, True)
        self.experts_l2_w = nn.Parameter(torch.randn(E, hid, out) / math.sqrt(hid))
        self.experts_l2_b = nn.Parameter(torch.zeros(E, 1, out))
        self.E, self.hid, self.out = E, hid, out
        self.towers = nn.ModuleList([nn.ModuleList([linear(out, c["tower_hidden"], True),
                                                    linear(c["tower_hidden"], 1, True)])
                                     for _ in range(2)])
        self.to(device)
        self.rope = Rope(d // self.heads, k["rope_theta"], device)
        gen = torch.Generator(device=device).manual_seed(c["seed"])
        self.tables = [torch.randn(t["rows"], d, device=device, generator=gen) * c["embedding_init_std"]
                       for t in s["tables"]]
        self.momenta = [torch.zeros(t["rows"], device=device) for t in s["tables"]]

    # -- sparse part (outside autograd, as the engine's fused embedding ops) --

    @torch.no_grad()
    def lookups(self, db):
        """Pooled id-list tokens [B, d] each and history tokens [T, d], as
        leaves whose .grad the backward fills."""
        s = self.spec["schema"]
        feats = []
        for f, (offsets, ids) in zip(s["id_lists"], db.id_lists):
            feats.append(F.embedding_bag(ids, self.tables[f["table"]], offsets, mode=f["pooling"],
                                         include_last_offset=True))
        hist = None
        for f, ids in zip(s["sequence_fields"], db.sequence):
            e = F.embedding(ids, self.tables[f["table"]])
            hist = e if hist is None else hist + e
        return [x.requires_grad_() for x in feats], hist.requires_grad_()

    @torch.no_grad()
    def sparse_update(self, db, feats, hist):
        """Rowwise Adagrad on the rows the batch touched: one gradient row per
        use (a mean-pooled id's row is its bag's gradient / bag length), summed
        per distinct id, then one update per distinct row."""
        s, c = self.spec["schema"], self.spec["config"]
        lr, eps = c["adagrad_learning_rate"], self.spec["constants"]["adagrad_epsilon"]
        uses = [([], []) for _ in s["tables"]]
        B = db.size
        for f, (offsets, ids), x in zip(s["id_lists"], db.id_lists, feats):
            counts = offsets[1:] - offsets[:-1]
            g = x.grad
            if f["pooling"] == "mean":
                g = g / counts.clamp(min=1)[:, None].to(g.dtype)
            bag = torch.repeat_interleave(torch.arange(B, device=g.device), counts, output_size=ids.numel())
            uses[f["table"]][0].append(ids)
            uses[f["table"]][1].append(g[bag])
        for f, ids in zip(s["sequence_fields"], db.sequence):
            uses[f["table"]][0].append(ids)
            uses[f["table"]][1].append(hist.grad)
        for t, (ids, rows) in enumerate(uses):
            if not ids:
                continue
            ids, rows = torch.cat(ids), torch.cat(rows)
            uniq, inverse = torch.unique(ids, return_inverse=True)
            g = torch.zeros(uniq.numel(), rows.shape[1], device=rows.device, dtype=torch.float32)
            g.index_add_(0, inverse, rows.float())
            m = self.momenta[t].index_select(0, uniq) + g.square().mean(1)
            self.momenta[t].index_copy_(0, uniq, m)
            self.tables[t].index_add_(0, uniq, g * (-lr / (m.sqrt() + eps))[:, None])

    # -- dense part --

    def forward(self, feats, hist, db, max_len):
        """The summed BCE of the labelled heads for one batch."""
        # Sizes from tensor shapes, not Python ints, so torch.compile keeps
        # them symbolic instead of recompiling for every batch.
        B, d, H = db.lengths.shape[0], self.dim, self.heads
        dh = d // H
        tokens = list(feats)
        if self.dense_proj is not None:
            tokens.append(self.dense_proj(db.dense))
        tokens = torch.stack([t.float() for t in tokens], dim=1).reshape(B * self.F, d)
        x = hist
        cos_sin = self.rope.angles(db.positions) if self.spec["config"]["rope"] else None
        for block in self.blocks:
            x = block(x, db, cos_sin, max_len)
        h = self.final_norm(x)
        T = h.shape[0]
        scale = 1.0 / math.sqrt(dh)
        crossed = tokens
        if self.cross:
            q = self.cross_q(tokens).view(B * self.F, H, dh)
            k, v = self.cross_k(h).view(T, H, dh), self.cross_v(h).view(T, H, dh)
            a = pooling_attention(q, k, v, self.F, db, scale, max_len)
            crossed = tokens + self.cross_o(a.reshape(B * self.F, d))
        parts = [crossed.reshape(B, self.F * d)]
        if self.P > 0:
            q = self.pma_queries.to(torch.bfloat16).repeat(B, 1).view(B * self.P, H, dh)
            k, v = self.pma_k(h).view(T, H, dh), self.pma_v(h).view(T, H, dh)
            a = pooling_attention(q, k, v, self.P, db, scale, max_len)
            parts.append(self.pma_o(a.reshape(B * self.P, d)).reshape(B, self.P * d).float())
        x0 = torch.cat([p.float() for p in parts], dim=1)
        z = x0
        for layer in self.dcn:
            z = x0 * layer(z) + z
        p = torch.softmax(self.gate(z).float(), dim=1)
        a1 = self.mlp_act(self.experts_l1(z)).view(B, self.E, self.hid).transpose(0, 1)
        a2 = self.mlp_act(torch.baddbmm(self.experts_l2_b.to(a1.dtype), a1, self.experts_l2_w.to(a1.dtype)))
        y = (a2.float() * p.t()[:, :, None]).sum(0)
        loss = 0.0
        for tower, labels in zip(self.towers, (db.ctr, db.cvr)):
            logits = tower[1](self.mlp_act(tower[0](y))).float().view(B)
            if labels is not None:
                loss = loss + F.binary_cross_entropy_with_logits(logits, labels)
        return loss

    def dense_parameters(self):
        return list(self.parameters())


def load_spec(path):
    with open(path) as f:
        return json.load(f)
