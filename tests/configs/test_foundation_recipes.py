"""The foundation-trunk recipes: Mask2Former + ViT-Adapter around DINOv2, DINOv3 and EVA-02
(S, B, L) on ADE20k semantic, COCO instance and COCO panoptic, and the large LoRA recipes
beside their full fine-tuning counterparts. Every shipped config is built on the meta device
(its parameters name by name) by tests/tools/test_model_index.py; here: each recipe wraps the
trunk its name says, LoRA trains what docs/peft.md says and nothing else, and a shortened
recipe takes a training step."""
import re

import pytest
import torch
from mmengine.config import Config

from vitdense.analysis.complexity import load_config
from vitdense.analysis.memory import LORA, lora_and_full
from vitdense.model_factory import build_model

from common import CONFIGS

SOURCES = ('dinov2', 'dinov3', 'eva02')
WIDTHS = {'s': 384, 'b': 768, 'l': 1024}
TASKS = {  # file-name tail: the Mask2Former head's key
    '8xb2-160k_ade20k-512x512': 'decode_head',
    '8xb2-lsj-50e_coco': 'panoptic_head',
    'panoptic_8xb2-lsj-50e_coco-panoptic': 'panoptic_head',
}
#: the foundation recipes (the demo's small trunk from scratch: test_adapter_configs.py)
ADAPTER = sorted(p.name for p in (CONFIGS / 'vit').glob('mask2former_vit-adapter-*.py')
                 if '_demo' not in p.name)
LORA_CONFIGS = sorted(p.name for p in (CONFIGS / 'vit').glob('*_lora_*.py')
                      if '_demo' not in p.name)
NAME = re.compile(r'mask2former_vit-adapter-(?P<size>[sbl])-p16-(?P<source>\w+?)(_lora)?_')


def _config(name: str) -> Config:
    return load_config(str(CONFIGS / 'vit' / name))


def test_every_source_size_and_task_is_shipped():
    for source in SOURCES:
        for size in 'sbl':
            for tail in TASKS:
                if size == 'l' and 'ade20k' in tail:
                    tail = tail.replace('512x512', '896x896')
                assert f'mask2former_vit-adapter-{size}-p16-{source}_{tail}.py' in ADAPTER
    # LoRA at each input of the large recipes, for DINOv3-L and EVA-02-L
    assert len(LORA_CONFIGS) == 6
    for name in LORA_CONFIGS:
        assert (CONFIGS / 'vit' / name.replace('_lora', '')).exists()


@pytest.mark.parametrize('name', ADAPTER)
def test_recipe_wraps_the_named_trunk_in_the_adapter(name):
    cfg = _config(name)
    match = NAME.match(name)
    trunk = cfg.model.backbone.backbone
    assert cfg.model.backbone.type == 'vitdense.ColumnarAdapter' and not trunk.pyramid
    assert trunk.arch == {'s': 'small', 'b': 'base', 'l': 'large'}[match['size']]
    assert {'dinov2': trunk.get('layer_scale') == 1e-5 and trunk.get('rope') is None,
            'dinov3': trunk.get('rope') == 'dinov3' and trunk.get('reg_tokens') == 4,
            'eva02': trunk.get('rope') == 'eva02' and trunk.get('swiglu_mlp')}[match['source']]
    head = cfg.model.get('decode_head') or cfg.model.panoptic_head
    assert list(head.in_channels) == [WIDTHS[match['size']]] * 4
    # the large ADE20k recipes: ViT-Adapter's 1024-wide head
    assert head.feat_channels == (1024 if match['size'] == 'l' and 'ade20k' in name else 256)
    assert ('_lora_' in name) == ('peft' in trunk)


