"""The Triton kernels of graph attention (``triton_graph_attention.py`` launches them): one program per node reads
whole rows of all heads (H * C values, contiguous in the (B, N, H, C) layout), so an edge's source index is loaded
once for every head and each row is read in one coalesced piece.

- forward, per (destination, sample): walks the destination's incoming edges ``BLOCK_E`` at a time through the CSC
  row pointer as (BLOCK_E, BLOCK_H, BLOCK_C) tiles, an online softmax per head; writes out and the per-head
  log-sum-exp.
- backward by destination, per destination, samples looped inside: recomputes alpha from the log-sum-exp, writes
  grad_q and delta = <dout, out> per head, and accumulates the sample-summed grad_e of the node's edges (each edge
  belongs to one program, so no atomics).
- backward by source, per (source, sample): walks the source's outgoing edges in source order (a source row
  pointer and a permutation of the edges), recomputes alpha and the score gradient, writes grad_k and grad_v once.

Heads and channels are padded to powers of two and masked; arithmetic is fp32. Node tensors are contiguous
(B, N, H, C), the edge embedding (E, H, C), statistics (B, N_dst, H); row and edge offsets are int64.
"""

from __future__ import annotations

from collections.abc import Callable

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is an optional extra: the launcher says so when the backend is used
    triton = tl = None

TILE_ELEMENTS = 4096
"""Values of one (BLOCK_E, BLOCK_H, BLOCK_C) edge tile: BLOCK_E is the most edges per step that keep a tile this
small (at least 1, at most MAX_EDGES_PER_STEP)."""
MAX_EDGES_PER_STEP = 16


def _jit(fn: Callable) -> Callable:
    """``triton.jit``: compiled kernels, or interpreted ones when TRITON_INTERPRET was set before triton and this
    module were imported (triton decides when it wraps a function). Without triton the plain function, never run."""
    return fn if triton is None else triton.jit(fn)


