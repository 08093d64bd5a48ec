"""Recorded attention is the attention the blocks apply, and the measures derived from it
match hand computations on known patterns."""
import math

import pytest
import torch

from vitdense.analysis import (AttentionRecorder, attention_rollout, class_attention_maps,
                               mean_attention_distance, nonlocality, query_attention_maps,
                               record_attention, upsample_maps)
from vitdense.models import CaiT, ConViT, ViT, XCiT
from vitdense.models.layers.attention import _merge_heads, _split_heads

from common import TINY_ARCH


def _outputs_of_attention(model, images):
    """The output of every trunk attention module and the values it mixed."""
    kept = {}

    def keep(index):
        def hook(module, args, output):
            x = args[0]
            if hasattr(module, 'qkv'):
                v = _split_heads(module.qkv(x), 3, module.num_heads)[2]
            else:
                (v,) = _split_heads(module.v(x), 1, module.num_heads)
            kept[index] = (v, output.clone())
        return hook

    handles = [block.attn.register_forward_hook(keep(i)) for i, block in enumerate(model.blocks)]
    with torch.no_grad(), AttentionRecorder(model) as record:
        model(images)
    for handle in handles:
        handle.remove()
    return record, kept


@pytest.mark.parametrize('model', [
    ViT(TINY_ARCH, out_type='featmap', pyramid=False, out_indices=[3]),
    CaiT(TINY_ARCH, out_type='featmap', pyramid=False, out_indices=[3]),
    ConViT(dict(TINY_ARCH, num_local_layers=2, num_heads=4), out_type='featmap', pyramid=False,
           out_indices=[3]),
], ids=['vit', 'cait-talking-heads', 'convit-gpsa'])
def test_recorded_weights_reproduce_the_attention_output(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for block in model.blocks:  # gates away from their init, both terms count
            if hasattr(block.attn, 'gating'):
                block.attn.gating.normal_()
    record, kept = _outputs_of_attention(model.eval(), torch.randn(2, 3, 48, 64))
    assert record.grid == (3, 4)
    for index, (v, output) in kept.items():
        weights = record.trunk[index]
        assert weights.shape == (2, model.num_heads, *[v.shape[-2]] * 2)
        rebuilt = model.blocks[index].attn.proj(_merge_heads(weights @ v))
        torch.testing.assert_close(rebuilt, output, atol=1e-5, rtol=1e-4)


def test_class_token_is_counted_from_the_block_it_joins():
    model = ConViT(dict(TINY_ARCH, num_heads=4, num_local_layers=2), out_type='cls_token')
    record = record_attention(model, torch.randn(1, 3, 32, 32))
    assert [record.num_prefix_tokens(i) for i in range(4)] == [0, 0, 1, 1]
    # the classifier computes only the class token's query in the last block; the record
    # holds every query all the same
    assert record.trunk[3].shape == (1, 4, 5, 5)


def test_class_attention_rows_sum_to_one_and_give_the_output():
    model = CaiT(TINY_ARCH, out_type='cls_token').eval()
    outputs = []
    model.cls_blocks[0].attn.register_forward_hook(lambda m, a, out: outputs.append(
        (a[0], out.clone())))
    record = record_attention(model, torch.randn(2, 3, 32, 48))
    assert len(record.class_attention) == 2
    weights = record.class_attention[0]
    assert weights.shape == (2, 2, 1 + 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2))
    attn = model.cls_blocks[0].attn
    x, output = outputs[0]
    v = _split_heads(attn.kv(x), 2, attn.num_heads)[1]
    rebuilt = attn.proj(_merge_heads(weights[:, :, None] @ v))
    torch.testing.assert_close(rebuilt, output, atol=1e-5, rtol=1e-4)
    maps = class_attention_maps(weights, record.grid)
    assert maps.shape == (2, 2, 2, 3)
    torch.testing.assert_close(maps.sum((-2, -1)) + weights[..., 0], torch.ones(2, 2))


