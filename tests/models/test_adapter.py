"""ViT-Adapter's layout (vitdense.ColumnarAdapter; its sampling: test_deformable_sampling.py):
every family at any input size, the class token kept by the family's rule, the
options of the paper, and clear errors."""
import pytest
import torch

from vitdense.models import ColumnarAdapter
from vitdense.models.layers.adapter import MultiScaleDeformableAttention

from common import TINY_ARCH, TINY_BACKBONES


def tiny_adapter(family: str, **options) -> ColumnarAdapter:
    trunk = dict(TINY_BACKBONES[family], img_size=32, patch_size=8)
    options.setdefault('deform_num_heads', 2)
    return ColumnarAdapter(trunk, conv_inplane=8, norm_cfg=dict(type='BN'), **options)


def test_deformable_attention_starts_on_rings_with_uniform_weights():
    attention = MultiScaleDeformableAttention(16, num_levels=2, num_heads=4, num_points=3)
    offsets = attention.sampling_offsets.bias.view(4, 2, 3, 2)
    # head 0 looks right, head 1 down, point k at distance k + 1, the same on every level
    torch.testing.assert_close(offsets[0, 0], torch.tensor([[1., 0.], [2., 0.], [3., 0.]]))
    torch.testing.assert_close(offsets[1, 1, :, 1], torch.tensor([1., 2., 3.]))
    assert not attention.attention_weights.weight.any()


@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
@pytest.mark.parametrize('size', [(64, 64), (50, 77)])
def test_every_family_gives_four_levels_at_any_size(family, size):
    model = tiny_adapter(family, interaction_indexes=[(0, 1), (2, 3)])
    image = torch.randn(2, 3, *size, requires_grad=True)
    outputs = model(image)
    expected = [tuple(-(-side // stride) for side in size) for stride in (4, 8, 16, 32)]
    assert [tuple(out.shape[2:]) for out in outputs] == expected
    assert all(out.shape[:2] == (2, TINY_ARCH['embed_dims']) for out in outputs)
    sum(out.square().mean() for out in outputs).backward()
    assert image.grad.abs().sum() > 0
    assert model.level_embed.grad.abs().sum() > 0
    assert model.interactions[0].injector.gamma.grad is not None


def test_convits_class_token_joins_where_the_family_places_it():
    model = tiny_adapter('convit').eval()
    assert model.trunk.trunk_has_class_token and model.trunk.class_token_layer == 1
    seen = []
    hook = model.trunk.blocks[3].register_forward_pre_hook(
        lambda module, args: seen.append(args[0].shape[1]))
    model(torch.randn(1, 3, 32, 32))
    hook.remove()
    assert seen == [1 + 16]  # the class token before the 4 × 4 patches


def test_injector_at_zero_leaves_the_trunk_as_pretrained():
    model = tiny_adapter('vit', init_values=0.).eval()
    image = torch.randn(1, 3, 32, 32)
    trunk_alone = model.trunk.blocks[-1]
    captured = []
    trunk_alone.register_forward_hook(lambda module, args, out: captured.append(out))
    model(image)
    plain = model.trunk.patch_embed(image)[0]
    plain = model.trunk._prepend_cls_token(plain)
    plain = model.trunk.pos_embed(plain, (4, 4))
    for block in model.trunk.blocks:
        plain = block(plain, (4, 4))
    torch.testing.assert_close(captured[0], plain)


def test_paper_options_change_the_modules():
    lean = tiny_adapter('xcit', with_cffn=False, use_extra_extractor=False, deform_ratio=.5,
                        n_points=2)
    assert not hasattr(lean.interactions[-1].extractor, 'ffn')
    assert lean.interactions[-1].extra_extractors is None
    attention = lean.interactions[0].injector.attn
    assert attention.value_proj.out_features == TINY_ARCH['embed_dims'] // 2
    assert attention.attention_weights.out_features == 2 * 3 * 2  # heads × levels × points
    full = tiny_adapter('xcit', with_cp=True)
    assert len(full.interactions[-1].extra_extractors) == 2
    full.train()
    image = torch.randn(2, 3, 32, 32, requires_grad=True)
    sum(out.sum() for out in full(image)).backward()
    assert image.grad is not None


def test_layer_decay_ids_and_no_decay_names():
    model = tiny_adapter('vit')
    num_ids = TINY_ARCH['num_layers'] + 2
    assert model.get_layer_depth('backbone.trunk.blocks.2.attn.qkv.weight', 'backbone.') == \
        (3, num_ids)
    assert model.get_layer_depth('backbone.trunk.patch_embed.proj.weight', 'backbone.') == \
        (0, num_ids)
    assert model.get_layer_depth('backbone.spm.fc1.weight', 'backbone.') == \
        (num_ids - 1, num_ids)
    no_decay = model.no_weight_decay()
    assert 'level_embed' in no_decay and 'trunk.cls_token' in no_decay


@pytest.mark.parametrize('options, error, message', [
    (dict(interaction_indexes=[(0, 1), (3, 3)]), ValueError, 'consecutive'),
    (dict(interaction_indexes=[(0, 1), (2, 2)]), ValueError, 'end at block 2'),
    (dict(deform_num_heads=5), ValueError, 'divide into 5 heads'),
])
def test_bad_options_are_named(options, error, message):
    with pytest.raises(error, match=message):
        tiny_adapter('vit', **options)


def test_a_trunk_with_its_pyramid_or_class_token_output_is_refused():
    with pytest.raises(ValueError, match='pyramid=False'):
        ColumnarAdapter(dict(TINY_BACKBONES['vit'], pyramid=True))
    with pytest.raises(ValueError, match='without output_cls_token'):
        ColumnarAdapter(dict(TINY_BACKBONES['vit'], output_cls_token=True))
    with pytest.raises(TypeError, match='columnar family'):
        ColumnarAdapter(torch.nn.Linear(2, 2))
