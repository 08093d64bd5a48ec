"""The device half of the split training pipeline equals mmpretrain's CPU transforms.

For a given draw every device op gives mmpretrain's image within one grey level; the draws
(crop boxes, flips, RandAugment ops and magnitudes, erasing boxes) follow the distributions of
mmpretrain's own random methods (chi-square and two-sample KS tests at a fixed seed).
"""
from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from mmpretrain.datasets.transforms import auto_augment as aa
from mmpretrain.registry import TRANSFORMS as MMPRETRAIN_TRANSFORMS
from mmpretrain.structures import DataSample
from scipy import stats

from vitdense.cls import device_ops as ops
from vitdense.cls.device_augment import (DeviceAugmentPreprocessor, ErasingStage,
                                         FlipStage, LoadImageTensor, RandAugmentStage,
                                         ResizedCropStage)
from vitdense.registry import MODELS, TRANSFORMS

BGR_MEAN = (104, 116, 124)
RAND_AUGMENT = dict(type='RandAugment', policies='timm_increasing', num_policies=2,
                    total_level=10, magnitude_level=9, magnitude_std=0.5,
                    hparams=dict(pad_val=list(BGR_MEAN), interpolation='bicubic'))
ERASING = dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
               max_area_ratio=1 / 3, fill_color=[103.53, 116.28, 123.675],
               fill_std=[57.375, 57.12, 58.395])
CROP = dict(type='RandomResizedCrop', scale=32, backend='pillow', interpolation='bicubic')
AUGMENTS = [CROP, dict(type='RandomFlip', prob=0.5, direction='horizontal'), RAND_AUGMENT,
            ERASING]
PREPROCESSOR = dict(type='vitdense.DeviceAugmentPreprocessor', augments=AUGMENTS, num_classes=10,
                    mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                    to_rgb=True)


def picture(seed: int, height: int = 45, width: int = 61) -> np.ndarray:
    """A BGR uint8 picture with edges and smooth areas, as a photograph has."""
    noise = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (5, 5), 1.5)


def as_rgb_batch(bgr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1)))[None]


def assert_within_one_grey_level(reference_bgr: np.ndarray, ours: torch.Tensor) -> None:
    diff = (as_rgb_batch(reference_bgr).int() - ours.int()).abs()
    assert diff.max() <= 1, f'max abs diff {diff.max()} grey levels'


def fixed_draw(name: str, **kwargs) -> dict:
    """Arguments of one of mmpretrain's RandAugment ops, always applied, never negated."""
    kwargs.setdefault('prob', 1.)
    if name not in ('AutoContrast', 'Equalize', 'Invert', 'Posterize', 'Solarize',
                    'SolarizeAdd'):
        kwargs.setdefault('random_negative_prob', 0.)
    return kwargs


def device_op(name: str, **kwargs) -> RandAugmentStage:
    return RandAugmentStage(MMPRETRAIN_TRANSFORMS.build(dict(
        type='RandAugment', num_policies=1, magnitude_level=0,
        policies=[dict(type=name, **fixed_draw(name, **kwargs))], hparams={})))


OPS_WITH_MAGNITUDES = [
    ('AutoContrast', {}), ('Equalize', {}), ('Invert', {}),
    ('Rotate', dict(angle=23.7, pad_val=BGR_MEAN, interpolation='bicubic')),
    ('Rotate', dict(angle=-8.2, pad_val=BGR_MEAN, interpolation='bicubic')),
    ('Posterize', dict(bits=2.3)), ('Posterize', dict(bits=0.4)),
    ('Solarize', dict(thr=97.6)), ('SolarizeAdd', dict(magnitude=71.3)),
    ('ColorTransform', dict(magnitude=0.77)), ('ColorTransform', dict(magnitude=-0.6)),
    ('Contrast', dict(magnitude=0.85)), ('Contrast', dict(magnitude=-0.45)),
    ('Brightness', dict(magnitude=0.66)), ('Brightness', dict(magnitude=-0.81)),
    ('Sharpness', dict(magnitude=0.9)), ('Sharpness', dict(magnitude=-0.5)),
    ('Shear', dict(magnitude=0.27, direction='horizontal', pad_val=BGR_MEAN,
                   interpolation='bicubic')),
    ('Shear', dict(magnitude=-0.19, direction='vertical', pad_val=BGR_MEAN,
                   interpolation='bicubic')),
    ('Translate', dict(magnitude=0.41, direction='horizontal', pad_val=BGR_MEAN,
                       interpolation='bicubic')),
    ('Translate', dict(magnitude=-0.13, direction='vertical', pad_val=BGR_MEAN,
                       interpolation='bicubic')),
]


