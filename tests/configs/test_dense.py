"""Every shipped dense config of the pyramid and ViTDet layouts: recipe as in the XCiT paper,
consistent widths, and its model (backbone shortened to 4 blocks, the rest as configured) takes
a training step with the config's own optimizer and predicts, on a tiny synthetic batch,
calling no compiled mmcv op that the torch-native backend lacks. The adapter layout's configs
(interactions placed by block index, a trunk inside the adapter) are built whole and trained
on the demo sets by tests/configs/test_adapter_configs.py."""
import copy
import functools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS, DefaultScope

from vitdense.compat.mmcv_ext import IMPLEMENTED
from vitdense.model_factory import register_host

from common import REPO_ROOT, groups_by_parameter_name

FAMILIES = ('xcit', 'vit', 'cait', 'convit')
CONFIGS = sorted(str(p.relative_to(REPO_ROOT)) for family in FAMILIES
                 for task in ('mask-rcnn', 'upernet', 'fpn')
                 for p in (REPO_ROOT / 'configs' / family).glob(f'{task}_*.py')
                 if '_adapter_' not in p.name)
FULL = [c for c in CONFIGS if '_demo-' not in c]
#: the XCiT paper's recipes (ViTDet's: tests/configs/test_vitdet.py)
COLUMNAR_FULL = [c for c in FULL if '_vitdet_' not in c]
IMAGE_HW = (64, 80)
RECIPES = {  # XCiT paper §4.2-4.3: lr, weight decay, images per GPU, length
    'mask-rcnn': (1e-4, 0.05, 2, ('max_epochs', 36)),
    'upernet': (6e-5, 0.01, 2, ('max_iters', 160000)),
    'fpn': (6e-5, 0.01, 2, ('max_iters', 80000)),
}


@functools.lru_cache(maxsize=None)
def _parsed(config: str) -> Config:
    cfg = Config.fromfile(str(REPO_ROOT / config))
    register_host(cfg)
    return cfg


def _load(config: str) -> Config:
    """A private copy of the parsed config (parsing resolves mmdet:: / mmseg:: bases, slow)."""
    return copy.deepcopy(_parsed(config))


def _embed_dims(cfg: Config) -> int:
    backbone = cfg.model.backbone
    return MODELS.get(backbone.type).resolve_arch(backbone.arch)['embed_dims']


def _head_widths(cfg: Config) -> list:
    model = cfg.model
    if 'neck' in model:
        widths = list(model.neck.in_channels)
    else:
        widths = list(model.decode_head.in_channels) + [model.auxiliary_head.in_channels]
    if model.get('neck', {}).get('type') == 'FPN' and 'decode_head' in model:
        widths += [model.neck.out_channels] + list(model.decode_head.in_channels)
    return widths


def test_every_family_and_task_is_shipped():
    names = {Path(c).name for c in FULL}
    for task, suffix in (('mask-rcnn', '_fpn_3x_coco'), ('upernet', '_8xb2-160k_ade20k-512x512'),
                         ('fpn', '_8xb2-80k_ade20k-512x512')):
        for model in ('xcit-t12-p16', 'xcit-t12-p8', 'xcit-s12-p16', 'xcit-s12-p8',
                      'xcit-s24-p16', 'xcit-s24-p8', 'xcit-m24-p16', 'xcit-m24-p8',
                      'vit-s-p16', 'vit-b-p16', 'cait-xxs24-p16', 'cait-s24-p16',
                      'convit-ti-p16', 'convit-s-p16', 'convit-b-p16'):
            assert f'{task}_{model}{suffix}.py' in names


