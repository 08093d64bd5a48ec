"""ViT-Adapter's modules (Chen et al., ICLR 2023, §3): a convolutional spatial prior beside
the transformer, and injectors / extractors exchanging features with it through multi-scale
deformable attention (Zhu et al. 2021, Deformable DETR, §4.1).

The deformable sampling is :func:`~vitdense.models.layers.deformable_sampling.
deformable_sampling` (the compiled kernel's arithmetic in torch, the one the served
``ms_deform_attn`` op computes), so no compiled op is needed on any device. Every level's
shape is taken from the maps themselves, so inputs of any size work (the official code
assumes multiples of 32). Parameter names follow the official release, so its checkpoints
map one to one (``tools/model_converters/vit_adapter_official.py``).
"""
import math
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn as nn
from timm.layers import DropPath
from torch.utils.checkpoint import checkpoint

from .deformable_sampling import deformable_sampling, level_sizes
from .norm import build_norm2d

#: LayerNorm epsilon of the injectors and extractors (the official release's)
ADAPTER_NORM_EPS = 1e-6

Shapes = Sequence[tuple[int, int]]


def reference_points(shapes: Shapes, device: torch.device) -> torch.Tensor:
    """Pixel centres of every level's grid, normalised to [0, 1] as (x, y):
    (1, sum of h·w, 1, 2), the levels one after another."""
    points = []
    for h, w in shapes:
        ys = (torch.arange(h, device=device, dtype=torch.float32) + .5) / h
        xs = (torch.arange(w, device=device, dtype=torch.float32) + .5) / w
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
        points.append(torch.stack((grid_x.reshape(-1), grid_y.reshape(-1)), -1))
    return torch.cat(points)[None, :, None]


class MultiScaleDeformableAttention(nn.Module):
    """Each query attends to ``num_points`` points per head and level around its reference
    point, at offsets and with weights predicted from the query (Zhu et al. 2021, Eq. 3).

    Args:
        dims: width of queries and values.
        num_levels: levels of the value maps.
        num_heads: attention heads.
        num_points: sampling points per head and level.
        value_ratio: the value projection's width as a share of ``dims`` (ViT-Adapter's
            ``deform_ratio``).
    """

    def __init__(self, dims: int, num_levels: int, num_heads: int, num_points: int,
                 value_ratio: float = 1.0) -> None:
        super().__init__()
        value_dims = int(dims * value_ratio)
        if value_dims % num_heads:
            raise ValueError(f'the value width {value_dims} (dims {dims} × ratio '
                             f'{value_ratio}) must divide into {num_heads} heads')
        self.num_levels, self.num_heads, self.num_points = num_levels, num_heads, num_points
        self.sampling_offsets = nn.Linear(dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(dims, value_dims)
        self.output_proj = nn.Linear(value_dims, dims)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: head h's points start on a ring in direction 2πh/heads,
        point k at distance k + 1; uniform weights; Xavier projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2 * math.pi /
                                                                      self.num_heads)
        directions = torch.stack([angles.cos(), angles.sin()], -1)
        directions = directions / directions.abs().max(-1, keepdim=True)[0]
        distance = torch.arange(1, self.num_points + 1, dtype=torch.float32)
        offsets = directions[:, None, None] * distance[None, None, :, None]
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(
                offsets.expand(-1, self.num_levels, -1, -1).reshape(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, points: torch.Tensor, value: torch.Tensor,
                shapes: Shapes) -> torch.Tensor:
        """``query`` (B, Q, C) with its reference ``points`` (1, Q, 1, 2), ``value`` (B,
        keys, C) on the levels of ``shapes``."""
        if len(shapes) != self.num_levels:
            raise ValueError(f'{self.num_levels} value levels expected, got {len(shapes)}')
        batch, queries, _ = query.shape
        heads, levels, num_points = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(value).view(batch, value.shape[1], heads, -1)
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels,
                                                    num_points, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, -1).softmax(-1)
        weights = weights.view(batch, queries, heads, levels, num_points)
        sizes, starts = level_sizes(shapes, query.device)
        # offsets are in pixels of each level: (x, y) divided by (w, h)
        normaliser = sizes.flip(-1).to(offsets.dtype)
        locations = (points[:, :, None, :, None, :]
                     + offsets / normaliser[None, None, None, :, None, :])
        return self.output_proj(deformable_sampling(value, sizes, starts, locations,
                                                    weights))


