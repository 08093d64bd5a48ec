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
#: (heads, grid, relative positions, class token, batch, head width): 18 and 7 tokens
#: divide no block (16, 32 or 64 rows or keys), so every block is short; the first case,
#: two images, spans two blocks of 16 (the float32 key blocks and the keys' gradients'
#: query blocks), the others one; 64 wide with the 3 + 6 relative-position columns is 73
#: (5 slices of 16, the last one short)
CASES = [(4, (3, 6), True, False, 2, 64), (8, (2, 3), False, True, 1, 48),
         (16, (2, 3), False, True, 1, 48)]
#: a small case for half precision
HALF_CASE = (4, (3, 5), False, False, 1, 48)


@functools.lru_cache
def kernel_and_maps(heads: int, hw, rel_pos: bool, class_token: bool, batch: int,
                    width: int, dtype=None) -> tuple[dict, dict]:
    """Output and gradients by the kernel (under autocast to ``dtype`` if given) and by
    the test's written-out maps in float32 (once per case: the interpreter is slow)."""
    case = fused.talking_heads_case(hw, rel_pos, class_token, heads, batch, width)
    return (fused.run_talking_heads(case, hw, 'triton', dtype),
            fused.run_talking_heads(case, hw, None))


@interpreted
@pytest.mark.parametrize('heads, hw, rel_pos, class_token, batch, width', CASES)
def test_kernel_equals_the_written_out_maps(heads, hw, rel_pos, class_token, batch, width):
    fused.assert_matches(*kernel_and_maps(heads, hw, rel_pos, class_token, batch, width))


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
    fused.assert_matches(*kernel_and_maps(*HALF_CASE, dtype=dtype), fused.HALF_TOLERANCE[dtype])


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
def test_gradients_are_the_same_bits_from_run_to_run():
    """No atomics: every gradient element is written by one program, the mixes' partials
    are summed by torch."""
    from vitdense.models.layers.talking_heads_triton import talking_heads_triton
    torch.manual_seed(0)
    inputs = [torch.randn(2, 2, 19, 16, requires_grad=True) for _ in range(3)]
    inputs += [torch.randn(2, 2, requires_grad=True) for _ in range(2)]
    probe = torch.randn(2, 2, 19, 16)
    runs = [torch.autograd.grad(talking_heads_triton(*inputs)[0], inputs, probe)
            for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@interpreted
def test_operator_passes_opcheck():
    from vitdense.models.layers.talking_heads_triton import talking_heads_triton
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    mixes = [torch.randn(2, 2, requires_grad=True) for _ in range(2)]
    torch.library.opcheck(talking_heads_triton, (q, k, v, *mixes))


@interpreted
def test_a_compiled_layer_takes_the_kernel_in_one_graph():
    """``torch.compile`` traces the operator as one call (no graph break), as eager runs."""
    torch.manual_seed(0)
    layer = MultiheadSelfAttention(16, 2, talking_heads=True, talking_heads_path='triton')
    x = torch.randn(1, 10, 16, requires_grad=True)
    compiled = torch.compile(layer, backend='aot_eager', fullgraph=True)
    inputs = dict(x=x, **dict(layer.named_parameters()))
    fused.assert_matches(fused.grads(compiled(x), inputs), fused.grads(layer(x), inputs))


def test_autotuning_is_keyed_on_the_token_count_and_prunes_by_heads_and_precision():
    from vitdense.models.layers import talking_heads_triton as kernel
    from vitdense.models.layers.talking_heads_triton_tiles import BLOCKS
    for dtype, product_precision in ((torch.bfloat16, 'tf32'), (torch.float32, 'ieee')):
        for name, launch in kernel.launches(4, 48, 48, dtype, 2, 300, 300).items():
            assert {'TOKENS_P2', 'PRECISION'} <= set(launch.kernel.keys), name
            assert launch.sizes['TOKENS_P2'] == 512
            blocks = BLOCKS[launch.name][product_precision]
            shapes = [(c.kwargs['BLOCK_M'], c.kwargs['BLOCK_N'], c.num_stages, c.num_warps)
                      for c in launch.configs]
            assert sorted(shapes) == sorted(blocks), name
            wide = kernel.launches(16, 48, 48, dtype, 2, 300, 300)[name]
            assert len(wide.configs) == 1 and wide.configs[0] in launch.configs


def test_heads_split_across_programs_divide_the_heads():
    from vitdense.models.layers.talking_heads_triton_tiles import (FLOAT32_GROUP_PAIRS,
                                                                   GROUP_PAIRS, group_size)
    for dtype, table in ((torch.bfloat16, GROUP_PAIRS), (torch.float32, FLOAT32_GROUP_PAIRS)):
        for heads in range(1, 17):
            for kernel, pairs in table.items():
                group = group_size(kernel, heads, dtype)
                assert heads % group == 0 and (group == 1 or group * heads <= pairs)
    assert [group_size('forward', h, torch.bfloat16) for h in (4, 6, 8, 16)] == [4, 2, 2, 1]
    assert [group_size('dq', h, torch.float32) for h in (2, 4, 8)] == [2, 1, 1]


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
        timeout=1200)
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
