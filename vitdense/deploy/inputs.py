"""Inputs of the exported graphs: images as the config's loader reads them, from files or
the validation set, and the normalised image a backbone takes."""
from __future__ import annotations

import copy
from pathlib import Path

import mmcv
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from .graphs import Normalize


def image_tensor(image) -> torch.Tensor:
    """(1, 3, H, W) float from an (H, W, 3) array or a (3, H, W) tensor, channels as loaded."""
    tensor = torch.as_tensor(image)
    if tensor.shape[-1] == 3 and tensor.dim() == 3 and tensor.shape[0] != 3:
        tensor = tensor.permute(2, 0, 1)
    return tensor[None].float().contiguous()


def validation_loader(cfg: Config, batch_size: int | None = None):
    """The config's validation loader, in this process (no workers)."""
    loader_cfg = copy.deepcopy(cfg.val_dataloader)
    loader_cfg.num_workers, loader_cfg.persistent_workers = 0, False
    if batch_size:
        loader_cfg.batch_size = batch_size
    return Runner.build_dataloader(loader_cfg)


def sample_images(cfg: Config, paths: list[str], count: int) -> list[torch.Tensor]:
    """The images to check the export on: files read as the loader reads them (BGR), or the
    first ``count`` validation images through the config's test pipeline."""
    if paths:
        images = []
        for path in paths:
            if not Path(path).is_file():
                raise FileNotFoundError(f'image not found: {path}')
            images.append(image_tensor(mmcv.imread(path)))
        return images
    try:
        dataset = validation_loader(cfg).dataset
    except (FileNotFoundError, OSError) as error:
        raise FileNotFoundError(
            f'no --image given and the validation set of the config cannot be read ({error}); '
            f'write the demo sets with python tools/data/make_demo_data.py {{ade,coco}} or '
            f'pass --image') from error
    return [image_tensor(dataset[i]['inputs']) for i in range(min(count, len(dataset)))]


def graph_input(kind: str, model: torch.nn.Module, image: torch.Tensor) -> torch.Tensor:
    """What the exported graph takes: the image, or for a backbone the normalised image."""
    if kind != 'backbone' or not hasattr(model, 'data_preprocessor'):
        return image
    with torch.no_grad():
        return Normalize(model.data_preprocessor)(image)