class DepthwiseConv(nn.Module):
    """A 3×3 depthwise conv applied to each level of a multi-level token sequence."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dims, dims, 3, 1, 1, groups=dims)

    def forward(self, tokens: torch.Tensor, shapes: Shapes) -> torch.Tensor:
        levels = tokens.split([h * w for h, w in shapes], dim=1)
        return torch.cat([self.dwconv(level.transpose(1, 2).reshape(
            tokens.shape[0], -1, h, w)).flatten(2).transpose(1, 2)
            for level, (h, w) in zip(levels, shapes)], dim=1)


class ConvFFN(nn.Module):
    """The extractor's convolutional FFN (CFFN, §3.3): linear, depthwise 3×3 conv per level,
    GELU, linear."""

    def __init__(self, dims: int, hidden_dims: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dims, hidden_dims)
        self.dwconv = DepthwiseConv(hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, dims)

    def forward(self, tokens: torch.Tensor, shapes: Shapes) -> torch.Tensor:
        return self.fc2(self.act(self.dwconv(self.fc1(tokens), shapes)))


class AdapterGeometry(NamedTuple):
    """One forward's grids: the spatial prior's levels (strides 8, 16, 32) and the trunk's
    patch grid, with each one's reference points."""
    prior_shapes: tuple[tuple[int, int], ...]
    trunk_shape: tuple[int, int]
    prior_points: torch.Tensor
    trunk_points: torch.Tensor

    @classmethod
    def of(cls, prior_shapes: Shapes, trunk_shape: tuple[int, int],
           device: torch.device) -> 'AdapterGeometry':
        prior_shapes = tuple(tuple(shape) for shape in prior_shapes)
        return cls(prior_shapes, tuple(trunk_shape), reference_points(prior_shapes, device),
                   reference_points([trunk_shape], device))


class _CrossAttention(nn.Module):
    """Query and feature LayerNorms and a deformable attention from one to the other, the
    part injector and extractor share."""

    def __init__(self, dims: int, num_levels: int, num_heads: int, num_points: int,
                 value_ratio: float, with_cp: bool) -> None:
        super().__init__()
        self.with_cp = with_cp
        self.query_norm = nn.LayerNorm(dims, eps=ADAPTER_NORM_EPS)
        self.feat_norm = nn.LayerNorm(dims, eps=ADAPTER_NORM_EPS)
        self.attn = MultiScaleDeformableAttention(dims, num_levels, num_heads, num_points,
                                                  value_ratio)

    def _attend(self, query: torch.Tensor, points: torch.Tensor, feat: torch.Tensor,
                shapes: Shapes) -> torch.Tensor:
        return self.attn(self.query_norm(query), points, self.feat_norm(feat), shapes)

    def _run(self, step: Callable[..., torch.Tensor], query: torch.Tensor,
             feat: torch.Tensor) -> torch.Tensor:
        """``step(query, feat)``, recomputed in backward under ``with_cp``."""
        if self.with_cp and self.training and query.requires_grad:
            return checkpoint(step, query, feat, use_reentrant=False)
        return step(query, feat)


