"""Attention over blocks of queries, for the token mixers that cannot run in a fused kernel.

Talking heads (CaiT §2) mix attention logits and weights across heads, and GPSA's positional
attention (ConViT §3) is a heads × N × N map built from relative offsets: neither is a
``scaled_dot_product_attention`` call, so written out they keep several (B, heads, N, N)
maps for backward, which at detection inputs (N = 4,200 tokens) is gigabytes per block.

Here the same arithmetic runs over blocks of query rows, and backward recomputes a block's
maps from what is saved (q, k, v or the value columns, and the parameters), so no
N × N map outlives its block. A query row's softmax needs every key of that row and, with
talking heads, every head's logits of that row: blocks split queries, never keys or heads.
Outputs and gradients are those of the written-out path up to float rounding.

The written-out path stays faster where maps are small; :func:`use_blockwise` chooses, and
it is asked only while autograd records a graph outside ``torch.export`` (the memory at
stake is what backward keeps), so inference and export never branch on a symbolic token
count.
"""
from typing import Iterator, Optional

import torch
from torch.autograd.function import FunctionCtx

Grid = tuple[int, int]
#: elements of one query block's (B, heads, rows, N) map (64 MiB in float32); the rows of
#: a block are as many as fit, so matmuls stay large while the N × N map never exists
BLOCK_ELEMENTS = 1 << 24
#: token count from which the blockwise path is chosen while training; below it the
#: written-out maps are small and one large matmul per step is faster
#: (``benchmarks/benchmark_attention.py``, docs/memory.md)
MIN_BLOCKWISE_TOKENS = 2048