@pytest.mark.parametrize('config', COLUMNAR_FULL)
def test_full_config_follows_the_recipe(config):
    cfg = _load(config)
    task = Path(config).name.split('_')[0]
    lr, weight_decay, batch, (length_key, length) = RECIPES[task]
    imports = ['vitdense', 'vitdense.det'] if task == 'mask-rcnn' else ['vitdense']
    assert cfg.custom_imports == dict(imports=imports, allow_failed_imports=False)
    assert cfg.default_scope == ('mmdet' if task == 'mask-rcnn' else 'mmseg')
    assert cfg.model.backbone.type.startswith('vitdense.')
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    assert cfg.optim_wrapper.constructor == 'vitdense.LayerDecayOptimWrapperConstructor'
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=lr, betas=(0.9, 0.999),
                                               weight_decay=weight_decay)
    assert cfg.train_dataloader.batch_size == batch
    assert cfg.train_cfg[length_key] == length
    assert set(_head_widths(cfg)) == {_embed_dims(cfg)}
    if task == 'mask-rcnn':  # DETR-style multi-scale augmentation, float16 mixed precision
        assert any(t.type == 'RandomChoice' for t in cfg.train_dataloader.dataset.pipeline)
        assert (cfg.optim_wrapper.type, cfg.optim_wrapper.dtype) == ('AmpOptimWrapper',
                                                                     'float16')
    else:
        assert cfg.param_scheduler[1].type == 'PolyLR' and cfg.param_scheduler[1].end == length


def _set_backbone_width(model: Config, width: int) -> None:
    """Point every input that reads the backbone (and Semantic FPN's FPN) at ``width``."""
    if model.get('neck', {}).get('type') == 'vitdense.SimpleFeaturePyramid':
        model.neck.in_channels = width
        if 'decode_head' in model:
            model.auxiliary_head.in_channels = model.neck.out_channels = width
            model.decode_head.in_channels = [width] * 4
        return
    if 'neck' in model:
        model.neck.in_channels = [width] * 4
    if model.type == 'EncoderDecoder' and 'neck' in model:
        model.neck.out_channels = width
    if 'decode_head' in model:
        model.decode_head.in_channels = [width] * 4
    if 'auxiliary_head' in model:
        model.auxiliary_head.in_channels = width


def _shrink_heads(model: Config) -> None:
    """Narrow the heads (same layers, fewer channels) and sample fewer RoIs."""
    if model.type == 'MaskRCNN':
        model.neck.out_channels = 32
        model.rpn_head.update(in_channels=32, feat_channels=32)
        roi = model.roi_head
        roi.bbox_roi_extractor.out_channels = roi.mask_roi_extractor.out_channels = 32
        roi.bbox_head.update(in_channels=32, fc_out_channels=64)
        roi.mask_head.update(in_channels=32, conv_out_channels=32)
        model.train_cfg.rpn_proposal.max_per_img = 64
        model.train_cfg.rcnn.sampler.num = 32
        model.test_cfg.rpn.max_per_img = 64
    else:
        model.data_preprocessor.size = IMAGE_HW  # instead of padding to 512×512
        model.decode_head.channels = 32
        if 'auxiliary_head' in model:
            model.auxiliary_head.channels = 16


def _downsized(config: str) -> Config:
    """The config with a 4-block backbone of head width 8 and narrow heads; the layers, the
    pyramid, the optimizer and everything else as shipped (window attention in the blocks
    among the first 4 that have it; the last block's map for a simple pyramid)."""
    cfg = _load(config)
    backbone = cfg.model.backbone
    arch = MODELS.get(backbone.type).resolve_arch(backbone.arch)
    arch.update(num_layers=4, embed_dims=8 * arch['num_heads'])
    if 'num_local_layers' in arch:
        arch['num_local_layers'] = 2
    backbone.update(arch=arch, init_cfg=None,
                    out_indices=(0, 1, 2, 3) if backbone.get('pyramid', True) else (-1,))
    if 'window_block_indexes' in backbone:
        backbone.window_block_indexes = [i for i in backbone.window_block_indexes if i < 4]
    _set_backbone_width(cfg.model, arch['embed_dims'])
    _shrink_heads(cfg.model)
    return cfg


def _det_batch(num_classes: int) -> dict:
    from mmdet.testing import demo_mm_inputs
    return demo_mm_inputs(batch_size=2, image_shapes=(3, *IMAGE_HW), num_items=[3, 2],
                          num_classes=num_classes, with_mask=True)


