"""The GPU report's small CPU version: records on disk as each case ends (a killed run keeps
them, a new run goes on from them), time limits, FLOP counts of the architecture against
those executed, attention kernels, and the Markdown page."""
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from common import CHECKOUT_ENV, REPO_ROOT

from benchmarks import gpu_report
from benchmarks.benchmark_lib import build_ours, count_flops
from vitdense.analysis.complexity import position_tables
from vitdense.analysis.memory import load_config
from vitdense.model_factory import build_model
from vitdense.models.layers import talking_heads
from vitdense.models.layers.attention import MultiheadSelfAttention

RATES = dict(bfloat16=1e9, float16=1e9, float32=1e9)


def _spec(family: str):
    return next(s for s in gpu_report.backbone_specs((), gpu_report.CPU)
                if s.family == family)


def test_a_run_killed_after_its_first_case_leaves_that_record(tmp_path):
    out = tmp_path / 'report.jsonl'
    cases = ['talking-heads maps 4x6', 'backbone tiny_vit cls eager']
    run = subprocess.Popen([sys.executable, '-m', 'benchmarks.gpu_report', '--device', 'cpu',
                            '--out', str(out), '--no-compile', '--cases', *cases],
                           cwd=REPO_ROOT, env=CHECKOUT_ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not gpu_report.recorded_cases(out) and run.poll() is None:
        assert time.monotonic() < deadline, 'no case recorded in 300 s'
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    lines = [json.loads(line) for line in out.read_text().splitlines()]  # every line parses
    assert lines[0]['record'] == 'run' and lines[0]['matmul_tflops']['float32'] > 0
    first = lines[1]
    assert first['case'] == cases[0] and 'error' not in first
    assert first['ms'] > 0 and first['executed_flops'] == first['model_flops'] > 0
    assert gpu_report.recorded_cases(out)[cases[0]] == first


def test_a_new_run_measures_only_the_cases_missing_and_respects_its_limits(tmp_path):
    out = tmp_path / 'report.jsonl'
    out.write_text(json.dumps(dict(record='case', case='a', kind='x')) + '\n'
                   + json.dumps(dict(record='case', case='b', error='boom')) + '\n'
                   + '{"record": "case", "case": "c", "cut sh')  # a killed run's last line
    calls = []

    def case(name: str, seconds: float = 0.):
        def measure(rates: dict) -> dict:
            calls.append(name)
            time.sleep(seconds)
            return dict(kind='x', rate=rates['float32'])
        return name, measure
    quiet = dict(log=lambda record: None)
    gpu_report.run(gpu_report.CPU, [case('a'), case('b'), case('c', 5.), case('d')], out,
                   budget_s=600, case_limit_s=0.5, **quiet)
    assert calls == ['c', 'd']  # 'a' and 'b' are recorded
    records = gpu_report.recorded_cases(out)
    assert 'stopped at the 0 s case limit' in records['c']['error']
    assert 0.5 <= records['c']['case_s'] < 2 and records['d']['rate'] > 0
    gpu_report.run(gpu_report.CPU, [case('b'), case('e')], out, budget_s=0, case_limit_s=60,
                   **quiet)  # past the budget before the first case
    assert calls == ['c', 'd'] and 'e' not in gpu_report.recorded_cases(out)
    gpu_report.run(gpu_report.CPU, [case('b'), case('e')], out, budget_s=600, case_limit_s=60,
                   retry_errors=True, **quiet)
    assert calls == ['c', 'd', 'b', 'e'] and 'error' not in gpu_report.recorded_cases(out)['b']


def _layer_flops(path: str, tokens: torch.Tensor, grid, embed_dims: int, heads: int) -> int:
    layer = MultiheadSelfAttention(embed_dims, heads, talking_heads=True, talking_heads_path=path)
    return count_flops(gpu_report.training_step(gpu_report.OnGrid(layer, grid), tokens, None))


def _resampling_flops(model: torch.nn.Module, images: torch.Tensor) -> int:
    """FLOPs of a training step spent resampling the position tables to the input's grid:
    executed, but not the architecture's (the model index and the papers leave them out)."""
    step = gpu_report.training_step(model, images, None)
    return count_flops(step) - count_flops(step, position_tables(model))


FOLDED = replace(gpu_report.CPU, talking_heads_path='fold')  # what a GPU runs at COCO's input


def test_cait_executes_the_folds_extra_flops_and_counts_the_architectures():
    spec = _spec('cait')
    size = gpu_report.CPU.dense_size
    folded = gpu_report.measure_backbone(spec, 'dense', False, FOLDED, RATES)
    chosen = gpu_report.measure_backbone(spec, 'dense', False, gpu_report.CPU, RATES)
    # the architecture's FLOPs: a real CPU step with the maps written out
    model = build_ours(spec, 'dense', size)
    images = torch.randn(1, 3, *size)
    with talking_heads.forced_path(model, 'maps'):
        maps_flops = count_flops(gpu_report.training_step(model, images, None))
        resampling = _resampling_flops(model, images)
    assert resampling > 0
    assert folded['vitdense']['model_flops'] == chosen['vitdense']['model_flops'] == \
        maps_flops - resampling
    # the fold adds, per talking-heads layer, its extra FLOPs over the maps
    grid = (size[0] // 16, size[1] // 16)
    tokens = torch.randn(1, grid[0] * grid[1], 32, requires_grad=True)
    extra = _layer_flops('fold', tokens, grid, 32, 2) - _layer_flops('maps', tokens, grid, 32, 2)
    layers = sum(isinstance(m, MultiheadSelfAttention) and m.talking_heads
                 for m in model.modules())
    assert layers == 4 and extra > 0
    assert folded['vitdense']['executed_flops'] - maps_flops == layers * extra
    # at this size a CPU writes the maps out: executed = model
    assert chosen['vitdense']['executed_flops'] == maps_flops
    kernels = folded['vitdense']['attention']
    assert [(k['kernel'], k['query'][-1], k['calls']) for k in kernels] == [
        ('flash (CPU)', 2 * 16, layers)]  # heads × head width, one call per layer
    assert chosen['vitdense']['attention'] == []


def test_vit_records_its_attention_kernel_and_a_math_fallback_fails_the_case(tmp_path):
    record = gpu_report.measure_backbone(_spec('vit'), 'cls', False, gpu_report.CPU, RATES)
    ours = record['vitdense']  # the tiny arch has no timm counterpart
    assert record['outputs'] == [[1, 32]]  # the classifier's backbone: its class token
    # three blocks over every token, the last one's queries its class token alone
    full, last = ours['attention']
    assert (full['kernel'], full['calls'], last['kernel'], last['calls']) == (
        'flash (CPU)', 3, 'flash (CPU)', 1)
    assert last['query'][2] == 1 and last['key'] == full['key']
    # the fused kernel's backward computes the logits q·kᵀ again: 2·B·H·N·M·d FLOPs
    recomputed = sum(k['calls'] * 2 * k['query'][0] * k['query'][1] * k['query'][2]
                     * k['key'][2] * k['query'][3] for k in ours['attention'])
    batch = full['query'][0]
    size = gpu_report.CPU.cls_size
    resampling = _resampling_flops(build_ours(_spec('vit'), 'cls', size),
                                   torch.randn(batch, 3, size, size))
    assert ours['executed_flops'] - ours['model_flops'] == recomputed + resampling
    assert recomputed > 0 and resampling > 0
    assert ours['model_share'] == pytest.approx(ours['model_flops'] / ours['ms'] * 1e3 / 1e9)
    query = torch.randn(1, 2, 8, 16)
    with gpu_report.AttentionKernels() as kernels:
        torch.nn.functional.scaled_dot_product_attention(query, query, query, dropout_p=0.5)
    assert [k['kernel'] for k in kernels.summary()] == ['math']
    with gpu_report.fused_attention(), pytest.raises(RuntimeError, match='No available kernel'):
        torch.nn.functional.scaled_dot_product_attention(query, query, query, dropout_p=0.5)


def test_every_talking_heads_path_a_dense_step_and_the_page(tmp_path, capsys):
    out, page = tmp_path / 'report.jsonl', tmp_path / 'gpu_report.md'
    page.write_text('# Report\n\nHow to run it.\n')
    gpu_report.main(['--device', 'cpu', '--out', str(out), '--list'])
    names = [line.split(None, 2)[-1] for line in capsys.readouterr().out.splitlines()]
    assert names[:3] == ['step mask-rcnn_r50_fpn_1x_coco',  # the dense steps first
                         'step mask-rcnn_cait-d6-p8_fpn_demo-coco',
                         'step upernet_cait-d6-p8_demo-ade']
    paths = talking_heads.available_paths(torch.device('cpu'))
    assert {'blocks', 'fold', 'maps'} <= set(paths)
    assert [n for n in names if n.startswith('talking-heads')] == [
        f'talking-heads {path} 4x6' for path in (*paths, 'sdpa')]
    assert names[-1] == 'backbone tiny_xcit dense compiled'
    gpu_report.main(['--device', 'cpu', '--out', str(out), '--docs', str(page), '--cases',
                     'talking-heads *', 'step upernet_cait-*', '--talking-heads', 'fold'])
    records = gpu_report.recorded_cases(out)
    assert len(records) == len(paths) + 2
    assert [r for r in records.values() if 'error' in r] == []
    plain = records['talking-heads sdpa 4x6']
    assert plain['attention'][0]['query'] == [2, 8, 24, 48]  # CaiT-S24's heads and widths
    assert all(r['backward_bit_identical'] for r in records.values()
               if r['kind'] == 'talking-heads')
    maps = records['talking-heads maps 4x6']['executed_flops']
    assert all(records[f'talking-heads {path} 4x6']['model_flops'] == maps for path in paths)
    assert records['talking-heads fold 4x6']['executed_flops'] > maps
    assert records['talking-heads blocks 4x6']['uncounted_ops'] == [
        'vitdense::talking_heads', 'vitdense::talking_heads_backward']
    # the segmentor's step: the fold's extra FLOPs, layer by layer, and the position
    # table's resampling are all that separate the executed count from the architecture's
    step = records['step upernet_cait-d6-p8_demo-ade [fold]']
    assert step['ms'] > 0 and step['account_gib'] > 0 and step['dtype'] == 'float32'
    cfg = load_config(str(REPO_ROOT / 'configs/cait/upernet_cait-d6-p8_demo-ade.py'))
    backbone = build_model(cfg, 'count', device='meta').backbone
    layers = [m for m in backbone.modules()
              if isinstance(m, MultiheadSelfAttention) and m.talking_heads]
    grid = (step['input'][0] // 8, step['input'][1] // 8)
    dims, heads = layers[0].qkv.in_features, layers[0].num_heads
    tokens = torch.randn(step['batch'], grid[0] * grid[1], dims, requires_grad=True)
    extra = _layer_flops('fold', tokens, grid, dims, heads) - \
        _layer_flops('maps', tokens, grid, dims, heads)
    resampling = _resampling_flops(
        backbone, torch.empty(step['batch'], 3, *step['input'], device='meta'))
    assert step['executed_flops'] - step['model_flops'] == len(layers) * extra + resampling
    assert extra > 0 and resampling > 0
    text = page.read_text()
    assert text.startswith('# Report\n\nHow to run it.\n\n' + gpu_report.RESULTS_BEGIN)
    for heading in ('### Training steps', '### Talking heads', '### Backbones'):
        assert heading in text
    fold = records['talking-heads fold 4x6']['ms']
    assert f'| fold | 4×6 | {fold:.3g} | {fold / plain["ms"]:.3g} | yes |' in text
    assert f'| upernet_cait-d6-p8_demo-ade.py | {step["batch"]} × 64×96 | float32 |' in text
    gpu_report.main(['--out', str(out), '--docs', str(page), '--render'])  # in place
    assert page.read_text() == text


def test_device_augment_case_records_both_timings_and_the_page_shows_its_share(tmp_path):
    out, page = tmp_path / 'report.jsonl', tmp_path / 'gpu_report.md'
    heading = '### Augmentation on the device against a ViT-S/16 step'
    assert heading not in gpu_report.markdown([])  # no record, no section
    gpu_report.main(['--device', 'cpu', '--out', str(out), '--docs', str(page), '--cases',
                     'device-augment *'])
    record = gpu_report.recorded_cases(out)['device-augment vs vit-s step']
    assert 'error' not in record, record.get('traceback')
    assert (record['kind'], record['batch'], record['image_sizes']) == (
        'device-augment', gpu_report.CPU.augment_batch, {'48x64': 1.0})
    part, step = record['device_part_ms']['device part'], record['vit_s_step_ms']
    assert part > 0 and step > 0
    assert record['device_part_percent']['device part'] == pytest.approx(100 * part / step)
    share = record['device_part_percent']['device part']
    assert (f'| 2 | 48x64 | {step:.3g} | float32 | device part | {part:.3g} | {share:.1f} % '
            '| 5 % |') in page.read_text().split(heading)[1]


def test_floors_set_and_the_mask_rcnn_step_by_stage(tmp_path, capsys):
    out, page = tmp_path / 'report.jsonl', tmp_path / 'gpu_report.md'
    gpu_report.main(['--device', 'cuda', '--out', str(out), '--list', '--cases', 'floors'])
    names = [line.split(None, 2)[-1] for line in capsys.readouterr().out.splitlines()]
    assert names == [
        'step mask-rcnn_r50_fpn_1x_coco+amp', 'step mask-rcnn_vit-b-p16_fpn_3x_coco',
        'step mask-rcnn_cait-s24-p16_fpn_3x_coco', 'step mask-rcnn_cait-xxs24-p16_fpn_3x_coco',
        'step upernet_vit-b-p16_8xb2-160k_ade20k-512x512',
        'step upernet_cait-s24-p16_8xb2-160k_ade20k-512x512',
        'step upernet_cait-xxs24-p16_8xb2-160k_ade20k-512x512',
        'stages mask-rcnn_r50_fpn_1x_coco+amp', 'stages mask-rcnn_vit-b-p16_fpn_3x_coco',
        'talking-heads triton 50x84', 'talking-heads sdpa 50x84',
        'backbone vit_base_patch16_224 cls eager']
    gpu_report.main(['--device', 'cpu', '--out', str(out), '--docs', str(page), '--cases',
                     'stages *'])
    (record,) = gpu_report.recorded_cases(out).values()
    assert 'error' not in record, record.get('traceback')
    assert (record['config'], record['optimizer'], record['param_groups']) == (
        'mask-rcnn_vit-d6-p8_fpn_demo-coco.py', 'AdamW', 2)  # with and without decay
    assert set(record['ms']) == {'step', 'backbone', 'neck', 'heads', 'optimizer'}
    assert all(ms > 0 for ms in record['ms'].values())
    ms = record['ms']
    assert record['parts_over_step'] == pytest.approx(
        (ms['backbone'] + ms['neck'] + ms['heads'] + ms['optimizer']) / ms['step'])
    assert '### Mask R-CNN steps by stage' in page.read_text()
    assert f'| mask-rcnn_vit-d6-p8_fpn_demo-coco.py | 4 × 64×96 | float32 | AdamW | 2 | ' \
        f'{ms["step"]:.3g} |' in page.read_text()
