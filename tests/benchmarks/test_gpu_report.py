"""The GPU report's small CPU version: every case measured (or its error named), the
results file and the Markdown table written."""
import json

from benchmarks import gpu_report


def test_cpu_report_measures_every_case(tmp_path):
    out, docs = tmp_path / 'report.json', tmp_path / 'gpu_report.md'
    gpu_report.main(['--device', 'cpu', '--out', str(out), '--docs', str(docs)])
    report = json.loads(out.read_text())
    results = {r['case']: r for r in report['results']}
    assert [r for r in results.values() if 'error' in r or 'skipped' in r] == []
    backbones = [r for name, r in results.items() if name.startswith('backbone')]
    assert len(backbones) == 8  # four families, 224-like and COCO-like input
    for record in backbones:
        assert record['gflop_step'] > 0 and record['vitdense compile_s'] > 0
        assert 0 < record['vitdense eager share'] and 0 < record['vitdense compiled share']
    steps = [r for name, r in results.items() if name.startswith('step')]
    assert [r['config'] for r in steps] == [
        'mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', 'upernet_xcit-d6-p8_demo-ade.py',
        'mask-rcnn_r50_fpn_1x_coco.py']
    assert all(r['step_ms'] > 0 and r['account_gib'] > 0 for r in steps)
    assert report['meta']['matmul_tflops']['cls'] > 0
    page = docs.read_text()
    assert 'tiny_xcit' in page and 'mask-rcnn_r50_fpn_1x_coco.py' in page
