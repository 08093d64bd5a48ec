"""vitdense/analysis/complexity.py: FLOPs are 2 per multiply-add, multiply-adds are FLOPs over
``FLOPS_PER_MULTIPLY_ADD``, torch's fused CPU attention counts as the written-out one, and a
config's count on the meta device is its count on the CPU."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitdense.analysis.complexity import (FLOPS_PER_MULTIPLY_ADD, analyse, count_flops,
                                          count_multiply_adds, forward_multiply_adds,
                                          load_config)
from vitdense.model_factory import build_model

from common import REPO_ROOT


def test_a_linear_map_costs_one_multiply_add_per_weight_and_row():
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    assert count_multiply_adds(lambda: linear(x)) == 5 * 8 * 4
    assert count_flops(lambda: linear(x)) == FLOPS_PER_MULTIPLY_ADD * 5 * 8 * 4 == 320


def test_fused_cpu_attention_counts_as_the_explicit_products():
    q = torch.randn(2, 3, 10, 8)
    fused = count_multiply_adds(lambda: F.scaled_dot_product_attention(q, q, q))
    with sdpa_kernel(SDPBackend.MATH):
        explicit = count_multiply_adds(lambda: F.scaled_dot_product_attention(q, q, q))
    assert fused == explicit == 2 * (2 * 3) * 10 * 10 * 8  # QKᵀ and AV


def test_mask2former_on_the_meta_device_counts_as_on_the_cpu():
    """mmcv's deformable attention reads the levels' shapes as numbers, so the meta-device
    count runs Mask2Former's head on the CPU: the total is the whole model's on the CPU."""
    config = str(REPO_ROOT / 'configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py')
    cfg = load_config(config)
    on_cpu = forward_multiply_adds(build_model(cfg, 'count', device='cpu'), cfg, (64, 64))
    assert analyse(config, (64, 64))['flops'] == on_cpu > 0
