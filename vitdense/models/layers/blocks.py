"""Residual blocks shared by the four families.

A :class:`TransformerBlock` is ``x + drop_path(ls(mixer(norm(x))))`` followed by the same
with an FFN; the token mixer (self-attention, talking heads, XCA, GPSA) is passed in, XCiT
adds its local patch interaction (LPI) in between, and "Three things" parallel blocks use
``num_branches > 1``. Class-attention blocks (CaiT §3, XCiT) update the class token only.

When no gradient is needed (inference, frozen blocks), residual sums, LayerScale and GELU
write into the fresh output of the sub-block that feeds them instead of allocating a new
token buffer: the same values bit for bit, less memory traffic (see ``docs/benchmarks.md``).
"""
from typing import Optional

import torch
import torch.nn as nn
from timm.layers import DropPath

from .attention import ClassAttention
from .branched import make_layer_norm, make_linear
from .grid import Grid
from .window_attention import window_attention

NORM_EPS = 1e-6


def _no_grad_needed(*tensors: torch.Tensor) -> bool:
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def residual_add(x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """``x + branch``; written into ``branch`` (a sub-block's fresh output, never read
    again) when no gradient is needed. IEEE addition commutes, so the sum is the same."""
    return branch.add_(x) if _no_grad_needed(x, branch) else x + branch


class GELU(nn.GELU):
    """Exact GELU that overwrites its input when no gradient is needed: it only follows a
    linear or conv layer here, whose output nothing else reads."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.gelu_(x) if _no_grad_needed(x) else super().forward(x)


class QuickGELU(nn.Module):
    """``x · sigmoid(1.702 x)``: the GELU approximation OpenAI's CLIP models were trained
    with (timm's ``quick_gelu``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


#: the FFN activations by timm's names (``act_layer``)
ACTIVATIONS = {'gelu': GELU, 'quick_gelu': QuickGELU}


class LayerScale(nn.Module):
    """Per-channel residual scaling initialised to a small ``init_value`` (CaiT §2).

    ``inplace``: scale the input itself when no gradient is needed (for a residual branch's
    fresh output, as in our blocks).
    """

    def __init__(self, dim: int, init_value: float, num_branches: int = 1,
                 inplace: bool = False) -> None:
        super().__init__()
        shape = (dim,) if num_branches == 1 else (num_branches, 1, 1, dim)
        self.gamma = nn.Parameter(torch.full(shape, float(init_value)))
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace and _no_grad_needed(x, self.gamma):
            return x.mul_(self.gamma)
        return x * self.gamma


class FeedForward(nn.Module):
    """Two-layer MLP with GELU, or another of ``ACTIVATIONS`` (one per branch when
    ``num_branches > 1``)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.,
                 num_branches: int = 1, act_layer: str = 'gelu') -> None:
        super().__init__()
        if act_layer not in ACTIVATIONS:
            raise ValueError(f'unknown act_layer {act_layer!r}; expected one of '
                             f'{sorted(ACTIVATIONS)}')
        self.fc1 = make_linear(dim, hidden_dim, True, num_branches)
        self.act = ACTIVATIONS[act_layer]()
        self.drop = nn.Dropout(drop)
        self.fc2 = make_linear(hidden_dim, dim, True, num_branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LocalPatchInteraction(nn.Module):
    """XCiT's LPI: depth-wise 3×3 conv, GELU, BN, depth-wise 3×3 conv on the token grid.

    Tokens (B, N, C) are viewed as a channels-last map without a copy: depth-wise convs
    are much faster on CPU in that layout, which a transpose would lose at batch 1.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = GELU()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        batch, num_tokens, dim = x.shape
        x = x.reshape(batch, *hw, dim).permute(0, 3, 1, 2)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.permute(0, 2, 3, 1).reshape(batch, num_tokens, dim)


def _layer_scale(dim: int, init_value: Optional[float], num_branches: int = 1) -> nn.Module:
    """LayerScale of a residual branch (in place: its input is the branch's fresh output)."""
    if init_value is None:
        return nn.Identity()
    return LayerScale(dim, init_value, num_branches, inplace=True)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: token mixer, optional LPI, FFN.

    Args:
        dim: token width.
        token_mixer: module mapping (tokens, hw) -> tokens.
        mlp_ratio: FFN hidden width / dim.
        layer_scale: LayerScale init value, or None for no LayerScale.
        drop_path: stochastic depth rate of this block.
        local_patch_interaction: add XCiT's LPI sub-block.
        num_branches: parallel branches; the mixer must be built with the same number.
        window_size: > 0: the token mixer attends within windows of this many tokens a side
            (ViTDet), the grid zero-padded to a multiple of it.
        norm_eps: epsilon of the LayerNorms (1e-6 as timm; mmseg's ViTs train with 1e-5).
        mlp: the FFN (default: :class:`FeedForward` of ``mlp_ratio``), e.g. a SwiGLU.
        res_post_norm: normalise each branch's output instead of its input,
            ``x + drop_path(ls(norm(branch(x))))`` (Swin V2's res-post-norm, §3.1; timm's
            ``ResPostBlock``); each branch is then registered before its norm, so the keys
            are saved in timm's order, which shows it.
    """

    def __init__(self, dim: int, token_mixer: nn.Module, mlp_ratio: float = 4.,
                 layer_scale: Optional[float] = None, drop_path: float = 0., drop: float = 0.,
                 local_patch_interaction: bool = False, num_branches: int = 1,
                 window_size: int = 0, norm_eps: float = NORM_EPS,
                 mlp: Optional[nn.Module] = None, res_post_norm: bool = False) -> None:
        super().__init__()
        if window_size < 0:
            raise ValueError(f'window_size must be >= 0, got {window_size}')
        if window_size and num_branches > 1:
            raise ValueError('window attention does not support parallel branches')
        if res_post_norm and (num_branches > 1 or local_patch_interaction):
            raise ValueError('res_post_norm normalises the output of a single attention and '
                             'FFN branch: it does not combine with parallel branches or the '
                             'local patch interaction')
        self.num_branches = num_branches
        self.window_size = window_size
        self.res_post_norm = res_post_norm
        mlp = mlp if mlp is not None else FeedForward(dim, int(dim * mlp_ratio), drop,
                                                      num_branches)
        if res_post_norm:  # each branch before its norm: saved in that order, as timm's
            self.attn = token_mixer
        self.norm1 = make_layer_norm(dim, norm_eps, num_branches)
        self.attn = token_mixer
        self.ls1 = _layer_scale(dim, layer_scale, num_branches)
        if local_patch_interaction:
            self.norm_lpi = nn.LayerNorm(dim, eps=norm_eps)
            self.lpi = LocalPatchInteraction(dim)
            self.ls_lpi = _layer_scale(dim, layer_scale)
        else:
            self.lpi = None
        if res_post_norm:
            self.mlp = mlp
        self.norm2 = make_layer_norm(dim, norm_eps, num_branches)
        self.mlp = mlp
        self.ls2 = _layer_scale(dim, layer_scale, num_branches)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _merge_branches(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.num_branches == 1 else x.sum(0)

    def _branch_input(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A branch's input: normalised in a pre-norm block."""
        return x if self.res_post_norm else norm(x)

    def _branch_output(self, norm: nn.Module, y: torch.Tensor) -> torch.Tensor:
        """A branch's output: normalised in a res-post-norm block."""
        return norm(y) if self.res_post_norm else y

    def _local_patch_interaction(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """The LPI's residual on the patch tokens (the last rows·cols); the tokens before
        them (EoMT's queries) have no place on the grid and pass unchanged, as XCiT keeps
        its class token out of the LPI."""
        num_prefix = x.shape[-2] - hw[0] * hw[1]
        patches = x[..., num_prefix:, :]
        patches = residual_add(patches, self.drop_path(self.ls_lpi(
            self.lpi(self.norm_lpi(patches), hw))))
        return torch.cat([x[..., :num_prefix, :], patches], dim=-2) if num_prefix else patches

    def forward(self, x: torch.Tensor, hw: Grid, num_queries: Optional[int] = None,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Update all tokens or, with ``num_queries``, only the first ones (a classifier's
        class token in its last block): the others are keys and values and are not
        returned, which spares the FFN and most of the attention for them. ``attn_mask``:
        which tokens each of the first M tokens attends to, (B, M, N) boolean, for token
        mixers that take one (EoMT's masked attention)."""
        normed = self._branch_input(self.norm1, x)
        if attn_mask is not None:
            if self.window_size or num_queries is not None:
                raise ValueError('an attention mask is over the whole token sequence: it '
                                 'does not combine with window attention or num_queries')
            mixed = self.attn(normed, hw, attn_mask=attn_mask)
        elif num_queries is None and self.window_size:
            mixed = window_attention(self.attn, normed, hw, self.window_size)
        elif num_queries is None:
            mixed = self.attn(normed, hw)
        elif self.lpi is not None:
            raise ValueError('the local patch interaction needs every token: '
                             'num_queries is not supported with it')
        else:
            mixed = self.attn(normed, hw, num_queries=num_queries)
            x = x[..., :num_queries, :]
        mixed = self._branch_output(self.norm1, mixed)
        x = residual_add(x, self.drop_path(self._merge_branches(self.ls1(mixed))))
        if self.lpi is not None:
            x = self._local_patch_interaction(x, hw)
        ffn = self._branch_output(self.norm2, self.mlp(self._branch_input(self.norm2, x)))
        return residual_add(x, self.drop_path(self._merge_branches(self.ls2(ffn))))


class ClassAttentionBlock(nn.Module):
    """CaiT class-attention block: the class token attends to itself and the (frozen) patch
    tokens, then goes through an FFN. Returns the updated (class token, patch tokens)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.,
                 layer_scale: Optional[float] = None, qkv_bias: bool = True,
                 drop_path: float = 0., norm_eps: float = NORM_EPS) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = ClassAttention(dim, num_heads, qkv_bias)
        self.ls1 = _layer_scale(dim, layer_scale)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio))
        self.ls2 = _layer_scale(dim, layer_scale)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, cls_token: torch.Tensor,
                tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([cls_token, tokens], dim=1)
        cls_token = residual_add(cls_token, self.drop_path(self.ls1(self.attn(self.norm1(x)))))
        cls_token = residual_add(cls_token,
                                 self.drop_path(self.ls2(self.mlp(self.norm2(cls_token)))))
        return cls_token, tokens


class XCiTClassAttentionBlock(ClassAttentionBlock):
    """XCiT's class-attention block, wired as in the official code: the patch tokens also
    take the normalised-token residual, and the FFN residual starts from the normalised
    class token (all tokens normalised when ``tokens_norm``). Kept for weight compatibility.
    """

    def __init__(self, *args, tokens_norm: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens_norm = tokens_norm

    def forward(self, cls_token: torch.Tensor,
                tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([cls_token, tokens], dim=1)
        normed = self.norm1(x)
        x = residual_add(
            x, self.drop_path(self.ls1(torch.cat([self.attn(normed), normed[:, 1:]], dim=1))))
        if self.tokens_norm:
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        x = residual_add(
            x, self.drop_path(torch.cat([self.ls2(self.mlp(x[:, :1])), x[:, 1:]], dim=1)))
        return x[:, :1], x[:, 1:]
