"""tools/analysis_tools/plot_logs.py reads both logs mmengine writes (vis_data/scalars.json
and the text log) into the same curves, and plots and summarises them."""
import json

import pytest

from tools.analysis_tools import plot_logs

# two epochs of 16 iterations, logged every 10, validated after epoch 2 (mmengine formats)
SCALARS = [
    dict(base_lr=0.0024, lr=0.0024, data_time=0.08, loss=6.379, time=2.24, epoch=1, iter=10,
         step=10),
    dict(base_lr=0.0039, lr=0.0039, data_time=0.03, loss=5.193, time=1.67, epoch=2, iter=26,
         step=26),
    {'accuracy/top1': 10.0, 'accuracy/top5': 49.5, 'data_time': 0.19, 'time': 1.17, 'step': 2},
]
TEXT_LOG = """\
2026/11/23 12:31:12 - mmengine - INFO - Checkpoints will be saved to /work/run.
2026/11/23 12:31:35 - mmengine - INFO - Epoch(train) [1][10/16]  base_lr: 2.4000e-03 lr: 2.4000e-03  eta: 0:04:24  time: 2.2400  data_time: 0.0800  loss: 6.3790
2026/11/23 12:31:55 - mmengine - INFO - Epoch(train) [2][10/16]  base_lr: 3.9000e-03 lr: 3.9000e-03  eta: 0:02:46  time: 1.6700  data_time: 0.0300  loss: 5.1930
2026/11/23 12:32:09 - mmengine - INFO - Epoch(val) [2][2/2]    accuracy/top1: 10.0000  accuracy/top5: 49.5000  data_time: 0.1900  time: 1.1700
"""  # noqa: E501


@pytest.fixture
def run_dir(tmp_path):
    vis_data = tmp_path / 'run' / '20261123_123109' / 'vis_data'
    vis_data.mkdir(parents=True)
    (vis_data / 'scalars.json').write_text(''.join(json.dumps(r) + '\n' for r in SCALARS))
    (tmp_path / 'run' / '20261123_123109' / '20261123_123109.log').write_text(TEXT_LOG)
    return tmp_path / 'run'


def test_both_logs_give_the_same_curves(run_dir):
    path, train, val = plot_logs.read_run(str(run_dir))
    assert path.endswith('scalars.json')
    assert plot_logs.find_log(str(run_dir / '20261123_123109' / 'vis_data')) == path
    assert train['loss'] == [(10., 6.379), (26., 5.193)]
    assert val['accuracy/top1'] == [(2., 10.)]
    _, text_train, text_val = plot_logs.read_run(
        str(run_dir / '20261123_123109' / '20261123_123109.log'))
    assert text_train['loss'] == train['loss']
    assert text_train['lr'] == [(10., 0.0024), (26., 0.0039)]
    assert text_val['accuracy/top5'] == val['accuracy/top5']
    assert plot_logs.default_keys(train, val) == ['loss', 'lr', 'accuracy/top1',
                                                  'accuracy/top5']


def test_plot_and_summary(run_dir, tmp_path):
    out = tmp_path / 'curves.png'
    summary = plot_logs.main([str(run_dir), '--legend', 'vit', '--out', str(out),
                              '--json', str(tmp_path / 'summary.json')])
    assert out.stat().st_size > 0
    assert summary['vit']['train/loss'] == dict(first=6.379, last=5.193, min=5.193,
                                                max=6.379, points=2)
    assert summary['vit']['seconds_per_iter'] == pytest.approx((2.24 + 1.67) / 2)
    assert json.loads((tmp_path / 'summary.json').read_text()) == summary


def test_errors_name_the_problem(run_dir, tmp_path):
    with pytest.raises(SystemExit, match=r"no values for keys \['loss_mask'\]"):
        plot_logs.main([str(run_dir), '--keys', 'loss_mask', '--out', str(tmp_path / 'x.png')])
    with pytest.raises(SystemExit, match='no vis_data/scalars.json or .log'):
        (tmp_path / 'empty').mkdir()
        plot_logs.main([str(tmp_path / 'empty')])
    with pytest.raises(SystemExit, match='2 labels for 1 runs'):
        plot_logs.main([str(run_dir), '--legend', 'a', 'b'])