def _seg_batch(num_classes: int) -> dict:
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    rng = np.random.default_rng(0)
    inputs, samples = [], []
    for _ in range(2):
        inputs.append(torch.from_numpy(rng.integers(0, 256, (3, *IMAGE_HW), dtype=np.uint8)))
        label = torch.from_numpy(rng.integers(0, num_classes, (1, *IMAGE_HW)))
        sample = SegDataSample(gt_sem_seg=PixelData(data=label))
        sample.set_metainfo(dict(img_shape=IMAGE_HW, ori_shape=IMAGE_HW, pad_shape=IMAGE_HW))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _model_key(config: str) -> str:
    cfg = _downsized(config)
    return json.dumps([cfg.model.to_dict(), cfg.optim_wrapper.to_dict()], sort_keys=True,
                      default=str)


# configs whose downsized models are identical (e.g. S12 and S24) share one run
_UNIQUE: dict = {}
for _config in CONFIGS:
    _UNIQUE.setdefault(_model_key(_config), _config)


class _RecordingExt:
    """Stands for ``mmcv._ext`` in mmcv's op modules and counts which functions are called."""

    def __init__(self, ext, calls: Counter) -> None:
        self._ext, self._calls = ext, calls

    def __getattr__(self, name: str):
        func = getattr(self._ext, name)

        def recorded(*args, **kwargs):
            self._calls[name] += 1
            return func(*args, **kwargs)
        return recorded


@pytest.fixture
def mmcv_ext_calls(monkeypatch) -> Counter:
    """Calls of mmcv's compiled-op functions during the test, whichever extension serves them."""
    import mmcv.ops  # noqa: F401  (loads mmcv._ext and every op module)
    ext, calls = sys.modules['mmcv._ext'], Counter()
    for name, module in list(sys.modules.items()):
        if name.startswith('mmcv.ops.') and getattr(module, 'ext_module', None) is ext:
            monkeypatch.setattr(module, 'ext_module', _RecordingExt(ext, calls))
    return calls


# What the models' training and test steps call (the torch-native backend's whole remit).
MMCV_OPS = {'mmdet': {'nms', 'roi_align_forward', 'roi_align_backward'}, 'mmseg': set()}


def _cpu_optim_wrapper(model, optim_cfg: Config, monkeypatch):
    """The config's optimizer wrapper; a mixed-precision one (the detection recipe), which
    needs a GPU, is built as configured (CUDA's presence faked), then its optimizer (our
    constructor's parameter groups) is stepped by a plain wrapper: the torch-native RoIAlign
    has no half-precision CPU kernel, and mmengine's CPU autocast only bfloat16."""
    if optim_cfg.get('type') != 'AmpOptimWrapper':
        return build_optim_wrapper(model, optim_cfg)
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    amp = build_optim_wrapper(model, optim_cfg)
    plain = build_optim_wrapper(model, {k: v for k, v in optim_cfg.items()
                                        if k not in ('type', 'dtype', 'loss_scale')})
    assert isinstance(amp, AmpOptimWrapper) and amp.cast_dtype == torch.float16
    assert [(len(g['params']), g['lr'], g['weight_decay']) for g in amp.param_groups] == \
        [(len(g['params']), g['lr'], g['weight_decay']) for g in plain.param_groups]
    return OptimWrapper(amp.optimizer)


@pytest.mark.parametrize('config', sorted(_UNIQUE.values()))
def test_train_step_and_inference(config, mmcv_ext_calls, monkeypatch):
    cfg = _downsized(config)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
        model.init_weights()
        optim_wrapper = _cpu_optim_wrapper(model, cfg.optim_wrapper, monkeypatch)
        is_det = cfg.default_scope == 'mmdet'
        num_classes = (cfg.model.roi_head.bbox_head.num_classes if is_det
                       else cfg.model.decode_head.num_classes)
        batch = (_det_batch if is_det else _seg_batch)(num_classes)
        before = [p.detach().clone() for p in model.backbone.parameters()]
        log_vars = model.train_step(batch, optim_wrapper)
        assert torch.isfinite(log_vars['loss'].detach())
        changed = [not torch.equal(b, p) for b, p in zip(before, model.backbone.parameters())]
        trained = [p.requires_grad for p in model.backbone.parameters()]
        assert sum(c for c, t in zip(changed, trained) if t) > 0.9 * sum(trained)
        assert not any(c for c, t in zip(changed, trained) if not t)  # frozen stages stay
        model.eval()
        with torch.no_grad():
            predictions = model.val_step(batch)
    assert set(mmcv_ext_calls) == MMCV_OPS[cfg.default_scope] <= IMPLEMENTED
    assert len(predictions) == 2
    for prediction in predictions:
        if is_det:
            masks = prediction.pred_instances.masks
            assert masks.shape[1:] == IMAGE_HW and len(masks) <= 100
        else:
            assert prediction.pred_sem_seg.data.shape == (1, *IMAGE_HW)


