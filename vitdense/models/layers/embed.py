"""Patch embeddings (linear, XCiT's conv stem, the hMLP stem) and position encodings
(learned absolute tables resampled to any grid, XCiT's Fourier features)."""
import math
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .grid import Grid
from .norm import LayerNorm2d


class PatchEmbed(nn.Module):
    """Non-overlapping patches by a p×p, stride-p convolution (ViT §3.1).

    Tokens come out contiguous: in the conv's (C, N) layout the residual stream would keep
    that layout through every add, and each LayerNorm would copy it.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2).contiguous(), (x.shape[2], x.shape[3])


def _conv3x3_bn(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, 2, 1, bias=False),
                         nn.BatchNorm2d(out_channels))


class ConvPatchEmbed(nn.Module):
    """XCiT's stem: log2(p) stride-2 3×3 conv+BN layers with GELU, widths doubling up to
    ``embed_dims`` (XCiT §3.2); ``proj`` indices match the official checkpoints. Each conv
    pads by one pixel, so any input size works: every conv halves it, rounding up."""

    #: the stem pads its input itself (a backbone may feed it images of any size)
    pads_input = True

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int) -> None:
        super().__init__()
        if patch_size not in (8, 16):
            raise ValueError(f'XCiT conv patch embedding supports patch_size 8 or 16, '
                             f'got {patch_size}')
        num_convs = int(math.log2(patch_size))
        widths = [in_channels] + [embed_dims // 2 ** i for i in range(num_convs - 1, -1, -1)]
        layers: list[nn.Module] = []
        for i in range(num_convs):
            if i:
                layers.append(nn.GELU())
            layers.append(_conv3x3_bn(widths[i], widths[i + 1]))
        self.proj = nn.Sequential(*layers)

    forward = PatchEmbed.forward


class HMLPPatchEmbed(nn.Module):
    """Hierarchical MLP stem ("Three things", §5 and Appendix C): sub-patches of 4×4, then
    2×2 merges, each a linear map (a conv with kernel = stride) + norm (+ GELU), so that
    patches never interact. ``norm`` is 'BN' (the paper's choice) or 'LN'."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int,
                 norm: str = 'BN') -> None:
        super().__init__()
        kernels = {16: (4, 2, 2), 8: (2, 2, 2)}.get(patch_size)
        if kernels is None:
            raise ValueError(f'hMLP stem supports patch_size 8 or 16, got {patch_size}')
        if norm not in ('BN', 'LN'):
            raise ValueError(f"hMLP stem norm must be 'BN' or 'LN', got {norm!r}")
        norm_layer = nn.BatchNorm2d if norm == 'BN' else (lambda c: LayerNorm2d(c, eps=1e-6))
        widths = (in_channels, embed_dims // 4, embed_dims // 4, embed_dims)
        layers: list[nn.Module] = []
        for i, kernel in enumerate(kernels):
            layers += [nn.Conv2d(widths[i], widths[i + 1], kernel, stride=kernel),
                       norm_layer(widths[i + 1])]
            if i < len(kernels) - 1:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    forward = PatchEmbed.forward


#: the position kernel's offset is saved in these units (``LearnedPositionEmbedding.kernel``)
KERNEL_OFFSET_UNITS = 1_000_000


class PositionKernel(NamedTuple):
    """How a library resamples a position table to another grid: bicubic with or without
    antialiasing, and DINO's scale-factor offset (:func:`resample_position_table`)."""
    antialias: bool = True
    offset: float = 0.

    def as_tensor(self) -> torch.Tensor:
        """The kernel as saved: (antialias, offset in ``KERNEL_OFFSET_UNITS``), integers,
        which no dtype cast of a model rounds."""
        units = round(self.offset * KERNEL_OFFSET_UNITS)
        if units / KERNEL_OFFSET_UNITS != self.offset:
            raise ValueError(f'position kernel offset {self.offset} is not a multiple of '
                             f'1/{KERNEL_OFFSET_UNITS}: a saved kernel would not keep it')
        return torch.tensor([int(self.antialias), units])

    @classmethod
    def from_tensor(cls, saved: torch.Tensor) -> 'PositionKernel':
        """The kernel :meth:`as_tensor` saved."""
        antialias, units = saved.tolist()
        return cls(bool(antialias), units / KERNEL_OFFSET_UNITS)

    def __str__(self) -> str:
        kernel = 'bicubic with antialiasing' if self.antialias else 'plain bicubic'
        return f"{kernel}{f', scale factor offset by {self.offset}' if self.offset else ''}"


def _interpolation_matrix(old: int, new: int, antialias: bool, device: torch.device,
                          dtype: torch.dtype, offset: float = 0.) -> torch.Tensor:
    """(new, old) weights of bicubic resampling along one axis, as timm's
    ``resample_abs_pos_embed`` does it (``align_corners=False``): the identity resampled.
    ``offset``: DINO's resampling, which gives ``F.interpolate`` the scale factor
    ``(new + offset) / old`` instead of the size, so sources are read at a slightly other
    pitch (DINOv2's hub models without registers: 0.1)."""
    resize = dict(scale_factor=((new + offset) / old, 1.)) if offset else dict(size=(new, old))
    with torch.no_grad():
        # column c: row c's unit
        basis = torch.eye(old, device=device, dtype=dtype).view(1, 1, old, old)
        return F.interpolate(basis, mode='bicubic', antialias=antialias, align_corners=False,
                             **resize)[0, 0]


def resample_position_table(table: torch.Tensor, old: Grid, new: Grid, num_prefix_tokens: int,
                            antialias: bool = True, offset: float = 0.) -> torch.Tensor:
    """A (1, prefix + rows·cols, C) position table of grid ``old`` resampled to grid ``new``
    as timm's ``resample_abs_pos_embed`` does (bicubic, prefix rows kept), written as one
    interpolation matrix per axis applied by matmuls (bicubic is separable). The one
    resampling of the package: eager, compiled (any symbolic grid, with its backward) and
    exported runs take the same operations and round alike; it equals timm's up to float
    rounding, and is exact where ``new == old`` (identity matrices). It computes in the
    table's dtype, float32 at least (float64 tables resample as precisely as they hold).
    ``offset``: DINO's scale-factor offset on both axes (:func:`_interpolation_matrix`)
    wherever the grid changes; DINO's code returns the table unchanged at its own grid, and
    so does this."""
    offset = offset if offset and tuple(new) != tuple(old) else 0.
    dtype = torch.promote_types(table.dtype, torch.float32)
    rows, cols = (_interpolation_matrix(o, n, antialias, table.device, dtype, offset)
                  for o, n in zip(old, new))
    prefix, patches = table[:, :num_prefix_tokens], table[:, num_prefix_tokens:]
    dims = patches.shape[-1]
    grid = patches.to(dtype).reshape(old[0], old[1] * dims)
    resampled = cols @ (rows @ grid).reshape(new[0], old[1], dims)  # (rows, cols, C)
    return torch.cat([prefix, resampled.reshape(1, -1, dims).to(table.dtype)], dim=1)


class LearnedPositionEmbedding(nn.Module):
    """Learned absolute position table (ViT §3.1) for ``num_prefix_tokens`` + a grid of
    patches. It is resampled (bicubic, :func:`resample_position_table`) to the token grid
    of every input (at its own grid by identity matrices: one graph for every size, eager,
    compiled and exported alike), and a table of another square grid is resampled to this
    one when loaded: in a ``load_state_dict`` pre-hook as mmpretrain does, so that whole-
    model loads (a classifier fine-tuned at another resolution) get it too. A table that is
    no square grid raises, as torch does for any tensor of another shape.

    ``checkpoint_prefix_tokens``: prefix rows of the family's checkpoints; those beyond
    ``num_prefix_tokens`` are dropped on load (ViTDet's dense ViT has no class token).
    ``unpositioned_prefix_tokens``: leading tokens (class token, registers) the table has no
    rows for and that pass unchanged (timm's ``no_embed_class``: DeiT III, DINOv2).
    ``antialias``: resampling, at load and to the input's grid, with antialiasing (timm) or
    plain bicubic (ViTDet, mmpretrain, mmseg); ``offset``: DINO's scale-factor offset
    (:func:`resample_position_table`; DINOv2's hub models without registers: 0.1). The kernel
    changes the forward at every other grid, so it is state: the ``kernel`` buffer, saved and
    loaded with the table (:meth:`use_kernel`); a state dict without it (saved before it
    existed) leaves the module's kernel as it is."""

    def __init__(self, embed_dims: int, grid: Grid, num_prefix_tokens: int = 0,
                 checkpoint_prefix_tokens: int = 0, antialias: bool = True,
                 unpositioned_prefix_tokens: int = 0, offset: float = 0.) -> None:
        super().__init__()
        if unpositioned_prefix_tokens and num_prefix_tokens:
            raise ValueError('a table has rows for all prefix tokens or for none: '
                             'num_prefix_tokens and unpositioned_prefix_tokens exclude each other')
        self.unpositioned_prefix_tokens = unpositioned_prefix_tokens
        self.grid = tuple(grid)
        self.num_prefix_tokens = num_prefix_tokens
        self.checkpoint_prefix_tokens = max(checkpoint_prefix_tokens, num_prefix_tokens)
        self.weight = nn.Parameter(
            torch.zeros(1, num_prefix_tokens + grid[0] * grid[1], embed_dims))
        nn.init.trunc_normal_(self.weight, std=.02)
        #: the kernel as saved (:meth:`PositionKernel.as_tensor`); the forward reads the
        #: plain attributes it mirrors (a graph constant)
        self.register_buffer('kernel', torch.zeros(2, dtype=torch.int64))
        self.use_kernel(PositionKernel(antialias, offset))
        #: the table's grid as saved (rows, cols): a table's rows alone show no grid that is
        #: not square (a model trained at 320 x 800)
        self.register_buffer('table_grid', torch.tensor(self.grid, dtype=torch.int64))
        self._register_load_state_dict_pre_hook(self._resample_checkpoint)

    def use_kernel(self, kernel: PositionKernel) -> None:
        """Resample with ``kernel`` from now on, and save it with the table."""
        saved = kernel.as_tensor()
        self.antialias, self.offset = bool(kernel.antialias), float(kernel.offset)
        with torch.no_grad():
            self.kernel.copy_(saved)

    @property
    def position_kernel(self) -> PositionKernel:
        return PositionKernel(self.antialias, self.offset)

    def checkpoint_grid(self, table: torch.Tensor, saved_grid: Optional[torch.Tensor] = None
                        ) -> Optional[Grid]:
        """The grid of a checkpoint's table: its saved ``table_grid`` (ours), else this
        module's where it has the module's rows, else the square grid of its rows after the
        prefix rows (every library's tables are square); None where its rows hold no such
        grid."""
        if saved_grid is not None and not saved_grid.is_meta:
            return tuple(saved_grid.tolist())
        if table.shape[1] == self.weight.shape[1]:
            return self.grid
        for prefix in (self.checkpoint_prefix_tokens, self.num_prefix_tokens):
            side = math.isqrt(max(table.shape[1] - prefix, 0))
            if side * side == table.shape[1] - prefix:
                return side, side
        return None

    def _resample_checkpoint(self, state_dict: dict, prefix: str, *args) -> None:
        saved_kernel = state_dict.get(prefix + 'kernel')
        if saved_kernel is None:
            state_dict[prefix + 'kernel'] = self.kernel.detach().clone()
        elif not saved_kernel.is_meta:  # a meta state dict (a dry run) holds no kernel
            self.use_kernel(PositionKernel.from_tensor(saved_kernel))
        key = prefix + 'weight'
        table = state_dict.get(key)
        saved_grid = state_dict.pop(prefix + 'table_grid', None)
        state_dict[prefix + 'table_grid'] = self.table_grid.detach().clone()
        if table is None:
            return
        grid = self.checkpoint_grid(table, saved_grid)
        rows = table.shape[1] - (grid[0] * grid[1] if grid else 0)
        if grid and rows == self.checkpoint_prefix_tokens > self.num_prefix_tokens:
            table = torch.cat([table[:, :self.num_prefix_tokens],
                               table[:, self.checkpoint_prefix_tokens:]], 1)
            rows = self.num_prefix_tokens
        if not grid or rows != self.num_prefix_tokens or table.shape[-1] != self.weight.shape[-1]:
            raise ValueError(
                f'{key}: checkpoint table of shape {tuple(table.shape)} cannot be resampled to '
                f'{tuple(self.weight.shape)} ({self.num_prefix_tokens} prefix tokens + a grid '
                f'of width {self.weight.shape[-1]} expected: a square one, or the '
                f'table_grid saved with it)')
        state_dict[key] = table if grid == self.grid else resample_position_table(
            table, grid, self.grid, self.num_prefix_tokens, self.antialias, self.offset)

    def forward(self, tokens: torch.Tensor, hw: Grid) -> torch.Tensor:
        table = resample_position_table(self.weight, self.grid, hw, self.num_prefix_tokens,
                                        self.antialias, self.offset)
        skip = self.unpositioned_prefix_tokens
        if skip:
            return torch.cat([tokens[:, :skip], tokens[:, skip:] + table], dim=1)
        return tokens + table


class FourierPositionEncoding(nn.Module):
    """XCiT's position encoding (§3.2): sinusoidal features of the normalised (y, x) patch
    coordinates (``hidden_dim`` each) projected by a 1×1 conv; defined for any grid."""

    def __init__(self, embed_dims: int, hidden_dim: int = 32,
                 temperature: float = 10000.) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.token_projection = nn.Conv2d(hidden_dim * 2, embed_dims, kernel_size=1)

    def _sinusoids(self, hw: Grid, device: torch.device) -> torch.Tensor:
        """(1, 2·hidden_dim, rows, cols) features, built from the grid in every forward: a
        few thousand sines, and the same graph serves any input size once exported."""
        eps, scale = 1e-6, 2 * math.pi
        rows = torch.arange(1, hw[0] + 1, device=device, dtype=torch.float32)
        cols = torch.arange(1, hw[1] + 1, device=device, dtype=torch.float32)
        rows = rows / (rows[-1:] + eps) * scale
        cols = cols / (cols[-1:] + eps) * scale
        steps = torch.arange(self.hidden_dim, device=device, dtype=torch.float32)
        freqs = self.temperature ** (2 * torch.div(steps, 2, rounding_mode='floor')
                                     / self.hidden_dim)

        def encode(coords: torch.Tensor) -> torch.Tensor:
            angles = coords[:, None] / freqs
            return torch.stack([angles[:, 0::2].sin(), angles[:, 1::2].cos()], dim=2).flatten(1)

        pos_y = encode(rows)[:, None, :].expand(-1, hw[1], -1)
        pos_x = encode(cols)[None, :, :].expand(hw[0], -1, -1)
        return torch.cat([pos_y, pos_x], dim=2).permute(2, 0, 1)[None].contiguous()

    def forward(self, tokens: torch.Tensor, hw: Grid) -> torch.Tensor:
        features = self._sinusoids(hw, tokens.device).to(self.token_projection.weight.dtype)
        encoding = self.token_projection(features).flatten(2).transpose(1, 2)
        return tokens + encoding
