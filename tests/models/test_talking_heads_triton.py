"""Talking heads' Triton kernel against the written-out maps: outputs and every gradient, in
Triton's interpreter on CPU tensors (a child pytest run with ``TRITON_INTERPRET=1``, which
must be set before Triton is imported), and on a GPU where one is."""
import functools
import os
import re
import subprocess
import sys

import pytest
import torch

import test_fused_attention as fused
from vitdense.analysis.memory import count_backbone
from vitdense.models import CaiT
from vitdense.models.layers import MultiheadSelfAttention
from vitdense.models.layers.talking_heads import (forced_path, talking_heads_attention,
                                                  with_logit_terms)

#: this process runs the kernels in Triton's interpreter
INTERPRETING = os.environ.get('TRITON_INTERPRET') == '1'
interpreted = pytest.mark.skipif(
    not INTERPRETING, reason='run by test_the_kernel_checks_pass_in_the_interpreter')
#: (heads, grid, relative positions, class token, batch): 35 and 36 tokens span two blocks
#: of 32 rows and keys (the interpreter's), the last one short; 6 heads (CaiT-XS) pad to 8
CASES = [(4, (5, 7), True, False, 2), (6, (5, 7), False, True, 1),
         (8, (3, 5), True, False, 1), (16, (2, 3), False, True, 1)]


@functools.lru_cache
def kernel_and_maps(heads: int, hw, rel_pos: bool, class_token: bool, batch: int,
                    dtype=None) -> tuple[dict, dict]:
    """Output and gradients by the kernel (under autocast to ``dtype`` if given) and by
    the test's written-out maps in float32 (once per case: the interpreter is slow)."""
    case = fused.talking_heads_case(hw, rel_pos, class_token, heads, batch)
    return (fused.run_talking_heads(case, hw, 'triton', dtype),
            fused.run_talking_heads(case, hw, None))


@interpreted
@pytest.mark.parametrize('heads, hw, rel_pos, class_token, batch', CASES)
def test_kernel_equals_the_written_out_maps(heads, hw, rel_pos, class_token, batch):
    fused.assert_matches(*kernel_and_maps(heads, hw, rel_pos, class_token, batch))


@interpreted
def test_a_thousandth_off_in_any_single_gradient_fails_the_parity_check():
    ours, reference = kernel_and_maps(*CASES[0])
    assert {'dq', 'dk', 'dv', 'dmix_logits', 'dmix_weights', 'dbias_weights',
            'dheight', 'dwidth'} <= ours.keys()
    for name in ours:
        wrong = dict(ours, **{name: ours[name] * 1.001})
        assert fused.worst_error(wrong, reference)[1] > fused.TOLERANCE, name


@interpreted
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_kernel_under_autocast_is_within_the_folds_error(dtype):
    fused.assert_matches(*kernel_and_maps(*CASES[0], dtype=dtype), fused.HALF_TOLERANCE[dtype])


@interpreted
def test_windowed_block_equals_its_windows_written_out():
    fused.test_windowed_talking_heads_block_equals_its_windows_written_out('triton')


@interpreted
def test_kernel_keeps_its_inputs_and_a_log_sum_exp_per_row_for_backward():
    hw = (3, 5)
    case = fused.talking_heads_case(hw, rel_pos=True, class_token=False, heads=4)
    q, k, v, (mix_logits, mix_weights), table = (case[n] for n in ('q', 'k', 'v', 'mixes',
                                                                  'table'))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        talking_heads_attention(q, k, v, 8 ** -0.5, mix_logits, mix_weights, table(q, hw),
                                path='triton')
    queries, _ = with_logit_terms(q, k, table(q, hw))
    assert max(t.numel() for t in saved) <= queries.numel()


@interpreted
def test_operator_passes_opcheck():
    from vitdense.models.layers.talking_heads_triton import talking_heads_triton
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, requires_grad=True) for _ in range(3))
    mixes = [torch.randn(4, 4, requires_grad=True) for _ in range(2)]
    torch.library.opcheck(talking_heads_triton, (q, k, v, *mixes))


@interpreted
def test_a_compiled_layer_takes_the_kernel_in_one_graph():
    """``torch.compile`` traces the operator as one call (no graph break), as eager runs."""
    torch.manual_seed(0)
    layer = MultiheadSelfAttention(32, 4, talking_heads=True, talking_heads_path='triton')
    x = torch.randn(1, 10, 32, requires_grad=True)
    compiled = torch.compile(layer, backend='aot_eager', fullgraph=True)
    inputs = dict(x=x, **dict(layer.named_parameters()))
    fused.assert_matches(fused.grads(compiled(x), inputs), fused.grads(layer(x), inputs))


@interpreted
def test_autotuning_keeps_the_blocks_whose_tiles_fit():
    from vitdense.models.layers import talking_heads_triton as kernel
    configs = [kernel.triton.Config({'BLOCK_M': m, 'BLOCK_N': n}) for m, n, _ in kernel.BLOCKS]
    kept = {heads: [(c.kwargs['BLOCK_M'], c.kwargs['BLOCK_N'])
                    for c in kernel._prune(configs, {}, HEADS_P=heads)] for heads in (4, 16)}
    assert kept == {4: [(16, 16), (32, 16), (32, 32), (64, 32), (64, 64)],
                    16: [(16, 16), (32, 16), (32, 32)]}


def test_memory_account_counts_the_kernel_as_the_cpu_operator():
    """On the meta device (the kernel's fake): its inputs and a log-sum-exp per row, as the
    CPU operator keeps, far below the written-out maps; compiled graphs see one call."""
    with torch.device('meta'):
        model = CaiT(dict(embed_dims=64, num_layers=2, num_heads=4), pyramid=False,
                     out_indices=(1,))
        images = torch.empty(2, 3, 320, 320)
    counts = {}
    for path in ('triton', 'blocks', 'maps'):
        with forced_path(model, path):
            counts[path] = count_backbone(model, images)
    assert counts['triton'] == counts['blocks'] < counts['maps'] / 2


def test_the_kernel_checks_pass_in_the_interpreter():
    """Every check above, in a child process whose Triton runs its interpreter."""
    if INTERPRETING:
        pytest.skip('this process is the interpreter run')
    child = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', __file__],
        env=dict(os.environ, TRITON_INTERPRET='1'), capture_output=True, text=True,
        timeout=600)
    report = child.stdout[-4000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    passed = re.search(r'\b(\d+) passed\b', child.stdout)
    assert passed and int(passed[1]) >= len(CASES) + 8, report  # every interpreted test


@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETING,
                    reason='needs a GPU and compiled kernels')
@pytest.mark.parametrize('heads', [4, 8, 16])
def test_kernel_on_a_gpu_equals_the_fold(heads):
    """At a size with several blocks of every autotuned shape, float32 and bfloat16."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, 300, 48, device='cuda', requires_grad=True)
               for _ in range(3))
    mix_logits, mix_weights = (m.cuda() for m in fused.mixes(heads))
    inputs = dict(q=q, k=k, v=v, mix_logits=mix_logits.weight, mix_weights=mix_weights.weight)
    for dtype, tolerance in ((torch.float32, fused.TOLERANCE),
                             (torch.bfloat16, fused.HALF_TOLERANCE[torch.bfloat16])):
        results = {}
        for path in ('triton', 'fold'):
            with torch.autocast('cuda', dtype, enabled=dtype != torch.float32):
                out = talking_heads_attention(q, k, v, 48 ** -0.5, mix_logits, mix_weights,
                                              path=path)
            results[path] = fused.grads(out.cpu(), inputs)
        fused.assert_matches(results['triton'], results['fold'], tolerance)
