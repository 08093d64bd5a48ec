"""The backbone benchmark: its measuring pieces and one tiny run end to end (no timed asserts)."""
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import benchmark as tool
from benchmarks import benchmark_lib as bm
from vitdense.models.layers.embed import resample_position_table


def test_interleaved_timing_alternates_order_and_repeats_each_step():
    calls = []
    steps = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    samples = bm.time_interleaved(steps, warmup=1, repeats=3, min_repeat_s=0.)
    assert [len(v) for v in samples.values()] == [3, 3]
    assert calls == ['a', 'b'] + ['a', 'b', 'b', 'a', 'a', 'b']
    summary = bm.summarize_times([2., 1., 3.], batch=4)
    assert summary['step_s'] == 2. and summary['images_per_s'] == 2.


def test_paired_ratio_cancels_a_load_change_that_the_ratio_of_medians_keeps():
    """The machine gets 5x slower from the third sample pair on, just after the slow step
    of that pair ran: pairwise the other step is 10% faster throughout."""
    fast = [1., 1., 1., 5., 5.]
    slow = [1.1, 1.1, 5.5, 5.5, 5.5]
    assert bm.paired_ratio(slow, fast) == pytest.approx(1.1)
    assert sorted(slow)[2] / sorted(fast)[2] == pytest.approx(5.5)


def test_flops_count_fused_attention_on_cpu_like_explicit_attention():
    q = torch.randn(2, 3, 10, 8)
    fused = bm.count_flops(lambda: F.scaled_dot_product_attention(q, q, q))
    with bm.attention_backend('explicit'):
        explicit = bm.count_flops(lambda: F.scaled_dot_product_attention(q, q, q))
    assert fused == explicit == 2 * 2 * (2 * 3) * 10 * 10 * 8  # QKᵀ and AV, 2 per MAC
    linear = torch.nn.Linear(8, 4)
    assert bm.count_flops(lambda: linear(torch.randn(5, 8))) == 2 * 5 * 8 * 4


MEMORY_METER_SCRIPT = """
import json, torch
from benchmarks import benchmark_lib as bm
meter = bm.MemoryMeter('cpu')
big = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB before the measured step: not an activation
print(json.dumps(meter.measure(lambda: torch.ones(128 * 2 ** 20 // 4).add_(1), warmup=0)))
"""


@pytest.mark.skipif(not Path('/proc/self/clear_refs').exists(), reason='Linux /proc only')
def test_memory_meter_sees_the_peak_of_the_measured_step_only():
    """Run in a fresh process, as the tool does: the resident size of a long test session
    holds freed memory that the allocator would reuse instead of growing."""
    import json
    import os
    import subprocess
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072')
    out = subprocess.run([sys.executable, '-c', MEMORY_METER_SCRIPT], env=env, check=True,
                         capture_output=True, text=True, cwd=bm.ROOT).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert 120 < result['activation_mb'] < 200
    assert result['memory_mb'] >= result['activation_mb'] + 60


def test_a_failing_probe_reports_an_error_instead_of_numbers():
    result = bm.probe_memory([sys.executable, '-c', 'import sys; sys.exit(3)'], {})
    assert 'exited with 3' in result['memory_error']


def test_backbone_pairs_share_weights_and_outputs():
    spec = bm.backbone_specs()['xcit_nano_12_p16_224']
    for task in bm.TASKS:
        models = bm.build_backbone_pair(spec, task, 64)
        assert set(models) == {bm.OURS, bm.TIMM}
        assert bm.max_abs_difference(models, torch.randn(2, 3, 64, 64)) < 1e-4


def test_presets_expand_to_unique_cases_and_unknown_models_are_refused():
    cases = tool.expand_cases(tool.parse_args(['--preset', 'floors']))
    assert len(cases) == len(set(cases))
    assert bm.Case('xcit_small_12_p16_224', 'dense', 896, 1, 'infer', 'explicit') in cases
    with pytest.raises(SystemExit, match='unknown models'):
        tool.expand_cases(tool.parse_args(['--models', 'vit_gigantic']))


def test_memory_growth_and_scaling_plot(tmp_path):
    def record(size, tokens, memory):
        return dict(model='m', task='dense', img_size=size, batch=1, mode='infer',
                    attention='fused', tokens=tokens,
                    impls={bm.OURS: dict(memory_mb=memory, activation_mb=memory / 2,
                                         ms_per_image=tokens / 10)})
    results = [record(224, 196, 100.), record(448, 784, 380.), record(896, 3136, 1500.)]
    growth = {row['factor']: row for row in tool.memory_growth(results)}
    assert growth[4]['memory_ratio'] == pytest.approx(3.8)
    assert growth[16]['time_ratio'] == pytest.approx(16.)
    plot = bm.plot_scaling(results, tmp_path / 'curves.png')
    assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert bm.plot_scaling(results[:1], tmp_path / 'none.png') is None
    for row in results:  # --no-memory: the memory panel says so instead of failing
        row['impls'][bm.OURS]['memory_mb'] = None
    assert bm.plot_scaling(results, tmp_path / 'time_only.png').exists()


def test_tiny_run_end_to_end_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / 'run'
    tool.main(['--models', 'vit_tiny_patch16_224', '--tasks', 'dense', '--sizes', '32', '64',
               '--repeats', '1', '--min-repeat-s', '0', '--threads', '1', '--out', str(out)])
    assert 'vitdense vs timm' in capsys.readouterr().out
    report = json.loads(out.with_suffix('.json').read_text())
    assert report['meta']['threads'] == 1 and 'load_average' in report['meta']
    first = report['results'][0]
    assert first['tokens'] == 4 and first['max_abs_diff'] < 1e-4
    for impl in (bm.OURS, bm.TIMM):
        values = first['impls'][impl]
        assert values['images_per_s'] > 0 and values['memory_mb'] > 0
        assert len(values['samples_s']) == 1
    # the same arithmetic as timm's, plus our position table (built for the 2 × 2 grid of a
    # 32-px input) taken to the input's grid by two small matrix products (identities here)
    with FlopCounterMode(display=False) as resampling:
        resample_position_table(torch.zeros(1, 1 + 2 * 2, 192), (2, 2), (2, 2), 1)
    assert resampling.get_total_flops() > 0
    assert first['impls'][bm.OURS]['gflops'] == pytest.approx(
        first['impls'][bm.TIMM]['gflops'] + resampling.get_total_flops() / 1e9, rel=1e-9)
    assert first['impls'][bm.TIMM]['gflops'] > 0
    assert first['speed_ratio'] > 0
    assert report['meta']['summary']['memory_growth']
    assert out.with_suffix('.png').exists()


def test_timing_in_fresh_processes_pools_their_samples(tmp_path):
    out = tmp_path / 'processes'
    tool.main(['--models', 'vit_tiny_patch16_224', '--tasks', 'cls', '--sizes', '32',
               '--repeats', '2', '--min-repeat-s', '0', '--threads', '1', '--processes', '2',
               '--no-memory', '--no-flops', '--out', str(out)])
    (record,) = json.loads(out.with_suffix('.json').read_text())['results']
    assert len(record['speed_ratio_per_process']) == 2
    assert all(ratio > 0 for ratio in record['speed_ratio_per_process'])
    for impl in (bm.OURS, bm.TIMM):
        assert len(record['impls'][impl]['samples_s']) == 4