@pytest.mark.parametrize('name', LORA_CONFIGS)
def test_lora_recipe_trains_the_adapters_and_what_the_full_recipe_adds(name):
    """Built on the meta device beside its full counterpart: the trunk's trained tensors are
    LoRA's (plus ViTDet's new relative tables); everything outside the trunk trains in both,
    and the two models are the same but for LoRA's tensors."""
    lora = build_model(_config(name), 'count', device='meta')
    full = build_model(_config(name.replace('_lora', '')), 'count', device='meta')
    adapter_layout = hasattr(lora.backbone, 'trunk')
    trunk_prefix = 'backbone.trunk.' if adapter_layout else 'backbone.'
    trained = {n for n, p in lora.named_parameters() if p.requires_grad}
    lora_tensors = {n for n in trained if '.lora_' in n}
    blocks = 24
    assert len(lora_tensors) == blocks * len(LORA['targets']) * 2  # A and B of each target
    assert {n for n in trained - lora_tensors if n.startswith(trunk_prefix)} == \
        {n for n in trained if n.startswith(trunk_prefix) and '.rel_pos.' in n}
    assert {n for n in trained if not n.startswith(trunk_prefix)} == \
        {n for n, _ in full.named_parameters() if not n.startswith(trunk_prefix)}
    plain = {n.replace('.base_layer', ''): tuple(p.shape)
             for n, p in lora.named_parameters() if n not in lora_tensors}
    assert plain == {n: tuple(p.shape) for n, p in full.named_parameters()}


def _shortened(name: str) -> Config:
    """The recipe with a 4-block, 64-wide trunk, 2 deformable heads and BatchNorm."""
    cfg = _config(name)
    cfg.model.backbone.backbone.arch = dict(embed_dims=64, num_layers=4, num_heads=2)
    cfg.model.backbone.update(deform_num_heads=2, norm_cfg=dict(type='BN'))
    head = cfg.model.get('decode_head') or cfg.model.panoptic_head
    head.in_channels = [64] * 4
    return cfg


def test_shortened_ade20k_recipe_with_lora_takes_a_training_step():
    """mmseg's Mask2Former on the adapter around DINOv3's trunk (rotary positions, storage
    tokens) with the recipes' LoRA: finite losses; gradients reach LoRA's B (zero at start,
    so A's stay zero), the adapter and the head, and no frozen trunk tensor."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    cfg = _shortened('mask2former_vit-adapter-s-p16-dinov3_8xb2-160k_ade20k-512x512.py')
    cfg.model.backbone.backbone.peft = LORA
    torch.manual_seed(0)
    model = build_model(cfg, 'count').train()
    images = torch.randn(2, 3, 64, 64)
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(64, 64), pad_shape=(64, 64)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 3, (1, 64, 64)))
        samples.append(sample)
    losses = model.loss(images, samples)
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(grads[n] is not None and grads[n].abs().sum() > 0 for n in grads
               if '.lora_B.' in n)
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
    for part in ('backbone.interactions.', 'backbone.spm.', 'decode_head.'):
        assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items()
                   if n.startswith(part))


def test_lora_and_full_accounts_differ_by_what_trains():
    """tools/analysis_tools/memory.py --lora-vs-full on the LoRA demo: full fine-tuning
    trains every parameter; LoRA's trained bytes are those of the parameters its model
    trains (adapters, what is new or outside the trunk); the checkpoint shares follow."""
    result = lora_and_full(str(CONFIGS / 'vit/upernet_vit-d6-p8_lora_demo-ade.py'), batch=2)
    lora, full = result['lora'], result['full']
    assert full['grads'] == full['params'] and full['optimizer'] == 2 * full['params']
    assert lora['optimizer'] == 2 * lora['grads'] and lora['grads'] < full['grads']
    model = build_model(_config('upernet_vit-d6-p8_lora_demo-ade.py'), 'count', device='meta')
    assert lora['grads'] == 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert result['trained_share'] == pytest.approx(lora['grads'] / full['grads'])
    buffers = lora['checkpoint'] - 3 * lora['grads']
    assert buffers >= 0 and full['checkpoint'] == 3 * full['params'] + buffers
    assert result['checkpoint_share'] == lora['checkpoint'] / full['checkpoint']
    assert 0 < result['backbone_trained_share'] < result['trained_share'] < 1
