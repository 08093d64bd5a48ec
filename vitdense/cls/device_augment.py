"""Training augmentation split between the loader's workers and the device.

A worker reads and decodes an image (``LoadImageTensor``, ~3x the images per core-second of
the all-CPU DeiT pipeline; docs/benchmarks.md), or only reads it and leaves decoding to the GPU;
``DeviceAugmentPreprocessor`` then runs the rest of the recipe batched on the model's device:
random-resized crop, flip, RandAugment, random erasing, normalisation and Mixup / CutMix.

The augmentations are configured with the same mmpretrain transform dicts as the CPU pipeline
(their colours in the loader's BGR order) and reproduce them: every sample draws its own crop,
flip, RandAugment ops and magnitudes and erasing box from the distributions mmpretrain's
transforms draw from, and for a given draw the device ops give mmpretrain's image within one
grey level (``vitdense/cls/device_ops.py``).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.fileio import get
from mmpretrain.models.utils import ClsDataPreprocessor
from mmpretrain.registry import TRANSFORMS as MMPRETRAIN_TRANSFORMS
from torchvision.io import ImageReadMode, decode_image, decode_jpeg

from ..registry import MODELS, TRANSFORMS
from . import device_ops as ops


@TRANSFORMS.register_module()
class LoadImageTensor(BaseTransform):
    """Read an image file; decode it to a uint8 RGB ``(3, H, W)`` tensor or keep its bytes.

    Args:
        decode: decode in the loader's worker (libjpeg-turbo via torchvision); False hands the
            encoded bytes on as a 1-D uint8 tensor for ``DeviceAugmentPreprocessor`` to decode
            batched on its device (nvJPEG on a GPU), leaving the worker only the file read.
        backend_args: mmengine file backend arguments, as ``LoadImageFromFile``'s.
    """

    def __init__(self, decode: bool = True, backend_args: Optional[dict] = None) -> None:
        self.decode = decode
        self.backend_args = backend_args

    def transform(self, results: dict) -> dict:
        encoded = torch.frombuffer(bytearray(get(results['img_path'], self.backend_args)),
                                   dtype=torch.uint8)
        if not self.decode:
            results['img'] = encoded
            return results
        image = decode_image(encoded, mode=ImageReadMode.RGB)
        results['img'] = image
        results['img_shape'] = results['ori_shape'] = tuple(image.shape[-2:])
        return results

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(decode={self.decode})'


def _rgb(value: Union[float, Sequence[float]]) -> tuple:
    """A colour of mmpretrain's configs (a grey level or BGR) in RGB order."""
    return (value,) * 3 if isinstance(value, (int, float)) else tuple(value)[::-1]


class ResizedCropStage:
    """mmpretrain's ``RandomResizedCrop`` (pillow backend, bicubic) per image on the device."""

    def __init__(self, transform) -> None:
        if transform.interpolation != 'bicubic' or transform.backend != 'pillow':
            raise ValueError('the device RandomResizedCrop resizes as PIL bicubic: set '
                             "interpolation='bicubic', backend='pillow' (got "
                             f'{transform.interpolation!r}, {transform.backend!r})')
        if transform.scale[0] != transform.scale[1]:
            raise ValueError(f'the device RandomResizedCrop makes square crops, got scale '
                             f'{transform.scale}')
        self.size = transform.scale[0]
        self.area_range = transform.crop_ratio_range
        self.log_ratio = (math.log(transform.aspect_ratio_range[0]),
                          math.log(transform.aspect_ratio_range[1]))
        self.aspect_range = transform.aspect_ratio_range
        self.max_attempts = transform.max_attempts

    def draw(self, sizes: Sequence[tuple], rng: np.random.Generator) -> np.ndarray:
        """Crop boxes (N, 4: top, left, height, width), each drawn as mmpretrain draws it."""
        return np.array([self._draw_one(h, w, rng) for h, w in sizes], dtype=np.int64)

    def _draw_one(self, h: int, w: int, rng: np.random.Generator) -> tuple:
        for _ in range(self.max_attempts):
            target_area = rng.uniform(*self.area_range) * h * w
            aspect = math.exp(rng.uniform(*self.log_ratio))
            target_w = int(round(math.sqrt(target_area * aspect)))
            target_h = int(round(math.sqrt(target_area / aspect)))
            if 0 < target_w <= w and 0 < target_h <= h:
                return (int(rng.integers(0, h - target_h + 1)),
                        int(rng.integers(0, w - target_w + 1)), target_h, target_w)
        ratio = w / h  # the fallback: a central crop of the nearest allowed aspect ratio
        target_h, target_w = h, w
        if ratio < min(self.aspect_range):
            target_h = int(round(w / min(self.aspect_range)))
        elif ratio > max(self.aspect_range):
            target_w = int(round(h * max(self.aspect_range)))
        return (h - target_h) // 2, (w - target_w) // 2, target_h, target_w

    def __call__(self, images: Sequence[torch.Tensor], rng: np.random.Generator) -> torch.Tensor:
        boxes = self.draw([tuple(image.shape[-2:]) for image in images], rng)
        return ops.resized_crop(images, boxes, self.size)


