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
    # directions without variance (fewer pixels than 3, a constant map) stay black
    informative = int((singular > singular[:1].clamp_min(1e-30) * 1e-6).sum())
    top = directions[:min(3, informative)]
    signs = torch.sign(top.gather(1, top.abs().argmax(dim=1, keepdim=True)))
    projected = centred.new_zeros(height * width, 3)
    projected[:, :len(top)] = centred @ (top * signs).t()
    low = projected.amin(dim=0)
    span = (projected.amax(dim=0) - low).clamp_min(1e-12)
    colours = ((projected - low) / span).reshape(height, width, 3)
    explained = torch.zeros(3, dtype=torch.float64)
    explained[:len(top)] = singular[:len(top)] ** 2 / (singular ** 2).sum().clamp_min(1e-30)
    return colours.float(), explained.float()
