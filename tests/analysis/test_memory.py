"""vitdense.analysis.memory (tools/analysis_tools/memory.py): what it counts on the meta device is what a real step on
this CPU saves, and what freeing that step's graph gives back to the system."""
import copy
import json
import subprocess
import sys
from unittest import mock

import pytest
import torch
from mmengine.registry import MODELS

from vitdense.analysis import memory, saved_tensors
from vitdense.model_factory import build_model
from vitdense.models.layers import talking_heads

from common import CHECKOUT_ENV, REPO_ROOT, TINY_BACKBONES

DET = 'configs/cait/mask-rcnn_cait-d6-p8_fpn_demo-coco.py'
SEG = 'configs/convit/upernet_convit-d6-p8_demo-ade.py'
VITDET = 'configs/vit/mask-rcnn_vit-d6-p8_vitdet_demo-coco.py'
PANOPTIC = 'configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py'


def tiny(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS.build(TINY_BACKBONES[family])


@pytest.mark.parametrize('path', ['maps', 'fold'])
@pytest.mark.parametrize('amp', [False, True])
@pytest.mark.parametrize('family', list(TINY_BACKBONES))
def test_meta_count_equals_what_a_real_cpu_step_saves(family, amp, path):
    """Same storages on both devices: the fused-attention stand-in keeps what torch's CPU
    kernel keeps, and the half-precision policy casts alike (float16 on meta, bfloat16 on
    the CPU: the same sizes)."""
    model = tiny(family)
    images = torch.randn(2, 3, 64, 96)
    # talking heads as a GPU takes them (the fold recomputed in backward, or the maps), on
    # the CPU too
    with talking_heads.forced_path(model, path):
        real = memory.count_backbone(model, images, amp)
        meta = memory.count_backbone(copy.deepcopy(model).to('meta'), images.to('meta'), amp)
    assert real > 0
    assert meta == real


@pytest.mark.parametrize('path', ['maps', 'fold'])
@pytest.mark.parametrize('family', ['vit', 'cait', 'convit'])
def test_meta_count_equals_a_real_cpu_step_with_windows_and_relative_positions(
        family, path):
    """With windows (padded) and relative positions too, the meta count is what a real CPU
    step saves."""
    torch.manual_seed(0)
    model = MODELS.build(dict(TINY_BACKBONES[family], pyramid=False, out_indices=(-1,),
                              dense_class_token=False, window_size=3,
                              window_block_indexes=(0, 2), use_rel_pos=True, rel_pos_img_size=96))
    images = torch.randn(2, 3, 64, 96)
    with talking_heads.forced_path(model, path):
        real = memory.count_backbone(model, images)
        meta = memory.count_backbone(copy.deepcopy(model).to('meta'), images.to('meta'))
    assert real > 0
    assert meta == real


def test_half_precision_policy_follows_cuda_autocast():
    x, weight = torch.randn(2, 4), torch.randn(3, 4)
    with saved_tensors.HalfPrecisionPolicy(torch.bfloat16):
        hidden = torch.nn.functional.linear(x, weight)
        normed = torch.nn.functional.layer_norm(hidden, (3,))
        mixed = hidden + normed
    assert (hidden.dtype, normed.dtype, mixed.dtype) == (torch.bfloat16, torch.float32,
                                                         torch.float32)


RSS_PROBE = """
import gc, json, sys, torch
from vitdense.analysis import memory
from mmengine.registry import MODELS
from common import TINY_BACKBONES
def rss():
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status')
                if l.startswith('VmRSS'))
torch.manual_seed(0)
model = MODELS.build(dict(TINY_BACKBONES[sys.argv[2]], out_indices=[0, 1, 2, 3])).train()
images = torch.randn(2, 3, 256, 384)
count = memory.count_backbone(model, images)
gc.collect()
outs = model(images)
held = rss()
out_bytes = sum(o.untyped_storage().nbytes() for o in outs)
del outs
gc.collect()
print(json.dumps(dict(count=count, released=held - rss(), outputs=out_bytes)))
"""


@pytest.mark.parametrize('family', ['cait', 'convit'])
def test_count_matches_the_memory_a_real_graph_holds(family):
    """Freeing a real step's graph gives back the counted bytes plus the outputs (glibc
    made to map every allocation of 16 KiB or more, and to give freed memory back)."""
    env = dict(CHECKOUT_ENV, PYTHONPATH=f'{REPO_ROOT}:{REPO_ROOT / "tests"}',
               MALLOC_MMAP_THRESHOLD_='16384', MALLOC_TRIM_THRESHOLD_='0')
    result = json.loads(subprocess.run(
        [sys.executable, '-c', RSS_PROBE, str(REPO_ROOT), family], env=env, check=True,
        capture_output=True, text=True).stdout.splitlines()[-1])
    count, released = result['count'], result['released']
    assert count > 1 << 20
    assert 0.97 * count <= released <= count + result['outputs'] + (1 << 20)


def test_largest_training_inputs_of_the_shipped_recipes():
    det = memory.load_config(str(REPO_ROOT / 'configs/cait/mask-rcnn_cait-s24-p16_fpn_3x_coco.py'))
    seg = memory.load_config(str(
        REPO_ROOT / 'configs/cait/upernet_cait-s24-p16_8xb2-160k_ade20k-512x512.py'))
    assert memory.largest_training_input(det) == (800, 1344)
    assert memory.largest_training_input(seg) == (512, 512)


@pytest.mark.parametrize('config', [DET, SEG, PANOPTIC])
def test_account_of_a_whole_model(config):
    result = memory.account(str(REPO_ROOT / config), batch=2, shape=(96, 128))
    assert result['grads'] == result['params'] and result['optimizer'] == 2 * result['params']
    for precision in ('fp32', 'amp'):
        entry = result[precision]
        assert entry['peak'] == (result['params'] + result['grads'] + result['optimizer']
                                 + entry['activations'])
    assert 0 < result['amp']['activations'] < result['fp32']['activations']


def test_fsdp_account_divides_the_states_and_not_the_activations():
    config = str(REPO_ROOT / 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py')
    whole = memory.account(config, batch=2, amp=False)
    sharded = memory.account(config, batch=2, amp=False, fsdp_world_size=4)
    fsdp = sharded['fsdp']
    assert 'fsdp' not in whole and fsdp['world_size'] == 4
    for key in ('params', 'grads'):  # padded to 4 rows per tensor at most
        assert whole[key] / 4 <= fsdp[key] <= 1.02 * whole[key] / 4
    assert fsdp['optimizer'] == 2 * fsdp['grads']  # LAMB: two tensors per parameter
    block = 12 * 128 * 128 + 13 * 128  # qkv, proj, fc1, fc2: weights, biases; two norms
    assert fsdp['gathered'] == 3 * 4 * block  # float32 bytes of 2 blocks + 1 block's grads
    activations = whole['fp32']['activations']
    assert sharded['fp32'] == dict(activations=activations, peak=(
        fsdp['params'] + fsdp['grads'] + fsdp['optimizer'] + fsdp['gathered'] + activations))


def test_sharded_bytes_split_the_first_dimension_padded():
    tensors = [torch.empty(10, 3), torch.empty(4), torch.empty(())]
    # 10 rows over 4 ranks: 3 rows each; 4 over 4: 1; a scalar is one row, kept whole
    assert memory.sharded_bytes(tensors, 4) == 4 * (3 * 3 + 1 + 1)


@pytest.mark.parametrize('config', [DET, VITDET])
def test_float32_stand_ins_count_what_half_precision_kernels_save(config, monkeypatch):
    """A detector's RPN, RoIAlign, box and mask heads under mixed precision on the CPU, their
    convolutions and linear maps computed in float32 (the CPU's bfloat16 kernels are ~20x
    slower), save and are counted as with the bfloat16 kernels. (Proposals, NMS and sampling
    are left out: their choices turn on values, which the two ways round apart.)"""
    torch.manual_seed(0)
    cfg = memory.load_config(str(REPO_ROOT / config))
    model = build_model(cfg, 'count', device='cpu').train()
    roi = model.roi_head
    with torch.no_grad():
        shapes = [f.shape for f in model.extract_feat(torch.randn(2, 3, 96, 128))]
    features = tuple(torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
                     for shape in shapes)
    corners = torch.rand(40, 2) * torch.tensor([64., 48.])
    rois = torch.cat([torch.arange(40)[:, None] % 2, corners,
                      corners + 8 + 24 * torch.rand(40, 2)], dim=1)

    def heads_count(kernels: frozenset) -> int:
        monkeypatch.setattr(saved_tensors, 'FLOAT_KERNELS_ON_CPU', kernels)
        saved = saved_tensors.SavedTensors(tuple(model.parameters()) + tuple(model.buffers()))
        with saved.recording(), saved_tensors.HalfPrecisionPolicy(torch.bfloat16, saved):
            # outputs held, as a loss holds its graph: a freed storage's key may be reused
            outputs = [model.rpn_head(features)]
            for extractor, head in ((roi.bbox_roi_extractor, roi.bbox_head),
                                    (roi.mask_roi_extractor, roi.mask_head)):
                outputs.append(head(extractor(features[:extractor.num_inputs], rois)))
        return saved.bytes

    stand_ins = heads_count(saved_tensors.FLOAT_KERNELS_ON_CPU)
    assert saved_tensors.FLOAT_KERNELS_ON_CPU >= {'conv2d', 'linear'} and stand_ins > 1 << 20
    assert stand_ins == heads_count(frozenset({'roi_align'}))  # RoIAlign has no CPU bfloat16


def test_float32_stand_ins_give_the_half_precision_gradients():
    """Backward through the stand-ins (the saved originals made float32 again) gives the
    gradients of the bfloat16 kernels, to bfloat16's precision."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 4 * 4, 5))
    images = torch.randn(2, 3, 6, 6)

    def gradients(kernels: frozenset) -> list:
        net.zero_grad()
        saved = saved_tensors.SavedTensors(tuple(net.parameters()))
        with mock.patch.object(saved_tensors, 'FLOAT_KERNELS_ON_CPU', kernels), saved.recording(), \
                saved_tensors.HalfPrecisionPolicy(torch.bfloat16, saved):
            net(images).float().square().sum().backward()
        return [p.grad.clone() for p in net.parameters()]

    for ours, native in zip(gradients(saved_tensors.FLOAT_KERNELS_ON_CPU), gradients(frozenset())):
        assert (ours - native).norm() <= 1e-2 * native.norm()


def test_deformable_attention_is_counted_as_its_gpu_kernel_keeps_it():
    """mmcv's deformable attention run on the CPU within deformable_attention_as_on_gpu:
    its torch path's output, and what is kept for backward is what mmcv's CUDA function
    saves (values, level shapes, sampling locations and attention weights in the values'
    dtype), not the sampled maps."""
    from mmcv.ops import multi_scale_deform_attn
    torch.manual_seed(0)
    shapes = torch.tensor([[8, 8], [4, 4]])
    value = torch.randn(2, 80, 4, 8, requires_grad=True)  # (batch, keys, heads, head width)
    locations = torch.rand(2, 30, 4, 2, 3, 2, requires_grad=True)  # 2 levels, 3 points
    weights = torch.rand(2, 30, 4, 2, 3, requires_grad=True)
    plain = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
        value, shapes, locations, weights)
    saved = saved_tensors.SavedTensors()
    with saved_tensors.deformable_attention_as_on_gpu(), saved.recording():
        kernel = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
            value, shapes, locations, weights)
    assert torch.equal(kernel, plain) and kernel.requires_grad
    assert saved.bytes == sum(t.untyped_storage().nbytes()
                              for t in (value, shapes, locations, weights))
    with saved_tensors.deformable_attention_as_on_gpu():
        half = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch
        saved = saved_tensors.SavedTensors()
        with saved.recording():
            half(value.detach().bfloat16().requires_grad_(), shapes, locations, weights)
    assert saved.bytes == (value.numel() + locations.numel() + weights.numel()) * 2 + \
        shapes.untyped_storage().nbytes()


def test_counting_without_keeping_counts_what_keeping_counts():
    """SavedTensors(keep=False), with which the heads run on the CPU: the same bytes as a
    count that keeps the graph's tensors, while the saved storages are freed as the forward
    lets them go (counted still, their keys free for new storages); no backward."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                              torch.nn.LayerNorm(64), torch.nn.Linear(64, 64))
    images = torch.randn(32, 64, requires_grad=True)
    counts = {}
    for keep in (True, False):
        saved = saved_tensors.SavedTensors(tuple(net.parameters()), keep=keep)
        with saved.recording():
            outputs = [net(images * step).sum() for step in range(3)]  # new storages each
        counts[keep] = saved.bytes
        if not keep:
            with pytest.raises(RuntimeError, match='keep=True'):
                outputs[0].backward()
            assert saved.freed > 0 and saved.bytes == counts[True]
    assert counts[True] == counts[False] > 3 * 32 * 256 * 4
