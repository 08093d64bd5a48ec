"""Dense features made visible: a (C, H, W) map projected on its three principal components
and shown as RGB, so regions the backbone treats alike get alike colours."""
from __future__ import annotations

import torch


def pca_rgb(feature_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, W, 3) colours in [0, 1] from a (C, H, W) map, and the fraction of the map's
    variance each of the three channels carries.

    Pixels are centred, projected on the top three principal directions of their features
    and each projection is min-max scaled. The sign of a component is arbitrary; it is
    fixed so that its largest loading is positive, which makes colours reproducible.
    """
    if feature_map.dim() != 3:
        raise ValueError(f'pca_rgb expects a (C, H, W) map, got {tuple(feature_map.shape)}')
    channels, height, width = feature_map.shape
    if channels < 3:
        raise ValueError(f'pca_rgb needs at least 3 channels, got {channels}')
    pixels = feature_map.flatten(1).t().double()
    centred = pixels - pixels.mean(dim=0, keepdim=True)
    _, singular, directions = torch.linalg.svd(centred, full_matrices=False)
    top = directions[:3]
    signs = torch.sign(top.gather(1, top.abs().argmax(dim=1, keepdim=True)))
    projected = centred @ (top * signs).t()
    low = projected.amin(dim=0)
    span = (projected.amax(dim=0) - low).clamp_min(1e-12)
    colours = ((projected - low) / span).reshape(height, width, 3)
    variance = singular ** 2
    return colours.float(), (variance[:3] / variance.sum().clamp_min(1e-30)).float()
