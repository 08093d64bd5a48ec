"""Every host head family on a vitdense backbone: the hosts' own configs (``mmdet::``,
``mmseg::``), with the backbone, the widths its neck or head reads and the class count
replaced as a user replaces them, train 2 iterations on the demo sets and are scored by the
real evaluator (CocoMetric, IoUMetric); so does ViTDet's Cascade Mask R-CNN recipe of ours.
What training must do is checked at each step: finite losses, finite gradients reaching every
parameter of the backbone's trunk, predictions of the shapes the hosts' evaluators read.

Tiny on purpose (64 px images, a 4-block 32-wide backbone, R-CNN heads as wide, few
queries, proposals, sampled RoIs and detections, one thread): the heads' wiring to the
backbone and to the evaluators is what is under test, not what they learn.
"""
import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.hooks import Hook
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_ade, make_demo_coco
from vitdense.engine.tool_config import point_at_data_root

from common import CONFIGS

WIDTH = 32
IMAGE_SIZE = 64
DEMO_ARCH = dict(embed_dims=WIDTH, num_layers=4, num_heads=2)
#: the multi-layer pyramid: strides 4-32, or 8-32 for the 3-level necks
PYRAMID = dict(_delete_=True, type='vitdense.XCiT', arch=DEMO_ARCH, patch_size=8,
               pyramid_norm_cfg=dict(type='BN'), init_cfg=None)
PYRAMID_8_32 = dict(PYRAMID, pyramid_levels=(1, 2, 3))
#: ViTDet's layout: the last block's map through the simple pyramid
LAST_MAP = dict(PYRAMID, pyramid=False, out_indices=(-1,))
SIMPLE_PYRAMID = dict(_delete_=True, type='vitdense.SimpleFeaturePyramid', in_channels=WIDTH,
                      out_channels=WIDTH, scale_factors=(2.0, 1.0, 0.5, 0.25), num_outs=5)
FOUR = [WIDTH] * 4
THREE = [WIDTH] * 3
FEW_QUERIES = 20
#: what each host keeps of its proposals, denoising queries, PointRend's refined points and
#: detections, capped for the demo images' one to four objects (the hosts' counts are for
#: COCO's crowds: 100 detections through a cascade's three mask heads take a minute on a CPU)
DEMO_CAPS = {'nms_pre': 100, 'max_per_img': FEW_QUERIES, 'max_per_image': FEW_QUERIES,
             'num_dn_queries': FEW_QUERIES, 'subdivision_steps': 2,
             'subdivision_num_points': 64}
#: RoIs sampled per image, by the RPN's and the R-CNN stages' samplers (256 and 512)
SAMPLED_ROIS = 32
#: transformer heads with one encoder and two decoder layers (6 / 6 in the hosts')
DETR_LAYERS = {'model.encoder.num_layers': 1, 'model.decoder.num_layers': 2}


def mask2former_layers(head: str, train_cfg: str) -> dict:
    """Mask2Former's ``head`` with one pixel-decoder layer, two decoder layers and 256
    points sampled per mask (6, 9 and 12,544 in the hosts')."""
    return {f'model.{head}.pixel_decoder.encoder.num_layers': 1,
            f'model.{head}.transformer_decoder.num_layers': 2,
            f'model.{train_cfg}.num_points': 256}


#: the hosts' FPN width, which their RPN and RoI heads read all through (the channels of
#: these keys), made WIDTH: a cascade's mask heads at 256 channels dominate its CPU time
RCNN_WIDTH, RCNN_WIDTH_KEYS = 256, ('in_channels', 'out_channels', 'feat_channels',
                                    'conv_out_channels')

