"""benchmarks/benchmark_upsample.py: the matmul form is the transposed convolution, and the run
records both forms' times and differences."""
import json

import torch
from torch import nn

from benchmarks import benchmark_upsample as tool


def test_matmul_form_is_the_transposed_convolution():
    torch.manual_seed(0)
    conv = nn.ConvTranspose2d(6, 5, 2, stride=2).double()
    x = torch.randn(2, 6, 3, 7, dtype=torch.float64, requires_grad=True)
    ours, reference = tool.matmul_form(x, conv), conv(x)
    assert ours.shape == reference.shape == (2, 5, 6, 14)
    assert (ours - reference).abs().max() < 1e-13
    grads = [torch.autograd.grad(out.square().sum(), (x, conv.weight, conv.bias))
             for out in (ours, reference)]
    for a, b in zip(*grads):
        assert (a - b).abs().max() < 1e-12
    with torch.no_grad():
        conv.bias.add_(1.0)  # the bias reaches every output pixel of its channel
    assert (tool.matmul_form(x, conv) - conv(x)).abs().max() < 1e-13


def test_run_records_both_forms_at_both_steps(tmp_path):
    out = tmp_path / 'upsample.json'
    tool.main(['--width', '8', '--grid', '2', '3', '--threads', '1', '--repeats', '1',
               '--out', str(out)])
    results = json.loads(out.read_text())['results']
    assert [r['grid'] for r in results] == [[2, 3], [4, 6]]
    for result in results:
        assert set(result['ms']) == {f'{form} {kind}' for form in ('conv_transpose', 'matmul')
                                     for kind in ('forward', 'forward+backward')}
        assert result['max_abs_diff_out'] < 1e-5 * result['max_abs_out']