# #params (millions) of the XCiT paper: Table 5 (Mask R-CNN) per patch size; Table 6 per model
# (the p16 and p8 rows agree to 0.1M): (Semantic FPN, UperNet)
TABLE5 = {('t12', 16): 26.1, ('t12', 8): 25.8, ('s12', 16): 44.3, ('s12', 8): 43.1,
          ('s24', 16): 65.8, ('s24', 8): 64.5, ('m24', 16): 101.1, ('m24', 8): 98.9}
TABLE6 = {'t12': (8.4, 33.7), 's12': (30.4, 52.4), 's24': (51.8, 73.8), 'm24': (90.8, 109.0)}


def _count(config: str, skip: str = '') -> int:
    """Parameters of the full-size model (built on the meta device: no memory, no init)."""
    cfg = _load(config)
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device('meta'):
        model = MODELS.build(cfg.model)
    return sum(p.numel() for n, p in model.named_parameters() if not (skip and n.startswith(skip)))


@pytest.mark.parametrize('size, patch', sorted(TABLE5))
def test_mask_rcnn_sizes_are_table_5(size, patch):
    """Our Mask R-CNN models have exactly the paper's sizes (Table 5 truncates to 0.1M)."""
    count = _count(f'configs/xcit/mask-rcnn_xcit-{size}-p{patch}_fpn_3x_coco.py')
    assert int(count / 1e5) / 10 == TABLE5[size, patch]


@pytest.mark.parametrize('size', sorted(TABLE6))
def test_segmentation_sizes_are_table_6_without_the_learned_pyramid(size):
    """Table 6 gives one size per model for both patch sizes: it matches our patch-8 models
    without their only learned pyramid layer (backbone.pyramid.fpn1, a 2×2 transposed conv,
    4·C² + C parameters); patch-16 models have a deeper stem and two more transposed convs."""
    paper_fpn, paper_upernet = TABLE6[size]
    fpn = _count(f'configs/xcit/fpn_xcit-{size}-p8_8xb2-80k_ade20k-512x512.py',
                 skip='backbone.pyramid.fpn1.')
    upernet = _count(f'configs/xcit/upernet_xcit-{size}-p8_8xb2-160k_ade20k-512x512.py',
                     skip='backbone.pyramid.fpn1.')
    assert abs(fpn / 1e6 - paper_fpn) < 0.1
    assert abs(upernet / 1e6 - paper_upernet) < 0.1


DEMO_MASK_RCNN = [c for c in CONFIGS if Path(c).name.startswith('mask-rcnn_')
                  and '_demo-' in c]


@pytest.mark.parametrize('config', DEMO_MASK_RCNN)
def test_roi_heads_pool_the_features_at_the_boxes(config):
    """The RoI features Mask R-CNN pools from our pyramid (mmcv's RoIAlign, which indexes
    raw NCHW buffers) are torchvision's stride-aware RoIAlign of the same maps. Before the
    backbone returned contiguous maps they were scrambled, and the box / mask heads of every
    transformer detector sat at chance (bbox mAP 0.02 where ResNet-18 reached 0.69)."""
    from torchvision.ops import roi_align

    cfg = _downsized(config)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model).eval()
    extractor = model.roi_head.bbox_roi_extractor
    rois = torch.tensor([[0., 3., 5., 40., 30.], [1., 20., 10., 60., 50.]])  # level 0 boxes
    with torch.no_grad():
        features = model.extract_feat(torch.randn(2, 3, *IMAGE_HW))
        pooled = extractor(features[:extractor.num_inputs], rois)
        expected = roi_align(features[0], rois, extractor.roi_layers[0].output_size,
                             spatial_scale=1 / 4, sampling_ratio=0, aligned=True)
    torch.testing.assert_close(pooled, expected)


