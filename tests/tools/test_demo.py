"""README command (1)'s job, tools/demo.py, end to end on a tiny generated set: it trains for
its budget, is scored by mmdet's COCO evaluator and leaves the table and the picture; resumed
after it finished, it trains no further."""
import re
import subprocess
import sys

import cv2

from vitdense.demo_data import make_demo_coco

from common import CHECKOUT_ENV, REPO_ROOT


def test_demo_trains_evaluates_and_draws(tmp_path):
    data_root = make_demo_coco(tmp_path / 'coco', num_train=4, num_val=3, size=96)
    work = tmp_path / 'work'
    result = subprocess.run(
        [sys.executable, 'tools/demo.py', '--minutes', '0.05', '--data-root', str(data_root),
         '--work-dir', str(work), '--num-pictures', '2'],
        cwd=REPO_ROOT, capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = (work / 'metrics.md').read_text().splitlines()
    assert [row.split('|')[1].strip() for row in rows[2:]] == ['bbox', 'segm']
    for row in rows[2:]:
        assert all(0 <= float(v) <= 1 or v.strip() == '-1.000' for v in row.split('|')[2:-1])
    assert 'predictions.png' in result.stdout and '| segm |' in result.stdout
    picture = cv2.imread(str(work / 'predictions.png'))
    assert picture is not None and picture.shape[1] >= 2 * 96

    # A finished run resumed goes on with no budget left: it trains nothing more (same
    # iteration count, same checkpoint) and evaluates again.
    iterations = re.search(r'backbone, (\d+) iterations', result.stdout).group(1)
    assert (work / 'last_checkpoint').read_text().endswith(f'iter_{iterations}.pth')
    resumed = subprocess.run(
        [sys.executable, 'tools/demo.py', '--minutes', '0.05', '--data-root', str(data_root),
         '--work-dir', str(work), '--num-pictures', '2', '--resume'],
        cwd=REPO_ROOT, capture_output=True, text=True, env=CHECKOUT_ENV)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert 'nothing left to train' in resumed.stdout
    assert f'backbone, {iterations} iterations' in resumed.stdout
    assert [p.name for p in work.glob('*.pth')] == [f'iter_{iterations}.pth']
