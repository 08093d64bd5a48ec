"""The official ViT-Adapter's checkpoints (Chen et al., ICLR 2023) load exactly into our adapter
and compute what the official code computes, in both releases: the detection code adds the
trunk's last map to every level, the segmentation code the map after interaction i to level i
(our ``vit_features='last'`` and ``'per_interaction'``).

``data/vit_adapter_official.pt`` was recorded from czczup/ViT-Adapter (commit fd64a51) by
``record_vit_adapter_official.py`` beside this file: the official ``ViTAdapter`` of each
release at :data:`OFFICIAL_SETTINGS` (48 wide, 4 blocks, one per interaction, a 2 × 2 position
table resampled to the 4 × 4 grid, injectors at 0.5), float64, eval mode, the weights of
:func:`seeded_state_dict`. It holds the official key layout, the four output maps for
:func:`fixture_input` and the gradients of their :func:`output_weighting` by the input and by
every parameter (in our layout, as converted), each as its projections on
:func:`gradient_probes` (4 numbers a tensor, so that the file stays small: 0.5 MB).
"""
import sys
from pathlib import Path

import pytest
import torch

from tools.model_converters import vit_adapter_official
from tools.model_converters.vit_adapter_official import (check_vit_features, convert,
                                                       convert_backbone, official_release)
from vitdense.models import ColumnarAdapter

FIXTURE = Path(__file__).parent / 'data' / 'vit_adapter_official.pt'
#: the recorded official ``ViTAdapter``'s arguments
OFFICIAL_SETTINGS = dict(
    pretrain_size=32, img_size=32, patch_size=16, embed_dim=48, depth=4, num_heads=3,
    mlp_ratio=4., layer_scale=True, drop_path_rate=0., conv_inplane=16, n_points=4,
    deform_num_heads=3, init_values=0.5, interaction_indexes=[[i, i] for i in range(4)],
    with_cffn=True, cffn_ratio=0.25, deform_ratio=1.0, add_vit_feature=True,
    use_extra_extractor=True)
#: our ``vit_features`` for each official release
RELEASES = {'detection': 'last', 'segmentation': 'per_interaction'}


def seeded_state_dict(shapes: list[tuple[str, tuple[int, ...]]]) -> dict:
    """Weights for ``shapes`` (key, shape) drawn from one seeded generator in key order:
    norms' and scales' weights near 1, variances positive, sampling offsets of a few pixels,
    everything else small."""
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in sorted(shapes):
        draw = torch.randn(shape, generator=generator, dtype=torch.float64)
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(0)
        elif key.endswith('running_var'):
            state[key] = draw.abs() + .5
        elif key.endswith('sampling_offsets.bias'):
            state[key] = 2 * draw
        elif len(shape) == 1 and key.endswith(('weight', 'gamma', 'gamma1', 'gamma2')):
            state[key] = 1 + .1 * draw
        else:
            state[key] = .1 * draw
    return state


def fixture_input() -> torch.Tensor:
    return torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2),
                       dtype=torch.float64)


def output_weighting(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fixed random weights of the output maps, whose weighted sum is differentiated."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(out.shape, generator=generator, dtype=out.dtype) for out in outputs]


def gradient_probes(grads: dict, count: int = 4) -> dict:
    """``count`` seeded random tensors for each gradient of ``grads`` (our keys)."""
    generator = torch.Generator().manual_seed(3)
    return {key: torch.randn((count, *grads[key].shape), generator=generator,
                             dtype=torch.float64) for key in sorted(grads)}


def project(grads: dict, probes: dict) -> dict:
    """Each gradient's inner products with its parameter's probes."""
    return {key: (probes[key] * grad).flatten(1).sum(1) for key, grad in grads.items()}


def tiny_adapter(vit_features: str = 'last') -> ColumnarAdapter:
    """Our adapter with the recorded official model's settings."""
    trunk = dict(type='vitdense.ViT', arch=dict(embed_dims=48, num_layers=4, num_heads=3),
                 patch_size=16, img_size=32, pyramid=False, dense_class_token=False,
                 pos_antialias=False, layer_scale=1.0)
    return ColumnarAdapter(trunk, conv_inplane=16, deform_num_heads=3, init_values=0.5,
                           interaction_indexes=[[i, i] for i in range(4)],
                           vit_features=vit_features, norm_cfg=dict(type='BN'))


@pytest.fixture(scope='module')
def recorded() -> dict:
    return torch.load(FIXTURE, weights_only=True)


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).norm() / theirs.norm()).item()


@pytest.mark.parametrize('release', RELEASES)
def test_official_weights_reproduce_the_official_outputs_and_gradients(recorded, release):
    model = tiny_adapter(RELEASES[release]).double().eval()
    official = seeded_state_dict(recorded['official_shapes'])
    model.load_state_dict(convert_backbone(official, model.trunk), strict=True)
    image = fixture_input().requires_grad_()
    outputs = model(image)
    sum((out * weight).sum() for out, weight in zip(outputs, output_weighting(outputs))
        ).backward()

    reference = recorded[release]
    assert [out.shape for out in outputs] == [out.shape for out in reference['outputs']]
    # float64 throughout, the order of sums aside (measured: outputs ≤ 4e-16, gradients ≤ 2e-14)
    for ours, theirs in zip(outputs, reference['outputs']):
        assert relative(ours.detach(), theirs) <= 1e-12
    grads = dict(((name, param.grad) for name, param in model.named_parameters()),
                 input=image.grad)
    ours = project(grads, gradient_probes(grads))
    assert ours.keys() == reference['grads'].keys()
    for name, projections in ours.items():
        assert relative(projections, reference['grads'][name]) <= 1e-12, name


