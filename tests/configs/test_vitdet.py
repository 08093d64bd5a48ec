"""The configs in ViTDet's layout: the recipe (1024² large-scale jitter, ViTDet's schedule,
layer decay and drop path, window attention where the family has token attention), and the
family's ImageNet checkpoint layout (a timm state dict) loads with only the new tensors
missing. Their training and test steps run with every dense config in test_dense.py."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

from vitdense.model_factory import register_host
from vitdense.models import adapt_checkpoint

from common import REPO_ROOT

FAMILIES = ('vit', 'cait', 'convit', 'xcit')
VITDET = sorted(str(p.relative_to(REPO_ROOT)) for family in FAMILIES
                for p in (REPO_ROOT / 'configs' / family).glob('*_vitdet_*.py'))
FULL = [c for c in VITDET if '_demo-' not in c]
#: the timm model whose state dict is each family's ImageNet layout, per full config
TIMM_MODELS = {'vit-b-p16': 'vit_base_patch16_224', 'cait-s24-p16': 'cait_s24_224',
               'convit-s-p16': 'convit_small', 'xcit-s12-p16': 'xcit_small_12_p16_224',
               'vit-b-p16-dinov3': 'vit_base_patch16_dinov3_qkvb',
               'vit-b-p16-eva02': 'eva02_base_patch14_224',
               'vit-l-p16-dinov3': 'vit_large_patch16_dinov3_qkvb',
               'vit-l-p16-eva02': 'eva02_large_patch14_224'}
#: (layer decay, global-attention blocks) stated per model; ViTDet's ViT-B: 0.7, 2/5/8/11
RECIPE = {'vit-b-p16': (0.7, {2, 5, 8, 11}), 'cait-s24-p16': (0.8, {5, 11, 17, 23}),
          'convit-s-p16': (0.7, {2, 5, 8, 11}), 'xcit-s12-p16': (0.7, None)}


#: the models shipped in Mask R-CNN only (ViTDet-L: 0.8, 5/11/17/23)
MASK_RCNN_ONLY = {'vit-l-p16': (0.8, {5, 11, 17, 23})}


def _load(config: str) -> Config:
    cfg = Config.fromfile(str(REPO_ROOT / config))
    register_host(cfg)
    return cfg


def test_every_family_has_both_tasks_full_and_demo():
    names = {Path(c).name for c in VITDET}
    for model in RECIPE:
        family = model.split('-')[0]
        assert f'mask-rcnn_{model}_vitdet_16xb4-lsj-100e_coco-1024x1024.py' in names
        assert f'cascade-mask-rcnn_{model}_vitdet_16xb4-lsj-100e_coco-1024x1024.py' in names
        assert f'upernet_{model}_vitdet_8xb2-160k_ade20k-512x512.py' in names
        assert f'mask-rcnn_{family}-d6-p8_vitdet_demo-coco.py' in names
        assert f'upernet_{family}-d6-p8_vitdet_demo-ade.py' in names


@pytest.mark.parametrize('config', FULL)
def test_full_config_follows_vitdet(config):
    cfg = _load(config)
    task, model = Path(config).name.split('_')[:2]
    # a model's other sources (vit-b-p16-dinov3) follow its recipe
    recipes = {**RECIPE, **MASK_RCNN_ONLY}
    layer_decay, global_blocks = recipes[next(m for m in recipes if model.startswith(m))]
    backbone, neck = cfg.model.backbone, cfg.model.neck
    arch = MODELS.get(backbone.type).resolve_arch(backbone.arch)
    assert backbone.init_cfg.type == 'Pretrained'
    assert not backbone.pyramid and backbone.out_indices == (-1,)
    assert not backbone.dense_class_token and not backbone.pos_antialias
    assert neck.type == 'vitdense.SimpleFeaturePyramid'
    assert neck.in_channels == arch['embed_dims'] and neck.scale_factors == (4., 2., 1., .5)
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == layer_decay
    if global_blocks is None:
        assert 'window_size' not in backbone
    else:
        windowed = set(backbone.window_block_indexes)
        assert backbone.window_size == 14 and backbone.use_rel_pos
        assert windowed | global_blocks == set(range(arch['num_layers']))
        assert not windowed & global_blocks
    if task in ('mask-rcnn', 'cascade-mask-rcnn'):
        assert neck.num_outs == 5 and cfg.model.rpn_head.num_convs == 2
        box_heads = cfg.model.roi_head.bbox_head
        box_heads = box_heads if task == 'cascade-mask-rcnn' else [box_heads]
        assert len(box_heads) == (3 if task == 'cascade-mask-rcnn' else 1)
        for head in box_heads:  # ViTDet's 4conv1fc with LayerNorm
            assert head.type == 'Shared4Conv1FCBBoxHead'
            assert head.norm_cfg.type == cfg.model.roi_head.mask_head.norm_cfg.type == \
                'vitdense.LN2d'
        assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                                                   weight_decay=0.1)
        assert cfg.train_cfg.max_iters == 184375 and cfg.train_dataloader.batch_size == 4
        if task == 'cascade-mask-rcnn':  # detectron2's proposal matchers and box weights
            stages = cfg.model.train_cfg.rcnn
            assert [stage.assigner.pos_iou_thr for stage in stages] == [0.5, 0.6, 0.7]
            assert [head.bbox_coder.target_stds[0] for head in box_heads] == [.1, .05, .033]
        jitter = next(t for t in cfg.train_dataloader.dataset.pipeline
                      if t.type == 'RandomResize')
        assert jitter.scale == (1024, 1024) and jitter.ratio_range == (0.1, 2.0)
        assert backbone.get('rel_pos_img_size', 1024) == 1024
    else:
        assert neck.num_outs == 4 and cfg.model.decode_head.in_channels == [256] * 4
        assert backbone.get('rel_pos_img_size', 512) == 512


@pytest.mark.parametrize('config', [c for c in FULL if c.split('/')[-1].startswith('mask')
                                    and '_lora_' not in c])
def test_imagenet_checkpoint_loads_with_only_the_new_tensors_missing(config):
    """The family's timm state dict (built on the meta device: shapes, no memory) adapted to
    the config's backbone: everything loads but the relative position tables, and the
    neck is new. (A LoRA recipe's model is its full recipe's with LoRA's tensors added:
    tests/configs/test_foundation_recipes.py.)"""
    timm = pytest.importorskip('timm')
    cfg = _load(config)
    cfg.model.backbone.init_cfg = None
    with torch.device('meta'):
        source = timm.create_model(TIMM_MODELS[Path(config).name.split('_')[1]]).state_dict()
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            model = MODELS.build(cfg.model)
    missing = model.backbone.load_state_dict(adapt_checkpoint(model.backbone, source),
                                             strict=False)
    assert not missing.unexpected_keys
    rel_pos = {f'blocks.{i}.attn.rel_pos.{axis}' for i in range(len(model.backbone.blocks))
               for axis in ('height', 'width')}
    assert set(missing.missing_keys) == (set() if 'xcit' in config else rel_pos)
    if 'xcit' not in config and model.backbone.pos_embed is not None:
        # the learned table without its class-token row, at the config's grid
        grid = cfg.model.backbone.get('img_size', 224) // 16
        assert model.backbone.pos_embed.weight.shape[1] == grid * grid
    assert all(not n.startswith('backbone.') for n, _ in model.named_parameters()
               if n.startswith('neck.'))
