"""The SLURM scripts under a stand-in ``srun``: tools/slurm_train.sh and tools/slurm_test.sh
start their tool with mmdet's usage and variables, and name a missing argument; under
tests/tools/fake_slurm (the tasks start on this machine with SLURM's variables, signals passed on as srun does) and ``scontrol``: two CPU
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

from common import CHECKOUT_ENV, REPO_ROOT, Watched

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


def _srun_command(tmp_path: Path, script: str, *args: str, **variables: str):
    """What ``tools/<script>`` runs, under an ``srun`` that prints its command line."""
    (tmp_path / 'srun').write_text('#!/bin/sh\necho srun "$@"\n')
    (tmp_path / 'python').write_text('#!/bin/sh\n')  # imports torch, as far as the script asks
    for tool in ('srun', 'python'):
        (tmp_path / tool).chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in (
        'GPUS', 'GPUS_PER_NODE', 'CPUS_PER_TASK', 'GRES', 'SRUN_ARGS')},
        'PATH': f'{tmp_path}:{os.environ["PATH"]}', 'PYTHON': str(tmp_path / 'python'),
        **variables}
    return subprocess.run(['bash', f'tools/{script}', *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_train_and_test_scripts_start_their_tool_under_srun(tmp_path):
    # mmdet's usage and variables: 16 tasks, 8 a node, 4 cores a task, extra srun options.
    python, tools = tmp_path / 'python', REPO_ROOT / 'tools'
    variables = dict(GPUS='16', GPUS_PER_NODE='8', CPUS_PER_TASK='4', SRUN_ARGS='--qos=low -x n1')
    srun = ('srun -p part --job-name=job --gres=gpu:8 --ntasks=16 --ntasks-per-node=8 '
            '--cpus-per-task=4 --kill-on-bad-exit=1 --qos=low -x n1')
    train = _srun_command(tmp_path, 'slurm_train.sh', 'part', 'job', 'cfg.py', 'work', '--resume',
                          **variables)
    assert train.stdout.strip() == (f'{srun} {python} -u {tools}/train.py cfg.py '
                                    '--work-dir=work --resume --launcher=slurm'), train.stderr
    test = _srun_command(tmp_path, 'slurm_test.sh', 'part', 'job', 'cfg.py', 'w.pth', '--out',
                         'r.pkl', **variables)
    assert test.stdout.strip() == (f'{srun} {python} -u {tools}/test.py cfg.py w.pth --out '
                                   'r.pkl --launcher=slurm'), test.stderr
    # Defaults: GPUS=8 on one node, 5 cores a task; GRES= asks no GPU (CPU nodes).
    small = _srun_command(tmp_path, 'slurm_test.sh', 'p', 'j', 'c.py', 'w.pth', GPUS='2', GRES='')
    assert small.stdout.startswith('srun -p p --job-name=j --ntasks=2 --ntasks-per-node=2 '
                                   '--cpus-per-task=5 --kill-on-bad-exit=1 '), small.stderr


def test_scripts_name_a_missing_argument(tmp_path):
    train = _srun_command(tmp_path, 'slurm_train.sh', 'part', 'job', 'cfg.py')
    assert train.returncode == 2 and not train.stdout
    assert train.stderr.startswith('slurm_train.sh: WORK_DIR missing; usage: ')
    assert 'PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]' in train.stderr
    test = _srun_command(tmp_path, 'slurm_test.sh', 'part')
    assert test.returncode == 2 and test.stderr.startswith('slurm_test.sh: JOB_NAME missing')


def test_sbatch_job_saves_on_usr1_requeues_and_resumes(imagenet_root, tmp_path):
    work = tmp_path / 'work'
    env = {**CHECKOUT_ENV, 'PATH': f'{FAKE_SLURM}:{os.environ["PATH"]}', 'SLURM_NTASKS': '2',
           'SLURM_JOB_ID': '7771', 'SLURM_SUBMIT_DIR': str(REPO_ROOT), 'PYTHON': sys.executable,
           'SCONTROL_LOG': str(tmp_path / 'scontrol.log'), 'OMP_NUM_THREADS': '1'}
    command = ['bash', 'tools/slurm/train.sbatch', CONFIG, str(work), *_options(imagenet_root)]
    job = Watched(command, env)
    job.until(re.compile(r'Epoch\(train\) +\[2\]\[1/2\]'), 600)  # in the middle of epoch 2
    job.process.send_signal(signal.SIGUSR1)
    status, log = job.end(300)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    stopped = [int(i) for i in re.findall(r'rank \d: stopped by a preemption signal after '
                                          r'iteration (\d+)', log)]
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
