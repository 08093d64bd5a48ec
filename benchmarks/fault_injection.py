"""Inject faults into short demo trainings and count what survives them.

Each trial picks a demo model (Mask R-CNN, UperNet, classifier) and a fault, runs
``tools/train.py`` on a tiny generated data set with deterministic CPU kernels, and checks the
outcome against an uninterrupted reference run of the same model:

- ``kill-train`` / ``kill-save`` / ``kill-eval``: SIGKILL at a random moment of training,
  while the first, second or third checkpoint is being written (its temporary file
  exists), or during
  validation; then ``--resume`` until the run finishes and compare the final weights with
  the reference (``torch.equal`` on every tensor);
- ``corrupt-checkpoint``: kill once two checkpoints exist, damage the newest (empty,
  truncated or garbage), resume: the run must fall back to the older one and still end on
  the reference weights;
- ``corrupt-data``: a zero-byte image, an annotation file that is not JSON or a truncated
  label map: the run must stop with an error naming the file;
- ``kill-rank``: two processes (gloo, ``--dist-timeout 30``); SIGKILL one worker or the
  launcher, or SIGSTOP one worker: every process must be gone within ``EXIT_MARGIN`` (15 s)
  of the kill, or of the process-group timeout for a stopped worker (30 s + 15 s).

After a kill, a "lost file" is a checkpoint that ``last_checkpoint`` named before the kill
and that is missing or unreadable after it.

    python -m benchmarks.fault_injection --trials 12 --out work_dirs/faults
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from vitdense.checkpoint_io import CorruptCheckpointError, safe_load

from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_imagenet
from vitdense.engine.launch import children_of

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHON': sys.executable,
       'OMP_NUM_THREADS': '1'}
DIST_TIMEOUT = 30  # --dist-timeout of the kill-rank trials, seconds
EXIT_MARGIN = 15  # seconds for the processes to act on a kill or a timeout and exit, under load
FAULTS = ('kill-train', 'kill-save', 'kill-eval', 'corrupt-checkpoint', 'corrupt-data',
          'kill-rank')


def _loaders(data_root: Path) -> list[str]:
    return [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
            for key in (f'dataset.data_root={data_root}', 'num_workers=0',
                        'persistent_workers=False')]


@dataclass
class Target:
    """One demo model: its config, how to write its data, and the overrides of a short run."""

    config: str
    make_data: Callable[[Path], Path]
    options: Callable[[Path], list[str]]
    final: str  # the last checkpoint's file name
    broken_files: Callable[[Path], list[Path]]  # files a corrupt-data trial may damage


def _mask_rcnn_options(root: Path) -> list[str]:
    ann = root / 'annotations' / 'instances_val.json'
    return [*_loaders(root), 'train_dataloader.batch_size=2', 'val_dataloader.batch_size=2',
            'test_dataloader.batch_size=2', f'val_evaluator.ann_file={ann}',
            f'test_evaluator.ann_file={ann}', 'train_cfg.max_iters=6', 'train_cfg.val_interval=3',
            'default_hooks.checkpoint.interval=2', 'default_hooks.checkpoint.max_keep_ckpts=2']


def _upernet_options(root: Path) -> list[str]:
    return [*_loaders(root), 'train_dataloader.batch_size=2', 'val_dataloader.batch_size=2',
            'test_dataloader.batch_size=2', 'model.data_preprocessor.size=(64,64)',
            'train_cfg.max_iters=6', 'train_cfg.val_interval=3',
            'default_hooks.checkpoint.interval=2', 'default_hooks.checkpoint.max_keep_ckpts=2']


def _classifier_options(root: Path) -> list[str]:
    return [*_loaders(root), 'train_dataloader.batch_size=8', 'val_dataloader.batch_size=5',
            'test_dataloader.batch_size=5', 'train_cfg.max_epochs=3', 'train_cfg.val_interval=1',
            'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=2']


TARGETS = {
    'mask-rcnn': Target(
        'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py',
        lambda d: make_demo_coco(d, num_train=4, num_val=2, size=64), _mask_rcnn_options,
        'iter_6.pth',
        lambda r: [r / 'annotations' / 'instances_train.json', *sorted((r / 'train').iterdir())]),
    'upernet': Target(
        'configs/xcit/upernet_xcit-d6-p8_demo-ade.py',
        lambda d: make_demo_ade(d, num_train=4, num_val=2, size=64), _upernet_options,
        'iter_6.pth',
        lambda r: [*sorted((r / 'images' / 'training').iterdir()),
                   *sorted((r / 'annotations' / 'training').iterdir())]),
    'classifier': Target(
        'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
        lambda d: make_demo_imagenet(d, num_train=2, num_val=1, size=72),
        _classifier_options, 'epoch_3.pth',
        lambda r: sorted((r / 'train').rglob('*.JPEG'))),
}
COMMON = ['randomness.seed=0', 'randomness.deterministic=True', 'default_hooks.logger.interval=1']


@dataclass
class Trial:
    target: str
    fault: str
    injected: bool = False
    resumed: bool = False  # continued from a checkpoint (not from scratch)
    weights_equal: bool | None = None
    files_lost: int = 0
    named_file: bool | None = None  # corrupt-data: the error names the damaged file
    all_exited_s: float | None = None  # kill-rank: seconds until every process was gone
    exit_bound_s: float | None = None  # kill-rank: when every process must be gone by
    note: str = ''
    log: list[str] = field(default_factory=list)


class Run:
    """``tools/train.py`` in a subprocess whose output is read line by line."""

    def __init__(self, command: list[str], log_file: Path, env: dict | None = None) -> None:
        self.lines: list[str] = []
        self.log_file = log_file
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(command, cwd=ROOT, env={**ENV, **(env or {})},
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log_file, 'a') as log:
            for line in self.proc.stdout:
                self.lines.append(line)
                log.write(line)

    def saw(self, text: str) -> bool:
        return self.count(text) > 0

    def count(self, text: str) -> int:
        """Lines that contain ``text`` (one per iteration for '(train)', logged each one)."""
        return sum(text in line for line in list(self.lines))

    def wait(self) -> int:
        code = self.proc.wait()
        self.reader.join()
        return code


def _train(target: Target, data: Path, work: Path, *extra: str, launcher: list[str] | None = None
           ) -> list[str]:
    script = launcher or [sys.executable, 'tools/train.py']
    return [*script, target.config, '--work-dir', str(work), *extra, '--cfg-options',
            *target.options(data), *COMMON]


def _loadable(path: Path) -> bool:
    try:
        safe_load(str(path), map_location='cpu')
    except (OSError, CorruptCheckpointError):
        return False
    return True


def _pointer(work: Path) -> Path | None:
    pointer = work / 'last_checkpoint'
    try:
        return Path(pointer.read_text().strip()) if pointer.is_file() else None
    except OSError:
        return None


def _weights_equal(a: Path, b: Path) -> bool:
    ours = safe_load(str(a), map_location='cpu')['state_dict']
    theirs = safe_load(str(b), map_location='cpu')['state_dict']
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _kill_when(run: Run, work: Path, fault: str, rng: random.Random, deadline: float
               ) -> tuple[bool, Path | None]:
    """Wait for the fault's moment, SIGKILL the run; return (killed, pointer before kill)."""
    # kill-train: a random moment after the log line of a random iteration
    iteration, delay = rng.randint(1, 5), rng.uniform(0.0, 0.5)
    saved_before = rng.randint(0, 2)  # kill-save: checkpoints complete before the killed save
    started = None
    while run.proc.poll() is None and time.monotonic() < deadline:
        if fault == 'kill-save' and any(work.glob('.*.tmp')) and \
                len(list(work.glob('*.pth'))) >= saved_before:
            break
        if fault == 'kill-eval' and run.saw('(val)'):
            break
        if fault == 'kill-train' and run.count('(train)') >= iteration:
            started = started or time.monotonic()
            if time.monotonic() - started >= delay:
                break
        if fault == 'corrupt-checkpoint' and len(list(work.glob('*.pth'))) >= 2:
            break
        time.sleep(0.002)
    pointer = _pointer(work)
    if run.proc.poll() is not None:
        return False, pointer
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.wait()
    return True, pointer