def test_xcit_records_class_attention_and_no_token_attention():
    record = record_attention(XCiT(TINY_ARCH, out_type='cls_token'), torch.randn(1, 3, 32, 32))
    assert record.trunk == {} and len(record.class_attention) == 2


def test_rollout_of_identity_attention_is_the_identity():
    identity = torch.eye(5).expand(2, 3, 5, 5)
    torch.testing.assert_close(attention_rollout([identity] * 4), torch.eye(5).expand(2, 5, 5))


def test_rollout_multiplies_the_layers_with_the_residual_path():
    torch.manual_seed(0)
    first, second = (torch.rand(1, 2, 3, 3).softmax(-1) for _ in range(2))
    eye = torch.eye(3)
    step1 = 0.5 * first.mean(1)[0] + 0.5 * eye
    step2 = 0.5 * second.mean(1)[0] + 0.5 * eye
    torch.testing.assert_close(attention_rollout([first, second])[0], step2 @ step1)
    torch.testing.assert_close(attention_rollout([first], residual=0.)[0], first.mean(1)[0])


def test_rollout_passes_a_late_class_token_through_earlier_layers():
    early = torch.full((1, 1, 2, 2), 0.5)
    late = torch.eye(3)[None, None]
    rollout = attention_rollout([early, late], residual=0.)[0]
    torch.testing.assert_close(rollout, torch.tensor([[1., 0., 0.], [0., .5, .5],
                                                      [0., .5, .5]]))


def test_mean_attention_distance_of_a_known_pattern():
    # one row of 4 patches, each attending to the next one (the last to the first):
    # distances 1, 1, 1, 3 patches; head 2 attends to itself
    shift = torch.roll(torch.eye(4), 1, dims=1)
    weights = torch.stack([shift, torch.eye(4)])[None]
    distance = mean_attention_distance(weights, (1, 4), patch_size=16)
    torch.testing.assert_close(distance, torch.tensor([16 * 1.5, 0.]))
    # half of every query's weight parked on a class token changes nothing
    with_cls = torch.zeros(1, 2, 5, 5)
    with_cls[..., 0] = 0.5
    with_cls[..., 1:, 1:] = weights * 0.5
    torch.testing.assert_close(mean_attention_distance(with_cls, (1, 4), 16), distance)
    assert nonlocality(weights, (1, 4)) == pytest.approx(0.75)


def test_uniform_attention_on_a_2x2_grid():
    # from each corner: two neighbours at 1, the opposite corner at sqrt(2), itself at 0
    uniform = torch.full((1, 1, 4, 4), 0.25)
    expected = (2 + math.sqrt(2)) / 4
    assert mean_attention_distance(uniform, (2, 2)).item() == pytest.approx(expected)


def test_query_maps_and_upsampling():
    weights = torch.arange(2 * 7 * 7, dtype=torch.float).view(1, 2, 7, 7)
    maps = query_attention_maps(weights, (2, 3), query=0)
    torch.testing.assert_close(maps[0, 1].flatten(), weights[0, 1, 0, 1:])
    with pytest.raises(IndexError, match='query 7 out of range for 7 tokens'):
        query_attention_maps(weights, (2, 3), query=7)
    up = upsample_maps(maps, (32, 48))
    assert up.shape == (1, 2, 32, 48)
    assert up.amin().item() == 0 and up.amax().item() == 1


def test_recorder_rejects_other_models():
    with pytest.raises(TypeError, match='columnar backbone'):
        AttentionRecorder(torch.nn.Linear(2, 2))


def test_parallel_branches_stack_their_heads():
    model = ViT(TINY_ARCH, num_parallel=2, out_type='cls_token')
    record = record_attention(model, torch.randn(3, 3, 32, 32))
    weights = record.trunk[0]
    assert weights.shape == (3, 2 * 2, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 5))
    # branch 1's heads come from branch 1's projections: drop branch 0's and they remain
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0].zero_()
        model.blocks[0].attn.qkv.bias[0].zero_()
    zeroed = record_attention(model, torch.randn(3, 3, 32, 32)).trunk[0]
    torch.testing.assert_close(zeroed[:, :2], torch.full((3, 2, 5, 5), 0.2))
