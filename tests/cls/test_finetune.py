"""Attention-only fine-tuning ("Three things" §4): what trains, what stays bit-identical."""
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

from vitdense.cls import ATTENTION_ONLY, train_only

from common import TINY_BACKBONES


def classifier(backbone: dict, finetune: str, embed_dims: int = 32) -> torch.nn.Module:
    return MODELS.build(dict(
        type='vitdense.ViTClassifier', finetune=finetune, neck=None,
        backbone=dict(backbone, img_size=32, patch_size=8, out_type='cls_token'),
        head=dict(type='LinearClsHead', num_classes=4, in_channels=embed_dims)))


@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
def test_ffn_weights_stay_bit_identical_after_a_step(family: str) -> None:
    torch.manual_seed(0)
    model = classifier(TINY_BACKBONES[family], 'attention')
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optim = build_optim_wrapper(model, dict(
        optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05)))
    data = dict(inputs=[torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[DataSample().set_gt_label(i) for i in range(2)])
    model.train_step(data, optim)

    params = dict(model.named_parameters())
    frozen = [k for k in params if '.mlp.' in k or k.startswith('backbone.patch_embed.')
              or '.ls2.' in k]
    attention = [k for k in params if '.attn.' in k and params[k].requires_grad]
    assert frozen and attention
    for name in frozen:
        assert not params[name].requires_grad, name
        assert torch.equal(params[name], before[name]), name
    assert any(not torch.equal(params[k], before[k]) for k in attention)
    assert not torch.equal(params['head.fc.weight'], before['head.fc.weight'])


def test_attention_only_vit_s_trains_about_a_third_of_the_weights() -> None:
    model = classifier(dict(type='vitdense.ViT', arch='small'), 'full', embed_dims=384)
    summary = train_only(model, ATTENTION_ONLY)
    ffn = sum(p.numel() for k, p in model.named_parameters() if '.mlp.' in k)
    assert summary.frozen >= ffn
    assert 0.30 < summary.trainable / summary.total < 0.40
    assert summary.saved_bytes() == summary.frozen * 12  # fp32 gradient + 2 AdamW moments


def test_full_finetuning_trains_everything_and_unknown_modes_fail() -> None:
    model = classifier(TINY_BACKBONES['vit'], 'full')
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match='finetune'):
        classifier(TINY_BACKBONES['vit'], 'ffn')