@pytest.mark.parametrize('name,kwargs', OPS_WITH_MAGNITUDES,
                         ids=[f'{n}-{i}' for i, (n, _) in enumerate(OPS_WITH_MAGNITUDES)])
def test_randaugment_op_equals_mmpretrain_for_a_given_magnitude(name: str, kwargs: dict) -> None:
    for seed in range(3):
        image = picture(seed)
        reference = getattr(aa, name)(**fixed_draw(name, **kwargs))({'img': image.copy()})['img']
        stage = device_op(name, **kwargs)
        ours = stage.apply(as_rgb_batch(image), np.zeros((1, 1), dtype=np.int64),
                           stage.draw(1, np.random.default_rng(seed))[1])
        assert_within_one_grey_level(reference, ours)


def test_contrast_blends_with_the_rounded_mean_grey_level() -> None:
    """Contrast at factor 0 is the image's mean grey level everywhere, rounded as mmcv's
    ``adjust_contrast`` rounds it: exactly, so that a mean truncated a level down shows."""
    import mmcv
    images = [picture(seed) for seed in range(6)]
    means = [cv2.cvtColor(image, cv2.COLOR_BGR2GRAY).mean() for image in images]
    assert any(math.floor(mean) != round(mean) for mean in means)
    for image in images:
        ours = ops.contrast(as_rgb_batch(image), torch.zeros(1))
        assert torch.equal(ours, as_rgb_batch(mmcv.adjust_contrast(image, 0.)))


@pytest.mark.parametrize('prob', [0.1, 0.7])
def test_flip_rate_is_the_flip_probability(prob: float) -> None:
    """Images of a dark left and a bright right pixel: the share flipped is ``prob``."""
    stage = FlipStage(MMPRETRAIN_TRANSFORMS.build(dict(type='RandomFlip', prob=prob,
                                                       direction='horizontal')))
    images = torch.tensor([0, 255], dtype=torch.uint8).expand(4000, 3, 1, 2)
    flipped = stage(images, np.random.default_rng(0))
    assert torch.equal(flipped[:, :, :, 0] == 255, flipped[:, :, :, 1] == 0)
    assert stats.binomtest(int((flipped[:, 0, 0, 0] == 255).sum()), 4000, prob).pvalue > 1e-3


def test_resized_crop_resizes_as_pillow_bicubic() -> None:
    transform = MMPRETRAIN_TRANSFORMS.build(dict(CROP, scale=40))
    stage = ResizedCropStage(transform)
    for box in [(3, 7, 30, 41), (0, 0, 45, 61), (10, 20, 12, 9)]:  # shrink, whole, enlarge
        image = picture(sum(box))
        with mock.patch.object(transform, 'rand_crop_params', return_value=box):
            reference = transform({'img': image.copy()})['img']
        ours = ops.resized_crop([as_rgb_batch(image)[0]], np.array([box]), stage.size)
        assert_within_one_grey_level(reference, ours)


def test_erasing_fills_as_mmpretrain_for_a_given_draw() -> None:
    transform = MMPRETRAIN_TRANSFORMS.build(dict(ERASING, erase_prob=1.))
    box = (5, 9, 20, 30)
    image = picture(0)
    np.random.seed(7)
    with mock.patch.object(transform, 'random_patch', return_value=box):
        reference = transform({'img': image.copy()})['img']
    np.random.seed(7)
    np.random.rand()  # the erase-or-not draw
    unit = np.random.standard_normal((box[2], box[3], 3))[..., ::-1]  # the same normal draw
    noise = torch.zeros(1, 3, *image.shape[:2], dtype=torch.float64)
    noise[0, :, 5:25, 9:39] = torch.from_numpy(unit.transpose(2, 0, 1).copy())
    stage = ErasingStage(transform)
    ours = ops.erase(as_rgb_batch(image), torch.tensor([box]), stage.fill(noise))
    assert_within_one_grey_level(reference, ours)


