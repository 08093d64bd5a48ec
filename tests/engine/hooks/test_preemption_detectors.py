"""The demo Mask R-CNN and UperNet as shipped (each run draws its seed; one persistent loader
worker; an endless sampler; an iteration loop), trained through tools/train.py on the 64 px
demo sets: SIGTERM to the process group mid-run exits 75, and ``--resume`` ends bit for bit
where the uninterrupted run of that seed ends; so does ``--resume`` from that run's
intermediate checkpoint."""
from __future__ import annotations

import pytest

from vitdense.checkpoint_io import safe_load
from vitdense.engine import PREEMPTED_EXIT_CODE

from common import CONFIGS, largest_difference, shipped_leaf, train_to_end

#: each demo's config and the fixture of its data set
DEMOS = {'mask-rcnn': (CONFIGS / 'xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', 'demo_coco_root'),
         'upernet': (CONFIGS / 'xcit/upernet_xcit-d6-p8_demo-ade.py', 'demo_ade_root')}
ITERATIONS, CHECKPOINT_AT, STOPPED_AFTER = 4, 3, 2
#: the run's length, and a checkpoint of iteration 3 kept beside the last one
RUN = (f'train_cfg = dict(max_iters={ITERATIONS})\n'
       f'default_hooks = dict(checkpoint=dict(interval={CHECKPOINT_AT}, max_keep_ckpts=2))\n')


@pytest.mark.parametrize('demo', DEMOS)
def test_the_shipped_demo_stops_and_resumes_exactly_with_its_drawn_seed(tmp_path, demo,
                                                                         request):
    # SIGTERM to the group after iteration 2 (the launcher's signal reaches the loader worker
    # too): exit 75 with that iteration's checkpoint, and --resume ends on the weights of the
    # uninterrupted run of the seed drawn. --resume from that run's checkpoint of iteration 3
    # ends there too; neither resumed run warns of another seed.
    config, data_set = DEMOS[demo]
    data_root = request.getfixturevalue(data_set)
    leaf = shipped_leaf(tmp_path / 'leaf.py', config, data_root, RUN)
    work = tmp_path / 'stopped'
    # 'training': after iteration iterations_per_epoch + 1
    status, log = train_to_end(shipped_leaf(tmp_path / 'signalled.py', config, data_root, RUN,
                                            'training', STOPPED_AFTER - 1), work)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    stop = work / f'iter_{STOPPED_AFTER}.pth'
    assert (work / 'last_checkpoint').read_text() == str(stop)
    seed = safe_load(str(stop))['meta']['seed']
    status, log = train_to_end(leaf, work, '--resume')
    assert status == 0, log[-3000:]

    full = tmp_path / 'full'
    status, log = train_to_end(leaf, full, '--cfg-options', f'randomness.seed={seed}')
    assert status == 0, log[-3000:]
    reference = safe_load(str(full / f'iter_{ITERATIONS}.pth'))['state_dict']
    assert largest_difference(work / f'iter_{ITERATIONS}.pth', reference) == 0

    work = tmp_path / 'from_checkpoint'
    status, log = train_to_end(leaf, work, '--resume', str(full / f'iter_{CHECKPOINT_AT}.pth'))
    assert status == 0, log[-3000:]
    assert 'resumes a checkpoint of seed' not in log
    assert largest_difference(work / f'iter_{ITERATIONS}.pth', reference) == 0
