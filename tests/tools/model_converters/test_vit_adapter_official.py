"""The official ViT-Adapter's checkpoints (Chen et al., ICLR 2023) load exactly into our adapter
and compute what the official code computes.

``data/vit_adapter_official.pt`` was recorded once from the official DeiT-based adapter
(czczup/ViT-Adapter, ``detection/mmdet_custom/models/backbones/vit_adapter.py`` with its
deformable attention served by ``vitdense.compat``), built at a tiny size (48 wide, 4 blocks,
one per interaction, a 2 × 2 position table resampled to the 4 × 4 grid, injectors at 0.5) in
float64 and eval mode, with the weights of :func:`seeded_state_dict` in the official layout. It
holds the official key layout, the four output maps for :func:`fixture_input` and the gradients
of a fixed weighting of them by the input and the level embedding (float32, 135 KB).
"""
from pathlib import Path

import pytest
import torch

from tools.model_converters.vit_adapter_official import convert, convert_backbone
from vitdense.models import ColumnarAdapter

FIXTURE = Path(__file__).parent / 'data' / 'vit_adapter_official.pt'


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


def tiny_adapter() -> ColumnarAdapter:
    """Our adapter with the recorded official model's settings."""
    trunk = dict(type='vitdense.ViT', arch=dict(embed_dims=48, num_layers=4, num_heads=3),
                 patch_size=16, img_size=32, pyramid=False, dense_class_token=False,
                 pos_antialias=False, layer_scale=1.0)
    return ColumnarAdapter(trunk, conv_inplane=16, deform_num_heads=3, init_values=0.5,
                           interaction_indexes=[[i, i] for i in range(4)],
                           norm_cfg=dict(type='BN'))


@pytest.fixture(scope='module')
def recorded() -> dict:
    return torch.load(FIXTURE, weights_only=True)


def test_official_weights_reproduce_the_official_outputs_and_gradients(recorded):
    model = tiny_adapter().double().eval()
    official = seeded_state_dict(recorded['official_shapes'])
    model.load_state_dict(convert_backbone(official, model.trunk), strict=True)
    image = fixture_input().requires_grad_()
    outputs = model(image)
    weighting = torch.Generator().manual_seed(1)
    sum((out * torch.randn(out.shape, generator=weighting, dtype=out.dtype)).sum()
        for out in outputs).backward()

    def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
        return ((ours.float() - theirs).norm() / theirs.norm()).item()
    assert [out.shape for out in outputs] == [out.shape for out in recorded['outputs']]
    for ours, theirs in zip(outputs, recorded['outputs']):
        assert relative(ours.detach(), theirs) <= 1e-5
    assert relative(image.grad, recorded['input_grad']) <= 1e-4
    assert relative(model.level_embed.grad, recorded['level_embed_grad']) <= 1e-4


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