# drop_path_rate of the official XCiT dense configs (facebookresearch/xcit,
# detection/configs/xcit, semantic_segmentation/configs/xcit/{sem_fpn,upernet}); the same
# for patch sizes 16 and 8
OFFICIAL_DROP_PATH = {
    'mask-rcnn': {'t12': 0.0, 's12': 0.05, 's24': 0.1, 'm24': 0.15},
    'upernet': {'t12': 0.0, 's12': 0.05, 's24': 0.1, 'm24': 0.15},
    'fpn': {'t12': 0.0, 's12': 0.05, 's24': 0.1, 'm24': 0.2},
}
XCIT_FULL = [c for c in COLUMNAR_FULL if Path(c).name.split('_')[1].startswith('xcit-')]


@pytest.mark.parametrize('config', XCIT_FULL)
def test_xcit_configs_are_the_official_ones(config):
    """Stochastic depth as released (Semantic FPN M24 trains with 0.2, UperNet / Mask R-CNN
    M24 with 0.15), SyncBN in the stem / LPI and the pyramid, and the official forward on
    inputs that are not multiples of 32."""
    task, model = Path(config).name.split('_')[:2]
    size, patch = model.split('-')[1:3]
    backbone = _load(config).model.backbone
    assert backbone.drop_path_rate == OFFICIAL_DROP_PATH[task][size]
    assert backbone.patch_size == int(patch[1:])
    assert backbone.norm_cfg == backbone.pyramid_norm_cfg == dict(type='SyncBN')
    assert backbone.padding == 'stem'


@pytest.mark.parametrize('config', FULL)
def test_batch_norms_in_the_backbone_are_synchronised(config):
    """Every family's dense config makes the backbone's BatchNorms SyncBatchNorm (statistics
    over all 16 images of the 8 × 2 batch, as the official XCiT code), not per-GPU BN."""
    cfg = _downsized(config)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        backbone = MODELS.build(cfg.model.backbone)
    batch_norms = [m for m in backbone.modules()
                   if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert all(isinstance(m, torch.nn.SyncBatchNorm) for m in batch_norms)
    if cfg.model.backbone.type == 'vitdense.XCiT':  # 1 per stem conv, 1 per LPI, 1 pyramid
        stem = 4 if cfg.model.backbone.patch_size == 16 else 3
        pyramid = cfg.model.backbone.patch_size == 16 and cfg.model.backbone.get('pyramid', True)
        assert len(batch_norms) == stem + 4 + pyramid


#: the frozen-backbone recipe optimises no backbone parameter (tests/configs/test_probe.py)
@pytest.mark.parametrize('config', [c for c in COLUMNAR_FULL
                                    if 'xcit-s12-p16' in c and '-frozen_' not in c])
def test_weight_decay_spares_only_the_layer_norms(config, monkeypatch):
    """The official dense configs' rule (custom_keys {'norm': decay_mult 0}): the backbone's
    LayerNorms take no weight decay; biases, BatchNorms, LayerScale, XCA temperatures, the
    position projection, the pyramid, neck and heads all do."""
    cfg = _downsized(config)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
        optim_wrapper = _cpu_optim_wrapper(model, cfg.optim_wrapper, monkeypatch)
    groups = groups_by_parameter_name(model, optim_wrapper.optimizer)
    assert len(groups) == sum(1 for _ in model.parameters())
    no_decay = {n for n, g in groups.items() if g['weight_decay'] == 0}
    layer_norms = {f'{prefix}.{name}' for prefix, module in model.named_modules()
                   if isinstance(module, torch.nn.LayerNorm)
                   for name, _ in module.named_parameters()}
    assert layer_norms and no_decay == layer_norms
    assert all(n.startswith('backbone.blocks.') for n in no_decay)
    weight_decay = cfg.optim_wrapper.optimizer.weight_decay
    for name in ('backbone.blocks.0.attn.qkv.bias', 'backbone.blocks.0.attn.temperature',
                 'backbone.blocks.0.ls1.gamma', 'backbone.blocks.0.lpi.bn.weight',
                 'backbone.pos_embed.token_projection.weight', 'backbone.pyramid.fpn1.1.bias'):
        assert groups[name]['weight_decay'] == weight_decay, name