def launch_config(heads: int, channels: int) -> dict[str, int | bool]:
    """Compile-time block sizes and compiler options for ``heads`` heads of width ``channels`` (FMA fusion asked
    for explicitly: triton's default for it is changing)."""
    block_h = 1 << max(0, heads - 1).bit_length()
    block_c = 1 << max(0, channels - 1).bit_length()
    block_e = max(1, min(MAX_EDGES_PER_STEP, TILE_ELEMENTS // (block_h * block_c)))
    tile = block_e * block_h * block_c
    num_warps = 8 if tile >= 4096 else 4 if tile >= 2048 else 2 if tile >= 512 else 1
    return {"BLOCK_E": block_e, "BLOCK_H": block_h, "BLOCK_C": block_c, "num_warps": num_warps,
            "enable_fp_fusion": True}  # fmt: skip


@_jit
def _row_layout(heads, channels, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """The (BLOCK_H, BLOCK_C) offsets of one node's row of all heads, its mask, the head offsets and their mask."""
    head = tl.arange(0, BLOCK_H)
    chan = tl.arange(0, BLOCK_C)
    head_mask = head < heads
    row_at = head[:, None] * channels + chan[None, :]
    row_mask = head_mask[:, None] & (chan < channels)[None, :]
    return row_at, row_mask, head, head_mask


@_jit
def _incoming_tile(
    K, V, EMB, SRC, first, stop, batch, num_src, row_size, row_at, row_mask,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Incoming edges [first, first + BLOCK_E) of one destination (those before ``stop``) for one sample: the edge
    mask, the tile mask and embedding offsets, and keys + embedding, values + embedding, (BLOCK_E, BLOCK_H,
    BLOCK_C) in fp32."""
    edge = first + tl.arange(0, BLOCK_E)
    edge_mask = edge < stop
    tile_mask = edge_mask[:, None, None] & row_mask[None, :, :]
    source = tl.load(SRC + edge, mask=edge_mask, other=0)
    src_at = ((batch * num_src + source) * row_size)[:, None, None] + row_at[None, :, :]
    emb_at = (edge * row_size)[:, None, None] + row_at[None, :, :]
    emb = tl.load(EMB + emb_at, mask=tile_mask, other=0.0).to(tl.float32)
    key = tl.load(K + src_at, mask=tile_mask, other=0.0).to(tl.float32) + emb
    value = tl.load(V + src_at, mask=tile_mask, other=0.0).to(tl.float32) + emb
    return edge_mask, tile_mask, emb_at, key, value


@_jit
def forward_kernel(
    Q, K, V, EMB, DST_PTR, SRC, OUT, LSE, num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64)
    batch = tl.program_id(1).to(tl.int64)
    row_at, row_mask, head, head_mask = _row_layout(heads, channels, BLOCK_H, BLOCK_C)
    row_size = heads * channels
    row = batch * num_dst + node
    query = tl.load(Q + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
    start, stop = tl.load(DST_PTR + node), tl.load(DST_PTR + node + 1)
    running_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for first in range(start, stop, BLOCK_E):
        edge_mask, _, _, key, value = _incoming_tile(
            K, V, EMB, SRC, first, stop, batch, num_src, row_size, row_at, row_mask, BLOCK_E
        )
        score = tl.sum(key * query[None, :, :], axis=2) * scale
        score = tl.where(edge_mask[:, None], score, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(score, axis=0))
        weight = tl.exp(score - new_max[None, :])
        rescale = tl.exp(running_max - new_max)
        denom = denom * rescale + tl.sum(weight, axis=0)
        acc = acc * rescale[:, None] + tl.sum(weight[:, :, None] * value, axis=0)
        running_max = new_max
    has_edges = denom > 0.0
    safe_denom = tl.where(has_edges, denom, 1.0)
    tl.store(OUT + row * row_size + row_at, (acc / safe_denom[:, None]).to(OUT.dtype.element_ty), mask=row_mask)
    tl.store(LSE + row * heads + head, tl.where(has_edges, running_max + tl.log(safe_denom), 0.0), mask=head_mask)


@_jit
def backward_dst_kernel(
    Q, K, V, EMB, OUT, GRAD_OUT, LSE, DST_PTR, SRC, GRAD_Q, GRAD_EMB, DELTA,
    batch_size, num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64)
    row_at, row_mask, head, head_mask = _row_layout(heads, channels, BLOCK_H, BLOCK_C)
    row_size = heads * channels
    start, stop = tl.load(DST_PTR + node), tl.load(DST_PTR + node + 1)
    for batch in range(0, batch_size):
        row = batch * num_dst + node
        query = tl.load(Q + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
        grad_out = tl.load(GRAD_OUT + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
        out = tl.load(OUT + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
        delta = tl.sum(grad_out * out, axis=1)
        tl.store(DELTA + row * heads + head, delta, mask=head_mask)
        log_sum_exp = tl.load(LSE + row * heads + head, mask=head_mask, other=0.0)
        grad_query = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        for first in range(start, stop, BLOCK_E):
            edge_mask, tile_mask, emb_at, key, value = _incoming_tile(
                K, V, EMB, SRC, first, stop, batch, num_src, row_size, row_at, row_mask, BLOCK_E
            )
            score = tl.sum(key * query[None, :, :], axis=2) * scale
            valid = edge_mask[:, None] & head_mask[None, :]
            alpha = tl.where(valid, tl.exp(score - log_sum_exp[None, :]), 0.0)
            grad_score = alpha * (tl.sum(value * grad_out[None, :, :], axis=2) - delta[None, :])
            grad_query += scale * tl.sum(grad_score[:, :, None] * key, axis=0)
            grad_emb = scale * grad_score[:, :, None] * query[None, :, :] + alpha[:, :, None] * grad_out[None, :, :]
            grad_emb += tl.load(GRAD_EMB + emb_at, mask=tile_mask & (batch > 0), other=0.0)
            tl.store(GRAD_EMB + emb_at, grad_emb, mask=tile_mask)
        tl.store(GRAD_Q + row * row_size + row_at, grad_query.to(GRAD_Q.dtype.element_ty), mask=row_mask)


@_jit
def backward_src_kernel(
    Q, K, V, EMB, GRAD_OUT, LSE, DELTA, SRC_PTR, SRC_ORDER, SRC_ORDER_DST, GRAD_K, GRAD_V,
    num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    source = tl.program_id(0).to(tl.int64)
    batch = tl.program_id(1).to(tl.int64)
    row_at, row_mask, head, head_mask = _row_layout(heads, channels, BLOCK_H, BLOCK_C)
    row_size = heads * channels
    row = batch * num_src + source
    key = tl.load(K + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
    value = tl.load(V + row * row_size + row_at, mask=row_mask, other=0.0).to(tl.float32)
    start, stop = tl.load(SRC_PTR + source), tl.load(SRC_PTR + source + 1)
    grad_key = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    grad_value = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for first in range(start, stop, BLOCK_E):
        slot = first + tl.arange(0, BLOCK_E)
        edge_mask = slot < stop
        tile_mask = edge_mask[:, None, None] & row_mask[None, :, :]
        valid = edge_mask[:, None] & head_mask[None, :]
        edge = tl.load(SRC_ORDER + slot, mask=edge_mask, other=0)
        dst_row = batch * num_dst + tl.load(SRC_ORDER_DST + slot, mask=edge_mask, other=0)
        dst_at = (dst_row * row_size)[:, None, None] + row_at[None, :, :]
        stat_at = (dst_row * heads)[:, None] + head[None, :]
        emb = tl.load(EMB + (edge * row_size)[:, None, None] + row_at[None, :, :], mask=tile_mask, other=0.0)
        emb = emb.to(tl.float32)
        query = tl.load(Q + dst_at, mask=tile_mask, other=0.0).to(tl.float32)
        grad_out = tl.load(GRAD_OUT + dst_at, mask=tile_mask, other=0.0).to(tl.float32)
        log_sum_exp = tl.load(LSE + stat_at, mask=valid, other=0.0)
        delta = tl.load(DELTA + stat_at, mask=valid, other=0.0)
        score = tl.sum(query * (key[None, :, :] + emb), axis=2) * scale
        alpha = tl.where(valid, tl.exp(score - log_sum_exp), 0.0)
        grad_score = alpha * (tl.sum(grad_out * (value[None, :, :] + emb), axis=2) - delta)
        grad_key += scale * tl.sum(grad_score[:, :, None] * query, axis=0)
        grad_value += tl.sum(alpha[:, :, None] * grad_out, axis=0)
    tl.store(GRAD_K + row * row_size + row_at, grad_key.to(GRAD_K.dtype.element_ty), mask=row_mask)
    tl.store(GRAD_V + row * row_size + row_at, grad_value.to(GRAD_V.dtype.element_ty), mask=row_mask)
