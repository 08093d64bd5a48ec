"""The compile benchmark end to end on a tiny backbone (aot_eager: no C++ build)."""
import json

import pytest

from benchmarks import benchmark_compile as tool
from vitdense.models import backbone_families

from common import TINY_ARCH


def test_compile_benchmark_counts_graphs_and_times_both_steps(tmp_path, monkeypatch):
    def tiny_pyramid_vit(name, size):
        assert name == 'vit_small_patch16_224'
        return backbone_families()['vit'](dict(TINY_ARCH), out_type='featmap', pyramid=True,
                                          img_size=size)

    monkeypatch.setattr(tool, 'build_pyramid_backbone', tiny_pyramid_vit)
    out = tmp_path / 'compile.json'
    tool.main(['--models', 'vit_small_patch16_224', '--batch', '1', '--size', '32',
               '--second-size', '48', '--backend', 'aot_eager', '--repeats', '1',
               '--device', 'cpu', '--out', str(out)])
    report = json.loads(out.read_text())
    [record] = report['results']
    # one static graph for 32², one with symbolic sizes from 48² on, no graph break
    assert record['graphs'] == 2 and record['graph_breaks'] == 0
    assert record['compile_s'] > 0 and record['second_size_compile_s'] > 0
    assert record['eager_s'] > 0 and record['compiled_s'] > 0 and record['speed_up'] > 0
    assert report['meta']['backend'] == 'aot_eager'


def test_unknown_model_is_refused():
    with pytest.raises(SystemExit, match=r"unknown models \['vit_nonexistent'\]"):
        tool.main(['--models', 'vit_nonexistent'])