class FlipStage:
    """mmcv's ``RandomFlip`` (horizontal) per sample."""

    def __init__(self, transform) -> None:
        if transform.direction != 'horizontal' or not isinstance(transform.prob, float):
            raise ValueError('the device RandomFlip flips horizontally with one probability, '
                             f'got direction={transform.direction!r}, prob={transform.prob!r}')
        self.prob = transform.prob

    def __call__(self, x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        flipped = torch.from_numpy(rng.random(len(x)) < self.prob)
        return ops.hflip(x, flipped.to(x.device))


def _warp_op(matrices: Callable) -> Callable:
    """A RandAugment op that warps with ``matrices(transform, values, height, width)``."""
    def apply(x: torch.Tensor, values: torch.Tensor, transform) -> torch.Tensor:
        return ops.warp_affine(x, matrices(transform, values, *x.shape[-2:]),
                               _rgb(transform.pad_val))
    return apply


#: The RandAugment ops the device runs: mmpretrain's type name -> (its fixed-magnitude
#: attribute or None, the op on a batch given the per-sample magnitudes).
_RANDAUG_OPS: dict = {
    'AutoContrast': (None, lambda x, v, t: ops.auto_contrast(x)),
    'Equalize': (None, lambda x, v, t: ops.equalize(x)),
    'Invert': (None, lambda x, v, t: ops.invert(x)),
    'Rotate': ('angle', _warp_op(lambda t, v, h, w: ops.rotation_matrix(v, h, w))),
    'Posterize': ('bits', lambda x, v, t: ops.posterize(x, v.ceil().to(x.device))),
    'Solarize': ('thr', lambda x, v, t: ops.solarize(x, v.to(x.device))),
    'SolarizeAdd': ('magnitude', lambda x, v, t: ops.solarize_add(x, v.to(x.device), t.thr)),
    'ColorTransform': ('magnitude', lambda x, v, t: ops.color(x, 1 + v.to(x.device))),
    'Contrast': ('magnitude', lambda x, v, t: ops.contrast(x, 1 + v.to(x.device))),
    'Brightness': ('magnitude', lambda x, v, t: ops.brightness(x, 1 + v.to(x.device))),
    'Sharpness': ('magnitude', lambda x, v, t: ops.sharpness(x, 1 + v.to(x.device))),
    'Shear': ('magnitude', _warp_op(
        lambda t, v, h, w: ops.shear_matrix(v, t.direction == 'horizontal'))),
    'Translate': ('magnitude', _warp_op(lambda t, v, h, w: ops.translation_matrix(
        v * (w if t.direction == 'horizontal' else h), t.direction == 'horizontal'))),
}


class RandAugmentStage:
    """mmpretrain's ``RandAugment``: each sample draws its own ops, skips and magnitudes."""

    def __init__(self, transform) -> None:
        self.num_policies = transform.num_policies
        self.ops = list(transform.transforms)
        for op in self.ops:
            name = type(op).__name__
            if name not in _RANDAUG_OPS:
                raise ValueError(f'the device RandAugment has no op {name}; it runs '
                                 f'{sorted(_RANDAUG_OPS)}')
            if getattr(op, 'interpolation', 'bicubic') != 'bicubic':
                raise ValueError(f"the device RandAugment warps bicubic: {name} has "
                                 f"interpolation={op.interpolation!r}; set hparams="
                                 f"dict(interpolation='bicubic')")
            if name == 'Rotate' and (op.center is not None or op.scale != 1.0):
                raise ValueError('the device Rotate turns about the image centre at scale 1')
            if name == 'Sharpness' and getattr(op, 'kernel', None) is not None:
                raise ValueError('the device Sharpness uses the SMOOTH kernel only')

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Op index (or -1: skipped) and magnitude of each sample and slot, (N, policies)."""
        chosen = rng.integers(0, len(self.ops), (n, self.num_policies))
        values = np.zeros(chosen.shape)
        for k, op in enumerate(self.ops):
            picked = chosen == k
            values[picked] = self._magnitudes(op, int(picked.sum()), rng)
        apply_prob = np.array([op.prob for op in self.ops])
        chosen[rng.random(chosen.shape) > apply_prob[chosen]] = -1
        return chosen, values

    @staticmethod
    def _magnitudes(op, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` magnitudes of ``op`` as its ``random_magnitude`` / ``random_negative``."""
        fixed_attr = _RANDAUG_OPS[type(op).__name__][0]
        if fixed_attr is None:
            return np.zeros(count)
        fixed = getattr(op, fixed_attr)
        if fixed is not None:
            values = np.full(count, float(fixed))
        else:
            level = np.full(count, float(op.magnitude_level))
            if op.magnitude_std == 'inf':
                level = rng.uniform(0, op.magnitude_level, count)
            elif op.magnitude_std > 0:
                level = np.clip(rng.normal(op.magnitude_level, op.magnitude_std, count), 0,
                                op.total_level)
            low, high = op.magnitude_range
            values = level / op.total_level * (high - low) + low
        negative = rng.random(count) < op.random_negative_prob
        return np.where(negative, -values, values)

    def apply(self, x: torch.Tensor, chosen: np.ndarray, values: np.ndarray) -> torch.Tensor:
        """Run the drawn ops slot after slot, each op once on the samples that drew it."""
        x = x.clone()
        for slot in range(self.num_policies):
            for k, op in enumerate(self.ops):
                rows = np.flatnonzero(chosen[:, slot] == k)
                if len(rows):
                    index = torch.from_numpy(rows).to(x.device)
                    magnitude = torch.from_numpy(values[rows, slot])
                    x[index] = _RANDAUG_OPS[type(op).__name__][1](x[index], magnitude, op)
        return x

    def __call__(self, x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        return self.apply(x, *self.draw(len(x), rng))


class ErasingStage:
    """mmpretrain's ``RandomErasing``: a box per sample filled with noise or a colour."""

    def __init__(self, transform) -> None:
        self.transform = transform
        self.log_aspect = np.log(np.array(transform.aspect_range, dtype=np.float32))

    def draw(self, n: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
        """Boxes (N, 4: top, left, height, width), zero-sized where a sample is not erased."""
        t = self.transform
        boxes = np.zeros((n, 4), dtype=np.int64)
        for i in np.flatnonzero(rng.random(n) <= t.erase_prob):
            aspect = np.exp(rng.uniform(*self.log_aspect))
            area = height * width * rng.uniform(t.min_area_ratio, t.max_area_ratio)
            h = min(int(round(np.sqrt(area * aspect))), height)
            w = min(int(round(np.sqrt(area / aspect))), width)
            top = int(rng.integers(0, height - h)) if height > h else 0
            left = int(rng.integers(0, width - w)) if width > w else 0
            boxes[i] = top, left, h, w
        return boxes

    def unit_noise(self, shape: Sequence[int], device: torch.device,
                   generator: torch.Generator) -> torch.Tensor:
        """The draw behind the fill: standard normal noise (``fill_std`` set), else uniform."""
        if self.transform.fill_std is None:
            return torch.rand(shape, device=device, generator=generator)
        return torch.randn(shape, device=device, generator=generator)

    def fill(self, unit: torch.Tensor) -> torch.Tensor:
        """The erased pixels' values (N, 3, H, W) uint8 from ``unit_noise``, as mmpretrain's."""
        t = self.transform
        colour = torch.tensor(_rgb(t.fill_color), device=unit.device)[:, None, None]
        if t.mode == 'const':
            return colour.to(torch.uint8).expand(unit.shape)
        if t.fill_std is None:
            return (unit * 256).floor().to(torch.uint8)
        std = torch.tensor(_rgb(t.fill_std), device=unit.device)[:, None, None]
        return ops.trunc_uint8((colour + std * unit).trunc())

    def __call__(self, x: torch.Tensor, rng: np.random.Generator,
                 generator: torch.Generator) -> torch.Tensor:
        boxes = self.draw(len(x), *x.shape[-2:], rng)
        rows = np.flatnonzero(boxes[:, 2] > 0)
        if not len(rows):
            return x
        index = torch.from_numpy(rows).to(x.device)
        x = x.clone()
        unit = self.unit_noise((len(rows), *x.shape[1:]), x.device, generator)
        x[index] = ops.erase(x[index], torch.from_numpy(boxes[rows]), self.fill(unit))
        return x


_STAGES = {'RandomResizedCrop': ResizedCropStage, 'RandomFlip': FlipStage,
           'RandAugment': RandAugmentStage, 'RandomErasing': ErasingStage}


@MODELS.register_module()
class DeviceAugmentPreprocessor(ClsDataPreprocessor):
    """``ClsDataPreprocessor`` that runs the training augmentation batched on the device.

    In training, ``inputs`` are what ``LoadImageTensor`` hands on: uint8 RGB images of any
    size, or encoded bytes, decoded here on the model's device. ``augments`` are mmpretrain
    transform dicts, applied in their order: ``RandomResizedCrop`` (first, it makes the batch),
    ``RandomFlip``, ``RandAugment`` and ``RandomErasing``. Normalisation and the batch
    augments (Mixup / CutMix) follow as in ``ClsDataPreprocessor``, which alone serves
    evaluation (its inputs: the CPU test pipeline's BGR images, so ``to_rgb=True``).

    Args:
        augments: the training transforms the device runs, as in the CPU pipeline.
        **kwargs: ``ClsDataPreprocessor`` arguments (mean, std, to_rgb, num_classes, ...).
    """

    def __init__(self, augments: Sequence[dict], **kwargs) -> None:
        super().__init__(**kwargs)
        if not kwargs.get('to_rgb', False):
            raise ValueError('DeviceAugmentPreprocessor needs to_rgb=True: evaluation images '
                             'come BGR from the CPU test pipeline, training images RGB')
        self.stages = []
        for cfg in augments:
            if cfg['type'] not in _STAGES:
                raise ValueError(f"the device runs no {cfg['type']}; augments may be "
                                 f'{sorted(_STAGES)}')
            self.stages.append(_STAGES[cfg['type']](MMPRETRAIN_TRANSFORMS.build(cfg)))
        if any(isinstance(s, ResizedCropStage) for s in self.stages[1:]):
            raise ValueError('RandomResizedCrop must be the first device augment')

    def augment(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Decode (if encoded), crop and augment a batch: uint8 RGB (N, 3, S, S) on the device.

        Computed in float32 also where the Runner runs the preprocessor under autocast (AMP):
        in bfloat16 a convolution (Sharpness) or a resize would differ from mmpretrain's ops."""
        with torch.autocast(self.device.type, enabled=False):
            return self._augment(inputs)

    def _augment(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        # A batch's draws come from torch's global generator, as Mixup / CutMix's do: the
        # runner's seed fixes them and a resumed run that restores it draws them again.
        rng = np.random.default_rng(int(torch.randint(2 ** 62, ())))
        generator = torch.Generator(self.device).manual_seed(int(rng.integers(2 ** 62)))
        if all(image.dim() == 1 for image in inputs):
            images = decode_jpeg(list(inputs), mode=ImageReadMode.RGB, device=self.device)
        else:
            images = [image.to(self.device, non_blocking=True) for image in inputs]
        stages = self.stages
        if stages and isinstance(stages[0], ResizedCropStage):
            x, stages = stages[0](images, rng), stages[1:]
        elif len({tuple(image.shape) for image in images}) > 1:
            raise ValueError('images of different sizes need a RandomResizedCrop first in '
                             'augments')
        else:
            x = torch.stack(images)
        for stage in stages:
            x = stage(x, rng, generator) if isinstance(stage, ErasingStage) else stage(x, rng)
        return x

    def forward(self, data: dict, training: bool = False) -> dict:
        if not training:
            return super().forward(data, training)
        # The parent converts the loader's BGR order to RGB; the device images are RGB.
        return super().forward({**data, 'inputs': self.augment(data['inputs']).flip(1)},
                               training)
