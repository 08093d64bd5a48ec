"""README command (1)'s job, tools/demo.py, end to end on a tiny generated set: it trains for
its budget, is scored by mmdet's COCO evaluator and leaves the table and the picture; resumed
after it finished, it trains no further."""
import re
import shlex

import cv2
from mmengine.visualization import Visualizer

from tools import demo
from vitdense.demo_data import make_demo_coco

from common import forget_instances, instances_kept
from test_guide_commands import bounds, guide_commands

#: README's command (``python tools/demo.py``) with the guide test's bounds, as its argv
README_ARGV = next(shlex.split(command.expanded + bounds('README.md', command.expanded))[2:]
                   for command in guide_commands('README.md')
                   if command.expanded.startswith('python tools/demo.py'))


def _demo(capsys, *argv: str) -> str:
    """What ``python tools/demo.py ARGV`` prints, run in this process (no interpreter start:
    the imports take as long as the run). As a new process, it starts without the visualizers
    of earlier runs: mmengine keeps them by a name that is a time to the second, and a run
    started in the same second as another would take over the other's."""
    with instances_kept(Visualizer):
        forget_instances(Visualizer)
        demo.main(list(argv))
    return capsys.readouterr().out


def test_demo_trains_evaluates_and_draws(tmp_path, capsys, monkeypatch):
    # README's command as tests/test_guide_commands.py would run it (its NOT_RUN names this
    # test), from a folder whose data/demo_coco holds a small demo set
    make_demo_coco(tmp_path / 'data/demo_coco', num_train=4, num_val=3, size=96)
    monkeypatch.chdir(tmp_path)
    out = _demo(capsys, *README_ARGV)
    work = tmp_path / 'work_dirs/demo_mask-rcnn_xcit'
    rows = (work / 'metrics.md').read_text().splitlines()
    assert [row.split('|')[1].strip() for row in rows[2:]] == ['bbox', 'segm']
    for row in rows[2:]:
        assert all(0 <= float(v) <= 1 or v.strip() == '-1.000' for v in row.split('|')[2:-1])
    assert 'predictions.png' in out and '| segm |' in out
    picture = cv2.imread(str(work / 'predictions.png'))
    assert picture is not None and picture.shape[1] >= 2 * 96

    # A finished run resumed goes on with no budget left: it trains nothing more (same
    # iteration count, same checkpoint) and evaluates again.
    iterations = re.search(r'backbone, (\d+) iterations', out).group(1)
    assert (work / 'last_checkpoint').read_text().endswith(f'iter_{iterations}.pth')
    resumed = _demo(capsys, *README_ARGV, '--resume')
    assert 'nothing left to train' in resumed
    assert f'backbone, {iterations} iterations' in resumed
    assert [p.name for p in work.glob('*.pth')] == [f'iter_{iterations}.pth']