class Injector(_CrossAttention):
    """Spatial prior → trunk (§3.2): the trunk's patch tokens attend to the prior's three
    levels; the result enters scaled by ``gamma`` (``init_values``: 0 leaves the pretrained
    trunk's features untouched at the start)."""

    def __init__(self, dims: int, num_heads: int, num_points: int, value_ratio: float,
                 init_values: float, with_cp: bool) -> None:
        super().__init__(dims, 3, num_heads, num_points, value_ratio, with_cp)
        self.gamma = nn.Parameter(torch.full((dims,), float(init_values)))

    def forward(self, patches: torch.Tensor, prior: torch.Tensor,
                geometry: AdapterGeometry) -> torch.Tensor:
        def step(query: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
            return query + self.gamma * self._attend(query, geometry.trunk_points, feat,
                                                     geometry.prior_shapes)
        return self._run(step, patches, prior)


class Extractor(_CrossAttention):
    """Trunk → spatial prior (§3.3): the prior's tokens attend to the trunk's patch grid,
    then a convolutional FFN (``with_cffn``, hidden width ``cffn_ratio`` × dims)."""

    def __init__(self, dims: int, num_heads: int, num_points: int, value_ratio: float,
                 with_cffn: bool, cffn_ratio: float, drop_path: float, with_cp: bool) -> None:
        super().__init__(dims, 1, num_heads, num_points, value_ratio, with_cp)
        self.with_cffn = with_cffn
        if with_cffn:
            self.ffn = ConvFFN(dims, int(dims * cffn_ratio))
            self.ffn_norm = nn.LayerNorm(dims, eps=ADAPTER_NORM_EPS)
            self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, prior: torch.Tensor, patches: torch.Tensor,
                geometry: AdapterGeometry) -> torch.Tensor:
        def step(query: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
            query = query + self._attend(query, geometry.prior_points, feat,
                                         [geometry.trunk_shape])
            if self.with_cffn:
                query = query + self.drop_path(self.ffn(self.ffn_norm(query),
                                                        geometry.prior_shapes))
            return query
        return self._run(step, prior, patches)


class Interaction(nn.Module):
    """One interaction (§3.1): inject the prior into the trunk's patch tokens, run a group
    of trunk blocks, extract from them into the prior (twice more after the last group:
    ``extra_extractors``)."""

    def __init__(self, dims: int, num_heads: int, num_points: int, value_ratio: float,
                 init_values: float, with_cffn: bool, cffn_ratio: float, drop_path: float,
                 extra_extractors: bool, with_cp: bool) -> None:
        super().__init__()
        self.injector = Injector(dims, num_heads, num_points, value_ratio, init_values,
                                 with_cp)

        def extractor() -> Extractor:
            return Extractor(dims, num_heads, num_points, value_ratio, with_cffn, cffn_ratio,
                             drop_path, with_cp)
        self.extractor = extractor()
        self.extra_extractors = (nn.Sequential(extractor(), extractor())
                                 if extra_extractors else None)

    def forward(self, patches: torch.Tensor, prior: torch.Tensor,
                run_blocks: Callable[[torch.Tensor], torch.Tensor],
                geometry: AdapterGeometry) -> tuple[torch.Tensor, torch.Tensor]:
        """``run_blocks`` maps the injected patch tokens through the group's blocks (the
        class token, where the trunk carries one, is the caller's)."""
        patches = run_blocks(self.injector(patches, prior, geometry))
        extractors = [self.extractor, *(self.extra_extractors or ())]
        for extractor in extractors:
            prior = extractor(prior, patches, geometry)
        return patches, prior


def _conv_norm_relu(in_channels: int, out_channels: int, stride: int,
                    norm_cfg: dict) -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False),
            build_norm2d(norm_cfg, out_channels), nn.ReLU(inplace=True)]


class SpatialPriorModule(nn.Module):
    """The convolutional spatial prior (§3.2): a ResNet-like stem (three 3×3 convs, max
    pooling) to stride 4, stride-2 convs to 8, 16 and 32, each level projected to the
    trunk's width by a 1×1 conv. Returns the stride-4 map and the three coarser levels."""

    def __init__(self, inplanes: int, dims: int, in_channels: int = 3,
                 norm_cfg: dict = dict(type='SyncBN')) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            *_conv_norm_relu(in_channels, inplanes, 2, norm_cfg),
            *_conv_norm_relu(inplanes, inplanes, 1, norm_cfg),
            *_conv_norm_relu(inplanes, inplanes, 1, norm_cfg),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.conv2 = nn.Sequential(*_conv_norm_relu(inplanes, 2 * inplanes, 2, norm_cfg))
        self.conv3 = nn.Sequential(*_conv_norm_relu(2 * inplanes, 4 * inplanes, 2, norm_cfg))
        self.conv4 = nn.Sequential(*_conv_norm_relu(4 * inplanes, 4 * inplanes, 2, norm_cfg))
        self.fc1, self.fc2, self.fc3, self.fc4 = (
            nn.Conv2d(width, dims, 1) for width in
            (inplanes, 2 * inplanes, 4 * inplanes, 4 * inplanes))

    def forward(self, image: torch.Tensor) -> list[torch.Tensor]:
        c1 = self.stem(image)
        c2 = self.conv2(c1)
        c3 = self.conv3(c2)
        c4 = self.conv4(c3)
        return [fc(c) for fc, c in zip((self.fc1, self.fc2, self.fc3, self.fc4),
                                       (c1, c2, c3, c4))]
