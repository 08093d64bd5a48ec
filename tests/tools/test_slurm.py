"""The SLURM scripts under a stand-in ``srun`` (tests/tools/fake_slurm: the tasks start on this
machine with SLURM's variables, signals passed on as srun does) and ``scontrol``: two CPU
processes train with ``--launcher slurm``; USR1 to the sbatch job script (what
``--signal=B:USR1@120`` sends) saves the iteration in progress, requeues the job and exits
with status 75; the requeued job resumes there, every process from the same checkpoint."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vitdense.checkpoint_io import safe_load
from vitdense.demo_data import make_demo_imagenet
from vitdense.engine import PREEMPTED_EXIT_CODE

from common import CHECKOUT_ENV, REPO_ROOT

FAKE_SLURM = Path(__file__).parent / 'fake_slurm'
CONFIG = 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'


@pytest.fixture(scope='module')
def imagenet_root(tmp_path_factory) -> Path:
    return make_demo_imagenet(tmp_path_factory.mktemp('in10'), num_train=2, num_val=1, size=72)


def _options(root: Path) -> list[str]:
    """3 epochs of 2 iterations per process (10 images each, batches of 8), one checkpoint
    at the end."""
    return ['--cfg-options', *[f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
                               for key in (f'dataset.data_root={root}', 'num_workers=0',
                                           'persistent_workers=False')],
            'train_dataloader.batch_size=8', 'val_dataloader.batch_size=5',
            'train_cfg.max_epochs=3', 'train_cfg.val_interval=3',
            'default_hooks.checkpoint.interval=3', 'default_hooks.logger.interval=1',
            'randomness.seed=0', 'randomness.deterministic=True']


def test_sbatch_job_saves_on_usr1_requeues_and_resumes(imagenet_root, tmp_path):
    work = tmp_path / 'work'
    env = {**CHECKOUT_ENV, 'PATH': f'{FAKE_SLURM}:{os.environ["PATH"]}', 'SLURM_NTASKS': '2',
           'SLURM_JOB_ID': '7771', 'SLURM_SUBMIT_DIR': str(REPO_ROOT), 'PYTHON': sys.executable,
           'SCONTROL_LOG': str(tmp_path / 'scontrol.log'), 'OMP_NUM_THREADS': '1'}
    command = ['bash', 'tools/slurm/train.sbatch', CONFIG, str(work), *_options(imagenet_root)]
    job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    log = []
    for line in job.stdout:
        log.append(line)
        if re.search(r'Epoch\(train\) +\[2\]\[1/2\]', line):  # in the middle of epoch 2
            job.send_signal(signal.SIGUSR1)
            break
    log += job.stdout.readlines()
    assert job.wait(timeout=120) == PREEMPTED_EXIT_CODE, ''.join(log)[-3000:]
    stopped = [int(i) for i in re.findall(r'rank \d: stopped by a preemption signal after '
                                          r'iteration (\d+)', ''.join(log))]
    assert len(stopped) == 2 and stopped[0] == stopped[1] and stopped[0] in (3, 4, 5)
    checkpoint = work / f'iter_{stopped[0]}.pth'
    assert safe_load(str(checkpoint))['meta']['iter'] == stopped[0]
    assert (work / 'last_checkpoint').read_text() == str(checkpoint)
    assert (tmp_path / 'scontrol.log').read_text() == 'requeue 7771\n'

    again = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for rank in (0, 1):
        assert f'rank {rank} of 2: --resume: resuming from {checkpoint}' in again.stdout
    assert safe_load(str(work / 'epoch_3.pth'))['meta']['iter'] == 6
