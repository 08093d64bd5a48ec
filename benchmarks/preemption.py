"""Preemption in the middle of an epoch, measured as a cluster job meets it.

For one process (``tools/train.py``) and for 2 nodes x 2 processes on loopback
(``tools/dist_train.sh`` with NNODES=2, NODE_RANK=0|1, MASTER_ADDR=127.0.0.1, gloo on CPU),
on the demo classifier (3 epochs, deterministic CPU kernels, the config's own loaders: a
persistent worker each):

1. an uninterrupted reference run;
2. the same run, sent SIGTERM once process 0 logs the first iteration of epoch 2, to the
   whole process group of node 0's launcher (``os.killpg``: the launcher, its training
   processes and their loader workers, as SLURM signals every process of a job step; node 1
   learns of it through the processes' agreement at the iteration's end): the seconds from
   the signal until every process has exited (their output pipe is closed), their exit
   statuses, and the checkpoint ``last_checkpoint`` names;
3. ``--resume`` to the end: the largest absolute difference between its final weights and
   the reference's (0 means bit for bit), and the seconds from its last training iteration's
   line and from its last line until every process has exited (a finished run must exit).

``--finished-only``: the reference run alone, its seconds from the last training iteration's
line and from its last line until every process has exited (the tail of a finished run).

``--cfg-options train_dataloader.multiprocessing_context=forkserver`` (and ``val_``) measures
loader workers started by multiprocessing's fork server.

    python -m benchmarks.preemption --out work_dirs/preemption
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from vitdense.checkpoint_io import safe_load
from vitdense.demo_data import make_demo_imagenet

ROOT = Path(__file__).resolve().parents[1]
CONFIG = 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'
ENV = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHON': sys.executable, 'OMP_NUM_THREADS': '1'}
MID_EPOCH = re.compile(r'Epoch\(train\) +\[2\]\[ *1/')
LAST_ITERATION = re.compile(r'Epoch\(train\) +\[3\]\[ *(\d+)/ *\1\]')


EXTRA_OPTIONS: list[str] = []  # --cfg-options given on the command line, after the run's own


def _options(data_root: Path) -> list[str]:
    loaders = [f'{split}_dataloader.dataset.data_root={data_root}'
               for split in ('train', 'val', 'test')]
    return ['--cfg-options', *loaders, 'train_dataloader.batch_size=4',
            'val_dataloader.batch_size=5', 'train_cfg.max_epochs=3', 'train_cfg.val_interval=3',
            'default_hooks.checkpoint.interval=3', 'default_hooks.logger.interval=1',
            'randomness.seed=0', 'randomness.deterministic=True', *EXTRA_OPTIONS]


def _commands(layout: str, work: Path, data_root: Path, resume: bool) -> list[tuple[list, dict]]:
    """(command, environment) of each launcher of ``layout`` ('1' or '2x2')."""
    extra = ['--work-dir', str(work), *(['--resume'] if resume else []), *_options(data_root)]
    if layout == '1':
        return [([sys.executable, 'tools/train.py', CONFIG, *extra], ENV)]
    return [(['bash', 'tools/dist_train.sh', CONFIG, '2', *extra],
             {**ENV, 'NNODES': '2', 'NODE_RANK': str(node), 'MASTER_ADDR': '127.0.0.1',
              'PORT': str(29650 + int(resume))}) for node in (0, 1)]


def _run(layout: str, work: Path, data_root: Path, resume: bool = False,
         preempt: bool = False) -> dict:
    """Run ``layout`` to its end, or SIGTERM node 0's launcher mid-epoch (``preempt``)."""
    launchers = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
                 for command, env in _commands(layout, work, data_root, resume)]
    log, signalled, last_iteration = [], None, None
    for line in launchers[0].stdout:
        log.append(line)
        last_line = time.monotonic()
        if preempt and signalled is None and MID_EPOCH.search(line):
            os.killpg(launchers[0].pid, signal.SIGTERM)
            signalled = time.monotonic()
        if last_iteration is None and LAST_ITERATION.search(line):
            last_iteration = time.monotonic()
    statuses = [launcher.wait() for launcher in launchers]
    result = dict(statuses=statuses, log_tail=''.join(log)[-2000:])
    if not preempt:
        exited = time.monotonic()
        result.update(seconds_last_line_to_exit=round(exited - last_line, 1),
                      seconds_last_iteration_to_exit=None if last_iteration is None else
                      round(exited - last_iteration, 1))
    if not preempt and any(statuses):
        raise RuntimeError(f'{layout} run in {work} failed: {statuses}\n{result["log_tail"]}')
    if signalled is not None:
        result['seconds_to_exit'] = round(time.monotonic() - signalled, 1)
        result['stopped_after'] = re.findall(r'stopped by a preemption signal after iteration '
                                             r'(\d+)', ''.join(log))
        pointer = work / 'last_checkpoint'
        result['checkpoint'] = pointer.read_text() if pointer.is_file() else None
    return result


def _max_difference(a: Path, b: Path) -> float:
    ours, theirs = safe_load(str(a))['state_dict'], safe_load(str(b))['state_dict']
    return max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in theirs)


def _exit_seconds(run: dict) -> dict:
    return {key: run[key] for key in ('seconds_last_iteration_to_exit',
                                      'seconds_last_line_to_exit')}


def measure(layout: str, out: Path, data_root: Path, finished_only: bool = False) -> dict:
    reference = _run(layout, out / f'{layout}_reference', data_root)
    if finished_only:
        return dict(layout=layout, reference_statuses=reference['statuses'],
                    reference_exit=_exit_seconds(reference))
    stopped = _run(layout, out / f'{layout}_preempted', data_root, preempt=True)
    resumed = _run(layout, out / f'{layout}_preempted', data_root, resume=True)
    return dict(layout=layout, reference_statuses=reference['statuses'],
                preempted=stopped, resumed_statuses=resumed['statuses'],
                resumed_exit=_exit_seconds(resumed),
                max_abs_difference=_max_difference(out / f'{layout}_reference/epoch_3.pth',
                                                   out / f'{layout}_preempted/epoch_3.pth'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', type=Path, default=Path('work_dirs/preemption'))
    parser.add_argument('--layouts', nargs='+', default=['1', '2x2'], choices=['1', '2x2'])
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='more config overrides for every run')
    parser.add_argument('--finished-only', action='store_true',
                        help='only the uninterrupted run: the tail of a finished run')
    args = parser.parse_args()
    EXTRA_OPTIONS.extend(args.cfg_options)
    args.out.mkdir(parents=True, exist_ok=True)
    data_root = make_demo_imagenet(args.out / 'data', num_train=4, num_val=1, size=72)
    torch.set_num_threads(1)
    results = [dict(measure(layout, args.out, data_root, args.finished_only),
                    load_average=os.getloadavg()) for layout in args.layouts]
    for result in results:  # the log's end only where something is to be explained
        if result.get('max_abs_difference') == 0:
            del result['preempted']['log_tail']
    print(json.dumps(results, indent=1))
    (args.out / 'results.json').write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
    main()