def mmpretrain_magnitudes(op: aa.BaseAugTransform, count: int) -> np.ndarray:
    np.random.seed(1)
    return np.array([op.random_negative(op.random_magnitude()) for _ in range(count)])


def test_randaugment_draws_ops_and_magnitudes_as_mmpretrain() -> None:
    """Op choice and application: chi-square; each op's magnitudes: two-sample KS."""
    stage = RandAugmentStage(MMPRETRAIN_TRANSFORMS.build(RAND_AUGMENT))
    n = 30000
    chosen, values = stage.draw(n, np.random.default_rng(0))
    ops_count = len(stage.ops)
    counts = np.bincount(chosen.ravel() + 1, minlength=ops_count + 1)
    applied = np.array([op.prob for op in stage.ops]) / ops_count  # per slot
    expected = np.concatenate([[1 - applied.sum()], applied]) * chosen.size
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    for k, op in enumerate(stage.ops):
        if op.magnitude_range is None:
            continue
        ours = values[chosen == k]
        reference = mmpretrain_magnitudes(op, 2000)
        assert stats.ks_2samp(ours, reference).pvalue > 1e-3, type(op).__name__
        assert np.abs(ours).max() <= max(np.abs(op.magnitude_range))


def test_crop_boxes_follow_mmpretrain_distribution() -> None:
    transform = MMPRETRAIN_TRANSFORMS.build(CROP)
    stage = ResizedCropStage(transform)
    ours = stage.draw([(300, 400)] * 4000, np.random.default_rng(0))
    np.random.seed(0)
    image = np.zeros((300, 400, 3), np.uint8)
    reference = np.array([transform.rand_crop_params(image) for _ in range(4000)])
    for column in range(4):  # top, left, height, width
        assert stats.ks_2samp(ours[:, column], reference[:, column]).pvalue > 1e-3, column


def test_erasing_boxes_and_rate_follow_mmpretrain() -> None:
    transform = MMPRETRAIN_TRANSFORMS.build(ERASING)
    boxes = ErasingStage(transform).draw(20000, 64, 48, np.random.default_rng(0))
    erased = boxes[boxes[:, 2] > 0]
    assert stats.binomtest(len(erased), len(boxes), 0.25).pvalue > 1e-3
    np.random.seed(0)
    reference = np.array([transform.random_patch(64, 48) for _ in range(3000)])
    for column in range(4):
        assert stats.ks_2samp(erased[:, column], reference[:, column]).pvalue > 1e-3, column


def labelled(images: list[torch.Tensor]) -> dict:
    return dict(inputs=images, data_samples=[DataSample().set_gt_label(i % 10)
                                             for i in range(len(images))])


def test_preprocessor_augments_a_batch_of_any_sizes_and_mixes_it() -> None:
    preprocessor = MODELS.build(dict(PREPROCESSOR, batch_augments=dict(
        augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)])))
    images = [as_rgb_batch(picture(i, 40 + 3 * i, 70 - 2 * i))[0] for i in range(8)]
    out = preprocessor(labelled(images), training=True)
    assert out['inputs'].shape == (8, 3, 32, 32) and out['inputs'].dtype == torch.float32
    assert -2.5 < out['inputs'].mean() < 2.5
    scores = torch.stack([s.gt_score for s in out['data_samples']])
    assert scores.shape == (8, 10) and torch.allclose(scores.sum(1), torch.ones(8))
    assert (scores.max(1).values < 1).any()  # mixed


def test_augmentation_under_autocast_is_computed_as_without() -> None:
    # the Runner runs the preprocessor under autocast with AMP; in bfloat16 Sharpness's
    # convolution is 1 grey level off mmpretrain's
    sharpness = dict(type='RandAugment', num_policies=1, magnitude_level=0, hparams={},
                     policies=[dict(type='Sharpness', **fixed_draw('Sharpness', magnitude=0.9))])
    preprocessor = MODELS.build(dict(PREPROCESSOR, augments=[sharpness]))
    images = [as_rgb_batch(picture(i, 64, 64))[0] for i in range(4)]
    torch.manual_seed(0)
    plain = preprocessor.augment(images)
    torch.manual_seed(0)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        under_amp = preprocessor.augment(images)
    torch.testing.assert_close(under_amp, plain, rtol=0, atol=0)