#: host config, the settings a user changes for a vitdense backbone (as --cfg-options)
DETECTORS = {
    'cascade-mask-rcnn-fpn': ('mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py',
                              {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'cascade-mask-rcnn-vitdet': ('mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py',
                                 {'model.backbone': LAST_MAP, 'model.neck': SIMPLE_PYRAMID}),
    'retinanet': ('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
                  {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'fcos': ('mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py',
             {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'atss-dyhead': ('mmdet::dyhead/atss_r50_fpn_dyhead_1x_coco.py',
                    {'model.backbone': PYRAMID, 'model.neck.0.in_channels': FOUR,
                     # DyHead's six blocks at WIDTH (256 in the host's)
                     **{key: WIDTH for key in ('model.neck.0.out_channels',
                                               'model.neck.1.in_channels',
                                               'model.neck.1.out_channels',
                                               'model.bbox_head.in_channels',
                                               'model.bbox_head.feat_channels')}}),
    'vfnet': ('mmdet::vfnet/vfnet_r50_fpn_1x_coco.py',
              {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'htc': ('mmdet::htc/htc-without-semantic_r50_fpn_1x_coco.py',
            {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'point-rend': ('mmdet::point_rend/point-rend_r50-caffe_fpn_ms-1x_coco.py',
                   {'model.backbone': PYRAMID, 'model.neck.in_channels': FOUR}),
    'rtmdet-ins': ('mmdet::rtmdet/rtmdet-ins_tiny_8xb32-300e_coco.py',
                   {'model.backbone': PYRAMID_8_32, 'model.neck.in_channels': THREE}),
    'mask2former': ('mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py',
                    {'model.backbone': PYRAMID, 'model.data_preprocessor.batch_augments': None,
                     'model.panoptic_head.in_channels': FOUR,
                     'model.panoptic_head.num_queries': FEW_QUERIES,
                     **mask2former_layers('panoptic_head', 'train_cfg')}),
    'dino': ('mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
             {'model.backbone': PYRAMID_8_32, 'model.neck.in_channels': THREE,
              'model.num_queries': FEW_QUERIES, **DETR_LAYERS}),
    'deformable-detr': ('mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
                        {'model.backbone': PYRAMID_8_32, 'model.neck.in_channels': THREE,
                         'model.num_queries': FEW_QUERIES, **DETR_LAYERS}),
    'vitdet-cascade-recipe': (
        str(CONFIGS / 'vit/cascade-mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py'),
        {'model.backbone': dict(LAST_MAP, type='vitdense.ViT', dense_class_token=False),
         'model.data_preprocessor.batch_augments': None,
         'model.neck': dict(SIMPLE_PYRAMID, norm_cfg=dict(type='LN', eps=1e-6))}),
}
SEGMENTORS = {
    'mask2former-seg': ('mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py',
                        {'model.backbone': PYRAMID, 'model.decode_head.in_channels': FOUR,
                         'model.decode_head.num_queries': FEW_QUERIES,
                         **mask2former_layers('decode_head', 'decode_head.train_cfg')}),
    'deeplabv3plus': ('mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb4-80k_ade20k-512x512.py',
                      {'model.backbone': PYRAMID, 'model.decode_head.in_channels': WIDTH,
                       'model.decode_head.c1_in_channels': WIDTH,
                       'model.auxiliary_head.in_channels': WIDTH}),
    'pspnet': ('mmseg::pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512.py',
               {'model.backbone': PYRAMID, 'model.decode_head.in_channels': WIDTH,
                'model.auxiliary_head.in_channels': WIDTH}),
    'segformer-head': ('mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py',
                       {'model.backbone': PYRAMID, 'model.decode_head.in_channels': FOUR}),
    'knet': ('mmseg::knet/knet-s3_r50-d8_upernet_8xb2-adamw-80k_ade20k-512x512.py',
             {'model.backbone': PYRAMID,
              'model.decode_head.kernel_generate_head.in_channels': FOUR,
              'model.auxiliary_head.in_channels': WIDTH}),
    'segmenter-head': ('mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py',
                       {'model.backbone': dict(LAST_MAP, type='vitdense.ViT'),
                        **{f'model.decode_head.{key}': WIDTH for key in
                           ('in_channels', 'channels', 'embed_dims')},
                        'model.decode_head.num_heads': 2}),
}
COCO_CLASSES, ADE_CLASSES = 3, 5


def _demo_sized(node, num_classes: int, was: int):
    """``node`` with every class count of the host's data set (``was``) made ``num_classes``,
    per-class loss weights (the classes' and the no-object one) cut to match, SyncBN made
    BN (one process on a CPU) and the counts of :data:`DEMO_CAPS` and the samplers capped."""
    if isinstance(node, dict):
        out = ConfigDict()
        for key, value in node.items():
            if key in DEMO_CAPS and isinstance(value, int):
                value = min(value, DEMO_CAPS[key])
            elif key == 'num' and str(node.get('type', '')).endswith('Sampler'):
                value = min(value, SAMPLED_ROIS)
            elif key in ('num_classes', 'num_things_classes') and value == was:
                value = num_classes
            elif key == 'class_weight' and isinstance(value, list) and len(value) == was + 1:
                value = value[:num_classes] + value[-1:]
            elif key == 'type' and value == 'SyncBN':
                value = 'BN'
            elif key == 'score_thr':
                value = 0.0  # an untrained head's scores: the evaluator still gets boxes
            out[key] = _demo_sized(value, num_classes, was)
        return out
    if isinstance(node, (list, tuple)):
        return type(node)(_demo_sized(value, num_classes, was) for value in node)
    return node


def _rcnn_narrowed(node):
    """``node`` with each of its :data:`RCNN_WIDTH_KEYS` of ``RCNN_WIDTH`` made WIDTH."""
    if isinstance(node, dict):
        return ConfigDict({key: WIDTH if key in RCNN_WIDTH_KEYS and value == RCNN_WIDTH
                           else _rcnn_narrowed(value) for key, value in node.items()})
    if isinstance(node, (list, tuple)):
        return type(node)(_rcnn_narrowed(value) for value in node)
    return node


def _on_demo_set(cfg: Config, demo_base: str, data_root: Path) -> None:
    """The demo set's loaders at ``IMAGE_SIZE`` in place of the host's; the host's
    evaluator, reading the demo annotations."""
    demo = Config.fromfile(str(CONFIGS / '_base_/datasets' / demo_base))
    for pipeline in (demo.train_dataloader.dataset.pipeline,
                     demo.val_dataloader.dataset.pipeline):
        for transform in pipeline:
            if transform.type == 'Resize':
                transform.scale = (IMAGE_SIZE, IMAGE_SIZE)
    cfg.train_dataloader = dict(demo.train_dataloader, batch_size=2, num_workers=0,
                                persistent_workers=False)
    cfg.val_dataloader = cfg.test_dataloader = dict(
        demo.val_dataloader, batch_size=2, num_workers=0, persistent_workers=False)
    cfg.test_evaluator = cfg.val_evaluator
    if 'ann_file' in cfg.test_evaluator:
        cfg.test_evaluator.ann_file = demo.val_evaluator.ann_file
    point_at_data_root(cfg, data_root)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None


def _float32_without_gpu(optim_wrapper: ConfigDict) -> ConfigDict:
    """A recipe's mixed-precision ``AmpOptimWrapper`` as a float32 ``OptimWrapper`` where no
    GPU is (mmengine's needs one); any other wrapper as it is."""
    if optim_wrapper.type != 'AmpOptimWrapper' or torch.cuda.is_available():
        return optim_wrapper
    return ConfigDict({key: 'OptimWrapper' if key == 'type' else value
                       for key, value in optim_wrapper.items()
                       if key not in ('dtype', 'loss_scale')})


def _unformatted(cfg: Config) -> Config:
    """``cfg``, its text not formatted by yapf: the Runner logs, dumps and saves its config's
    text five times a case, two seconds of CPU (a third of a case's) that no one reads here.
    (mmengine 0.10's ``Config.fromfile`` drops its ``format_python_code`` for a config with
    ``_base_`` files.)"""
    return Config(cfg.to_dict(), filename=cfg.filename, format_python_code=False)


def _two_iterations(host_config: str, options: dict, demo_base: str, data_root: Path,
                    num_classes: int, was: int, work_dir: Path) -> Config:
    leaf = work_dir / 'leaf.py'
    leaf.write_text(f'_base_ = {host_config!r}\n')
    cfg = _unformatted(Config.fromfile(str(leaf)))
    cfg.merge_from_dict(copy.deepcopy(options), allow_list_keys=True)
    cfg.model = _demo_sized(cfg.model, num_classes, was)
    if 'roi_head' in cfg.model:
        for part in ('neck', 'rpn_head', 'roi_head'):
            cfg.model[part] = _rcnn_narrowed(cfg.model[part])
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = (IMAGE_SIZE, IMAGE_SIZE)
        cfg.model.pretrained = None  # the ResNet / ViT checkpoint of the host's base
        cfg.model.test_cfg = dict(mode='whole')
    _on_demo_set(cfg, demo_base, data_root)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=2, val_interval=3)
    cfg.param_scheduler = []
    cfg.optim_wrapper = _float32_without_gpu(cfg.optim_wrapper)
    cfg.custom_hooks = []  # the hosts' pipeline switches and EMA belong to their full runs
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_processor = dict(by_epoch=False)
    cfg.randomness = dict(seed=0)
    cfg.work_dir = str(work_dir)
    return cfg


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """The module's tensors on one thread: they are tiny, and on two shared cores a second
    thread's hand-offs cost more than it computes (measured: seven times the CPU time of the
    training steps on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def demo_coco(tmp_path_factory) -> Path:
    return make_demo_coco(tmp_path_factory.mktemp('coco'), num_train=4, num_val=2,
                          size=IMAGE_SIZE)


@pytest.fixture(scope='module')
def demo_ade(tmp_path_factory) -> Path:
    return make_demo_ade(tmp_path_factory.mktemp('ade'), num_train=4, num_val=2,
                         size=IMAGE_SIZE)


class _Predictions(Hook):
    """Keeps the data samples each test iteration predicts."""

    def __init__(self) -> None:
        self.samples: list = []

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.samples += outputs


def _gradient_norms(backbone: torch.nn.Module) -> dict[str, list[float]]:
    """The norm of each backbone parameter's gradient at each backward, recorded as
    autograd computes it (the optimizer wrapper zeroes the gradients after its step)."""
    norms: dict[str, list[float]] = {}
    for name, param in backbone.named_parameters():
        if not param.requires_grad:
            continue
        norms[name] = []
        param.register_hook(lambda grad, got=norms[name]: got.append(grad.norm().item()))
    return norms


def _train_and_test(cfg: Config) -> tuple[dict, list]:
    """Two training iterations whose losses are finite and whose gradients reach every
    parameter of the backbone's trunk (the patch embedding first of all), finite and not
    all zero; then the test set's metrics and the predicted data samples."""
    runner = Runner.from_cfg(cfg)
    gradients = _gradient_norms(runner.model.backbone)
    predictions = _Predictions()
    runner.register_hook(predictions)
    runner.train()
    losses = np.array(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == 2 and np.isfinite(losses).all(), losses
    # the pyramid's levels that the neck or head does not read (RetinaNet's FPN starts at
    # stride 8, PSPNet reads stride 32) get none; every parameter of the trunk gets two
    missing = [name for name, norms in gradients.items()
               if len(norms) != 2 and not name.startswith('pyramid.')]
    assert not missing, f'no gradient reached backbone parameters {missing}'
    norms = np.array([norms for norms in gradients.values() if norms])
    assert norms.shape[1] == 2 and np.isfinite(norms).all() and (norms.max(axis=0) > 0).all()
    patch_embedding = next(name for name in gradients if name.startswith('patch_embed'))
    assert min(gradients[patch_embedding]) > 0, gradients[patch_embedding]
    metrics = runner.test()
    assert len(predictions.samples) == 2  # the demo set's two validation images
    return metrics, predictions.samples


@pytest.mark.parametrize('name', list(DETECTORS))
def test_detector_trains_and_is_evaluated(name, demo_coco, tmp_path):
    host_config, options = DETECTORS[name]
    cfg = _two_iterations(host_config, options, 'demo_coco.py', demo_coco, COCO_CLASSES, 80,
                          tmp_path)
    metrics, samples = _train_and_test(cfg)
    masks = 'segm' in cfg.test_evaluator.metric
    for sample in samples:
        found = sample.pred_instances
        count = len(found)
        assert 0 < count <= FEW_QUERIES  # score_thr 0: an untrained head still finds boxes
        assert found.bboxes.shape == (count, 4) and found.scores.shape == (count,)
        assert torch.isfinite(found.bboxes).all() and torch.isfinite(found.scores).all()
        assert found.labels.shape == (count,)
        assert 0 <= found.labels.min() and found.labels.max() < COCO_CLASSES
        if masks:  # one mask a box, at the size of the picture as read
            assert found.masks.shape == (count, *sample.ori_shape)
    for kind in ('bbox', 'segm') if masks else ('bbox',):
        assert 0 <= metrics[f'coco/{kind}_mAP'] <= 1, metrics


@pytest.mark.parametrize('name', list(SEGMENTORS))
def test_segmentor_trains_and_is_evaluated(name, demo_ade, tmp_path):
    host_config, options = SEGMENTORS[name]
    cfg = _two_iterations(host_config, options, 'demo_ade.py', demo_ade, ADE_CLASSES, 150,
                          tmp_path)
    metrics, samples = _train_and_test(cfg)
    for sample in samples:
        # a class score map and a label map at the size of the picture as read
        assert sample.seg_logits.data.shape == (ADE_CLASSES, *sample.ori_shape)
        labels = sample.pred_sem_seg.data
        assert labels.shape == (1, *sample.ori_shape)
        assert 0 <= labels.min() and labels.max() < ADE_CLASSES
    assert 0 <= metrics['mIoU'] <= 100, metrics