def use_blockwise(num_tokens: int, *tensors: torch.Tensor) -> bool:
    """Whether to take the blockwise path: autograd records a graph through ``tensors``
    outside ``torch.export`` and the token count is at least :data:`MIN_BLOCKWISE_TOKENS`.
    The token count is read only then, so an exported graph never guards on it."""
    if torch.compiler.is_exporting() or not (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return False
    return num_tokens >= MIN_BLOCKWISE_TOKENS


def query_blocks(num_queries: int, row_elements: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive query blocks whose maps hold ≤ BLOCK_ELEMENTS each."""
    rows = max(1, BLOCK_ELEMENTS // max(1, row_elements))
    for start in range(0, num_queries, rows):
        yield start, min(start + rows, num_queries)


def mix_heads(maps: torch.Tensor, weight: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A linear map across the heads of (B, heads, ...) maps (talking heads), as one
    batched matmul on the head-major layout: every map stays contiguous."""
    batch, heads = maps.shape[:2]
    flat = maps.reshape(batch, heads, -1)
    weight = weight.to(flat.dtype).expand(batch, -1, -1)
    if bias is None:
        mixed = torch.bmm(weight, flat)
    else:
        mixed = torch.baddbmm(bias.to(flat.dtype).view(1, heads, 1), weight, flat)
    return mixed.view(maps.shape)


def _head_mix_grad(grad: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
    """d(weight) of :func:`mix_heads` summed over the batch: Σ_b grad_b · maps_bᵀ."""
    batch, heads = maps.shape[:2]
    return (grad.reshape(batch, heads, -1) @ maps.reshape(batch, heads, -1).transpose(1, 2)
            ).sum(0)


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over keys in float32 (as autocast does for softmax), in the logits' dtype."""
    return logits.float().softmax(dim=-1).to(logits.dtype)


def _softmax_grad(grad: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Gradient through a softmax over the last dim, from its output, in float32."""
    return torch.ops.aten._softmax_backward_data(grad.float(), probs.float(), -1,
                                                 torch.float32).to(probs.dtype)


class TalkingHeadsFunction(torch.autograd.Function):
    """Talking-heads attention (CaiT §2) over query blocks: per block
    ``S = (q·scale) kᵀ, L = mix_l(S), P = softmax(L), W = mix_w(P), out = W v``."""

    @staticmethod
    def _block_maps(q_block: torch.Tensor, k: torch.Tensor, scale: float,
                    params: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        w_logits, b_logits, w_weights, b_weights = params
        scores = q_block * scale @ k.transpose(-2, -1)
        probs = _softmax(mix_heads(scores, w_logits, b_logits))
        return scores, probs, mix_heads(probs, w_weights, b_weights)

    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                w_logits: torch.Tensor, b_logits: torch.Tensor, w_weights: torch.Tensor,
                b_weights: torch.Tensor, scale: float) -> torch.Tensor:
        batch, heads, num_queries, _ = q.shape
        params = (w_logits, b_logits, w_weights, b_weights)
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        for start, stop in query_blocks(num_queries, batch * heads * k.shape[-2]):
            weights = TalkingHeadsFunction._block_maps(q[:, :, start:stop], k, scale, params)[2]
            out[:, :, start:stop] = weights @ v
        ctx.save_for_backward(q, k, v, *params)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        q, k, v, *params = ctx.saved_tensors
        w_logits, _, w_weights, _ = params
        scale = ctx.scale
        batch, heads, num_queries, _ = q.shape
        grad_out = grad_out.to(v.dtype)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dw_logits = torch.zeros(heads, heads, dtype=torch.float32, device=q.device)
        db_logits = torch.zeros(heads, dtype=torch.float32, device=q.device)
        dw_weights, db_weights = torch.zeros_like(dw_logits), torch.zeros_like(db_logits)
        for start, stop in query_blocks(num_queries, batch * heads * k.shape[-2]):
            q_block, g_block = q[:, :, start:stop], grad_out[:, :, start:stop]
            scores, probs, weights = TalkingHeadsFunction._block_maps(q_block, k, scale, params)
            dv += weights.transpose(-2, -1) @ g_block
            d_weights = g_block @ v.transpose(-2, -1)
            dw_weights += _head_mix_grad(d_weights, probs).float()
            db_weights += d_weights.sum((0, 2, 3), dtype=torch.float32)
            d_logits = _softmax_grad(mix_heads(d_weights, w_weights.t()), probs)
            dw_logits += _head_mix_grad(d_logits, scores).float()
            db_logits += d_logits.sum((0, 2, 3), dtype=torch.float32)
            d_scores = mix_heads(d_logits, w_logits.t())
            dq[:, :, start:stop] = d_scores @ k * scale
            dk += d_scores.transpose(-2, -1) @ (q_block * scale)
        grads = (dq, dk, dv, dw_logits, db_logits, dw_weights, db_weights)
        inputs = (q, k, v, *params)
        return (*(g.to(t.dtype) if need else None
                  for g, t, need in zip(grads, inputs, ctx.needs_input_grad)), None)


def talking_heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            mix_logits: torch.nn.Linear, mix_weights: torch.nn.Linear,
                            scale: float) -> torch.Tensor:
    """Talking-heads attention of (B, heads, Nq, d) queries over (B, heads, N, d) keys and
    values, never keeping a (B, heads, Nq, N) map for backward."""
    return TalkingHeadsFunction.apply(q, k, v, mix_logits.weight, mix_logits.bias,
                                      mix_weights.weight, mix_weights.bias, scale)


def _row_col(token: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of row-major token indices; the column as ``token - row * cols``, since
    ONNX export has no remainder by a size known only at run time."""
    row = torch.div(token, cols, rounding_mode='floor')
    return row, token - row * cols


def relative_offsets(hw: Grid, start: int, stop: int, device: torch.device,
                     dtype: torch.dtype) -> torch.Tensor:
    """(stop - start, N, 3) offsets (dx, dy, dx²+dy²) from query patches start..stop-1 to
    every key patch of a rows × cols grid, in row-major token order."""
    rows, cols = hw
    key_row, key_col = _row_col(torch.arange(rows * cols, device=device), cols)
    query_row, query_col = _row_col(torch.arange(start, stop, device=device), cols)
    dx = (key_col[None, :] - query_col[:, None]).to(dtype)
    dy = (key_row[None, :] - query_row[:, None]).to(dtype)
    return torch.stack([dx, dy, dx ** 2 + dy ** 2], dim=-1)


def positional_logits(hw: Grid, start: int, stop: int, weight: torch.Tensor,
                      bias: torch.Tensor) -> torch.Tensor:
    """(heads, stop - start, N) positional logits of GPSA for query patches start..stop-1,
    with the offsets of those rows only, and the offsets."""
    offsets = relative_offsets(hw, start, stop, weight.device, weight.dtype).view(-1, 3)
    logits = torch.addmm(bias[:, None], weight, offsets.t())
    return logits.view(weight.shape[0], stop - start, -1), offsets


class PositionalAttentionFunction(torch.autograd.Function):
    """GPSA's positional attention applied to values (ConViT §3) over query blocks:
    ``softmax(W · offsets + b) @ columns`` with (heads, N, M) value columns, the offsets
    and the (heads, N, N) map built per block and again in backward."""

    @staticmethod
    def forward(ctx: FunctionCtx, columns: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor, hw: Grid) -> torch.Tensor:
        heads, num_tokens, _ = columns.shape
        out = torch.empty_like(columns)
        for start, stop in query_blocks(num_tokens, heads * num_tokens):
            probs = positional_logits(hw, start, stop, weight, bias)[0].float().softmax(-1)
            out[:, start:stop] = probs.to(columns.dtype) @ columns
        ctx.save_for_backward(columns, weight, bias)
        ctx.hw = hw
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        columns, weight, bias = ctx.saved_tensors
        heads, num_tokens, _ = columns.shape
        grad_out = grad_out.to(columns.dtype)
        d_columns = torch.zeros_like(columns)
        d_weight, d_bias = torch.zeros_like(weight), torch.zeros_like(bias)
        for start, stop in query_blocks(num_tokens, heads * num_tokens):
            logits, offsets = positional_logits(ctx.hw, start, stop, weight, bias)
            probs = logits.float().softmax(dim=-1)
            g_block = grad_out[:, start:stop]
            d_columns += probs.transpose(-2, -1).to(columns.dtype) @ g_block
            d_probs = (g_block @ columns.transpose(-2, -1)).to(probs.dtype)
            d_logits = torch.ops.aten._softmax_backward_data(d_probs, probs, -1, probs.dtype)
            d_weight += (d_logits.reshape(heads, -1) @ offsets.float()).to(weight.dtype)
            d_bias += d_logits.sum((1, 2)).to(bias.dtype)
        needs = ctx.needs_input_grad
        return (d_columns if needs[0] else None, d_weight if needs[1] else None,
                d_bias if needs[2] else None, None)


def positional_attention_values(columns: torch.Tensor, pos_proj: torch.nn.Linear,
                                hw: Grid) -> torch.Tensor:
    """GPSA's positional attention on (heads, N, M) value columns, never keeping the
    (heads, N, N) map or the (N, N, 3) offsets for backward."""
    return PositionalAttentionFunction.apply(columns, pos_proj.weight, pos_proj.bias, hw)
