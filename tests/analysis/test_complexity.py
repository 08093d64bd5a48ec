"""vitdense/analysis/complexity.py: FLOPs are 2 per multiply-add, multiply-adds are FLOPs over
``FLOPS_PER_MULTIPLY_ADD``, and torch's fused CPU attention counts as the written-out one."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitdense.analysis.complexity import (FLOPS_PER_MULTIPLY_ADD, count_flops,
                                          count_multiply_adds)


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