def test_the_releases_differ_where_the_option_says(recorded):
    """Levels 1-3 of the two releases differ, the last level (the last map in both) not."""
    detection, segmentation = (recorded[release]['outputs'] for release in RELEASES)
    assert [relative(a, b) > 1e-2 for a, b in zip(detection, segmentation)] == \
        [True, True, True, False]


def test_per_interaction_features_need_four_interactions():
    with pytest.raises(ValueError, match='give four interaction groups, got 2'):
        ColumnarAdapter(dict(type='vitdense.ViT', arch=dict(embed_dims=48, num_layers=4,
                                                            num_heads=3),
                             patch_size=16, img_size=32, dense_class_token=False),
                        conv_inplane=16, deform_num_heads=3,
                        interaction_indexes=[[0, 1], [2, 3]], vit_features='per_interaction',
                        norm_cfg=dict(type='BN'))


def test_detector_checkpoint_converts_with_heads_kept(recorded):
    model = tiny_adapter()
    official = {f'backbone.{key}': value.float() for key, value in
                seeded_state_dict(recorded['official_shapes']).items()}
    official['neck.lateral_convs.0.conv.weight'] = torch.zeros(8, 48, 1, 1)
    converted = convert(official, model.trunk)
    assert converted['neck.lateral_convs.0.conv.weight'].shape == (8, 48, 1, 1)
    backbone = {key[len('backbone.'):]: value for key, value in converted.items()
                if key.startswith('backbone.')}
    model.load_state_dict(backbone, strict=True)
    # the official trunk's class token and its position row are left out: it carries none
    assert not any(key.startswith('trunk.cls_token') for key in backbone)


def test_a_checkpoint_of_another_width_is_refused_naming_the_tensors(recorded):
    official = {key: value for key, value in seeded_state_dict(
        [(key, shape) for key, shape in recorded['official_shapes']]).items()}
    wider = dict(official, **{'blocks.0.attn.qkv.weight': torch.zeros(3 * 64, 48)})
    with pytest.raises(ValueError, match='blocks.0.attn.qkv.weight'):
        convert_backbone(wider, tiny_adapter().trunk)


def test_no_backbone_keys_is_an_error():
    with pytest.raises(KeyError, match='not a detector / segmentor checkpoint'):
        convert({'neck.weight': torch.zeros(1)}, tiny_adapter().trunk)


@pytest.mark.parametrize('checkpoint, release', [
    (dict(meta=dict(mmdet_version='2.22.0'), state_dict={'backbone.x': 0}), 'detection'),
    ({'backbone.x': 0, 'roi_head.bbox_head.fc_cls.weight': 0}, 'detection'),
    (dict(meta=dict(mmseg_version='0.20.2'), state_dict={'backbone.x': 0}), 'segmentation'),
    (dict(state_dict={'backbone.x': 0, 'decode_head.conv_seg.weight': 0}), 'segmentation'),
])
def test_the_release_is_read_from_the_checkpoint(checkpoint, release):
    assert official_release(checkpoint) == release
    check_vit_features(release, RELEASES[release])


@pytest.mark.parametrize('checkpoint, signs', [
    ({'backbone.x': 0}, 'neither'),
    (dict(meta=dict(mmdet_version='2.22.0'), state_dict={'decode_head.x': 0}),
     'detection and segmentation'),
])
def test_an_unknown_release_is_refused_naming_the_option(checkpoint, signs):
    with pytest.raises(ValueError, match=f'signs of {signs}.*give --release detection or '
                                         f'--release segmentation'):
        official_release(checkpoint)


def test_the_tool_refuses_a_config_that_computes_another_release(tmp_path, monkeypatch,
                                                                 capsys):
    """A segmentation checkpoint for the Mask R-CNN recipe (the last map on every level)."""
    src = tmp_path / 'upernet_deit_adapter.pth'
    torch.save(dict(meta=dict(mmseg_version='0.20.2'),
                    state_dict={'backbone.level_embed': torch.zeros(3, 48),
                                'decode_head.conv_seg.weight': torch.zeros(150, 512, 1, 1)}),
               src)
    monkeypatch.setattr(sys, 'argv', [
        'vit_adapter_official.py', str(src), str(tmp_path / 'out.pth'),
        '--config', 'configs/vit/mask-rcnn_vit-s-p16_adapter_3x_coco.py'])
    with pytest.raises(SystemExit, match="official segmentation release adds the trunk map "
                                         "after interaction i to level i, the config's adapter "
                                         "has vit_features='last': use a config with backbone "
                                         "vit_features='per_interaction'"):
        vit_adapter_official.main()
    assert not (tmp_path / 'out.pth').exists()