def test_preprocessor_without_augments_only_normalises_rgb() -> None:
    """With no augments the training batch is the normalised RGB input, evaluation as mmpretrain."""
    preprocessor = MODELS.build(dict(PREPROCESSOR, augments=[]))
    rgb = as_rgb_batch(picture(0))
    out = preprocessor(labelled([rgb[0]]), training=True)['inputs']
    expected = (rgb.float() - preprocessor.mean) / preprocessor.std
    torch.testing.assert_close(out, expected)
    evaluated = preprocessor(labelled([rgb[0].flip(0)]), training=False)['inputs']  # BGR in
    torch.testing.assert_close(evaluated, expected)


def test_encoded_inputs_decode_on_the_device_as_in_the_worker(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f'{i}.jpg'))
        cv2.imwrite(paths[-1], picture(i, 50, 60 + i))
    decoded = [LoadImageTensor()(dict(img_path=p))['img'] for p in paths]
    encoded = [LoadImageTensor(decode=False)(dict(img_path=p))['img'] for p in paths]
    assert encoded[0].dim() == 1 and decoded[0].shape == (3, 50, 60)
    reference = cv2.imread(paths[0])
    assert (as_rgb_batch(reference)[0].int() - decoded[0].int()).abs().max() <= 1
    torch.manual_seed(0)
    a = MODELS.build(PREPROCESSOR).augment(decoded)
    torch.manual_seed(0)
    b = MODELS.build(PREPROCESSOR).augment(encoded)
    torch.testing.assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='decoding on the GPU needs CUDA')
def test_gpu_decode_and_augment_match_the_cpu(tmp_path: Path) -> None:
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f'{i}.jpg'))
        cv2.imwrite(paths[-1], picture(i, 64, 80 + 4 * i))
    encoded = [LoadImageTensor(decode=False)(dict(img_path=p))['img'] for p in paths]
    decoded = [LoadImageTensor()(dict(img_path=p))['img'] for p in paths]
    gpu = MODELS.build(PREPROCESSOR).cuda()
    cpu = MODELS.build(PREPROCESSOR)
    torch.manual_seed(0)
    out_gpu = gpu.augment(encoded).cpu()
    torch.manual_seed(0)
    out_cpu = cpu.augment(decoded)
    assert out_gpu.shape == out_cpu.shape
    # nvJPEG's IDCT and the erasing noise stream differ from the CPU's: compare the mean only.
    assert (out_gpu.float() - out_cpu.float()).abs().mean() < 8


@pytest.mark.parametrize('augments,message', [
    ([dict(type='ColorJitter', brightness=0.4)], 'the device runs no ColorJitter'),
    ([dict(RAND_AUGMENT, policies=[dict(type='Cutout', magnitude_range=(0, 20))])],
     'has no op Cutout'),
    ([dict(RAND_AUGMENT, hparams=dict(pad_val=128, interpolation='nearest'))],
     "interpolation='nearest'"),
    ([dict(CROP, interpolation='bilinear')], 'resizes as PIL bicubic'),
    ([dict(type='RandomFlip', prob=0.5), CROP], 'must be the first'),
])
def test_unsupported_augments_are_named(augments: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(PREPROCESSOR, augments=augments))


def test_batches_of_mixed_sizes_need_a_crop() -> None:
    preprocessor = MODELS.build(dict(PREPROCESSOR, augments=AUGMENTS[1:]))
    with pytest.raises(ValueError, match='need a RandomResizedCrop'):
        preprocessor.augment([torch.zeros(3, 8, 8, dtype=torch.uint8),
                              torch.zeros(3, 9, 8, dtype=torch.uint8)])


def test_registered_in_the_vitdense_scope() -> None:
    assert TRANSFORMS.get('LoadImageTensor') is LoadImageTensor
    assert MODELS.get('DeviceAugmentPreprocessor') is DeviceAugmentPreprocessor
    assert math.isclose(MMPRETRAIN_TRANSFORMS.build(CROP).scale[0], 32)