# What a trial may do to a file of each kind.
DAMAGE = {'.pth': ('empty', 'truncated', 'garbage'), '.json': ('empty', 'truncated', 'garbage'),
          '.png': ('empty', 'truncated'), '.jpg': ('empty', 'truncated', 'garbage'),
          '.jpeg': ('empty', 'truncated', 'garbage')}


def _damage(path: Path, rng: random.Random) -> str:
    how = rng.choice(DAMAGE[path.suffix.lower()])
    data = path.read_bytes()
    path.write_bytes({'empty': b'', 'truncated': data[:len(data) // 2],
                      'garbage': bytes(rng.getrandbits(8) for _ in range(256))}[how])
    return how


def kill_and_resume(trial: Trial, target: Target, data: Path, work: Path, reference: Path,
                    rng: random.Random) -> None:
    run = Run(_train(target, data, work), work.parent / f'{work.name}.log')
    trial.injected, pointer = _kill_when(run, work, trial.fault, rng, time.monotonic() + 600)
    if not trial.injected:
        trial.note = 'finished before the fault could be injected'
        return
    if pointer is not None and not _loadable(pointer):
        trial.files_lost += 1
    if trial.fault == 'corrupt-checkpoint':
        saved = sorted(work.glob('*.pth'), key=lambda p: int(p.stem.split('_')[-1]))
        trial.note = f'{saved[-1].name}: {_damage(saved[-1], rng)}' if saved else 'none saved'
    for _ in range(3):  # resume until the run completes
        resume = Run(_train(target, data, work, '--resume'), work.parent / f'{work.name}.log')
        code = resume.wait()
        trial.resumed |= resume.saw('resuming from')
        if code == 0:
            break
    final = work / target.final
    trial.weights_equal = final.is_file() and _weights_equal(final, reference)


def corrupt_data(trial: Trial, target: Target, data: Path, work: Path,
                 rng: random.Random) -> None:
    victim = rng.choice(target.broken_files(data))
    trial.note = f'{victim.relative_to(data)}: {_damage(victim, rng)}'
    trial.injected = True
    run = Run(_train(target, data, work), work.parent / f'{work.name}.log')
    code = run.wait()
    text = ''.join(run.lines)
    trial.named_file = code != 0 and victim.name in text and 'Error' in text
    trial.log = [line for line in run.lines if victim.name in line][-1:]


def kill_rank(trial: Trial, target: Target, data: Path, work: Path, rng: random.Random,
              port: int) -> None:
    launcher = ['bash', 'tools/dist_train.sh']
    command = [*launcher, target.config, '2', '--work-dir', str(work),
               '--dist-timeout', str(DIST_TIMEOUT),
               '--cfg-options', *target.options(data), *COMMON]
    run = Run(command, work.parent / f'{work.name}.log', env=dict(PORT=str(port)))
    deadline = time.monotonic() + 600
    while run.proc.poll() is None and not run.saw('(train)') and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = children_of(run.proc.pid)
    if run.proc.poll() is not None or not workers:
        trial.note = 'finished before the fault could be injected'
        return
    victim = rng.choice(['worker', 'launcher', 'stopped worker'])
    trial.note = 'SIGSTOP to a worker' if victim == 'stopped worker' else f'SIGKILL to the {victim}'
    trial.exit_bound_s = EXIT_MARGIN + (DIST_TIMEOUT if victim == 'stopped worker' else 0)
    killed = time.monotonic()
    if victim == 'stopped worker':  # alive but silent: its peer must give up at the timeout
        stopped = rng.choice(workers)
        os.kill(stopped, signal.SIGSTOP)
    else:
        os.kill(rng.choice(workers) if victim == 'worker' else run.proc.pid, signal.SIGKILL)
    trial.injected = True
    while time.monotonic() - killed < 120:
        alive = [pid for pid in [run.proc.pid, *workers] if Path(f'/proc/{pid}').exists()
                 and 'Z' not in Path(f'/proc/{pid}/stat').read_text().split(') ')[1][:1]]
        if not alive:
            trial.all_exited_s = round(time.monotonic() - killed, 1)
            break
        time.sleep(0.1)
    else:
        os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.poll()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=12)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--targets', nargs='+', choices=sorted(TARGETS), default=sorted(TARGETS))
    parser.add_argument('--faults', nargs='+', choices=FAULTS, default=list(FAULTS))
    parser.add_argument('--out', default='work_dirs/faults')
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    references = {}
    for name in args.targets:
        target = TARGETS[name]
        data = target.make_data(out / 'data' / name)
        reference = out / 'reference' / name
        if not (reference / target.final).is_file():  # or continues one a stop cut short
            code = Run(_train(target, data, reference, '--resume'),
                       out / f'reference_{name}.log').wait()
            if code != 0:
                raise SystemExit(f'the reference run of {name} failed; see '
                                 f'{out / f"reference_{name}.log"}')
        references[name] = reference / target.final

    plan = [(t, f) for f in args.faults for t in args.targets]
    rng.shuffle(plan)
    # every fault once before any twice: the first len(faults) trials cover every fault
    times_seen: dict[str, int] = {}
    ranked = []
    for target_name, fault in plan:
        times_seen[fault] = times_seen.get(fault, 0) + 1
        ranked.append((times_seen[fault], target_name, fault))
    plan = [(t, f) for _, t, f in sorted(ranked, key=lambda r: r[0])]
    trials = []
    for index in range(args.trials):
        name, fault = plan[index % len(plan)]
        target, trial = TARGETS[name], Trial(name, fault)
        work = out / 'trials' / f'{index:03d}_{name}_{fault}'
        data = out / 'data' / name
        if fault == 'corrupt-data':
            data = target.make_data(out / 'trials' / f'{index:03d}_data')
            corrupt_data(trial, target, data, work, rng)
        elif fault == 'kill-rank':
            kill_rank(trial, target, data, work, rng, port=29600 + index)
        else:
            kill_and_resume(trial, target, data, work, references[name], rng)
        trials.append(trial)
        print(json.dumps(asdict(trial)), flush=True)

    kills = [t for t in trials if t.injected and t.fault.startswith(('kill-t', 'kill-s', 'kill-e',
                                                                     'corrupt-c'))]
    summary = dict(
        trials=len(trials), faults_injected=sum(t.injected for t in trials),
        runs_resumed_from_checkpoint=sum(t.resumed for t in kills),
        runs_killed_or_corrupted=len(kills),
        final_weights_equal_uninterrupted=sum(bool(t.weights_equal) for t in kills),
        files_lost=sum(t.files_lost for t in trials),
        data_faults_named=sum(bool(t.named_file) for t in trials if t.fault == 'corrupt-data'),
        data_faults=sum(t.fault == 'corrupt-data' for t in trials),
        rank_kills_all_exited=sum(t.all_exited_s is not None for t in trials
                                  if t.fault == 'kill-rank' and t.injected),
        rank_kills_all_exited_in_bound=sum(
            t.all_exited_s is not None and t.all_exited_s <= t.exit_bound_s for t in trials
            if t.fault == 'kill-rank' and t.injected),
        rank_kills=sum(t.fault == 'kill-rank' and t.injected for t in trials))
    (out / 'report.json').write_text(json.dumps(dict(summary=summary,
                                                     trials=[asdict(t) for t in trials]),
                                                indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == '__main__':
    main()
