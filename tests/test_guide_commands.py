"""Every command of the guides (README.md and every docs/*.md page) runs as written, on the
demo sets, from a folder of its own that holds the checkout's configs, tools and benchmarks.

What a command is: each line of a ``bash`` block or of an indented code block (continuation
lines joined, comments dropped, ``a && b`` two commands), with ``$NAME`` expanded from the
guide's own ``NAME="..."`` or ``NAME=$(python -c "...")`` lines and ``[--optional]`` parts
dropped. Commands quoted in prose (``python -m benchmarks...`` behind a measured number)
are parsed by their tool's parser, as are the code blocks' with every ``[--optional]`` part
given.

What the test fills in, and nothing else:

- placeholders a user replaces with their own, in the guide's own text only (never inside
  what a ``$(python -c ...)`` definition printed: a path of the checkout's environment, which
  may itself lie under ``/tmp/``): ``CONFIG`` is the UperNet XCiT demo,
  ``CHECKPOINT`` / ``CKPT`` the checkpoint of the config beside it (a 1-iteration demo
  training, on first use, once per module), ``iter_N`` the bounded run's last iteration,
  ``PARTITION`` / ``JOB_NAME`` names, ``/shared/`` and ``/tmp/`` folders under the
  command's folder; the files a guide's command reads that a user brings (``INPUTS``);
- one thread per process (the suite shares the machine's cores);
- bounds, appended where everyone sees them (``bounds``): a training runs 1 iteration (or
  1 epoch of 2 images; ``TRAIN_EPOCHS`` where a guide reads a later epoch's checkpoint) on
  2-image batches, validates on 2 images, without loader workers; a process per GPU becomes
  one CPU process; ``tools/demo.py`` gets ``--minutes 0.05``;
- the demo sets, made small by ``vitdense.demo_data`` where the configs' ``data_root``
  expects them; ``python`` is this interpreter, SLURM's ``srun`` the stand-in of
  tests/tools/fake_slurm.

Every other command runs. ``NOT_RUN`` lists, each with its reason, the commands that cannot
run here (a GPU, the network, a second host, SLURM's queue, the environment the suite runs
in), the measurements that take minutes whatever their size (and the tests that check
what they measure), and the commands that another test runs as written, with these bounds and
checks of its own. A new command in a guide is run; a listed command no guide has any more
fails ``test_every_listed_command_is_in_a_guide``.

Cost, measured on the project's 2-core machine beside other jobs (load average 1.6 to 2.1):
47 commands run, 309 s of CPU (276 user, 33 system), 5.4 minutes of wall time for the file;
``pytest -s tests/test_guide_commands.py`` prints each command's seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import resource
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.visualization import Visualizer
from PIL import Image

from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_imagenet

from common import CHECKOUT_ENV, REPO_ROOT, forget_instances

GUIDES = ['README.md'] + sorted(f'docs/{page.name}' for page in (REPO_ROOT / 'docs').glob('*.md'))
FENCED = re.compile(r'^```(\w*)\n(.*?)^```', re.S | re.M)
INDENTED = re.compile(r'(?:^\n)((?:    +\S.*\n)+)', re.M)
COMMAND = re.compile(r'^(?:\w+=\S+ )*(?:timeout \d+ |nice )?(?:python|bash|sbatch|torchrun|pip|mim|'
                     r'mkdir|echo|source)\b')
QUOTED = re.compile(r'`((?:\w+=\S+ )*(?:nice )?python (?:tools/\S+\.py|-m benchmarks\.\w+)[^`]*)`')
STRING_NAME = re.compile(r'^(\w+)="([^"]*)"$')
PYTHON_NAME = re.compile(r'^(\w+)=\$\(python -c "([^"]*)"\)(\S*)$')
OPTIONAL = re.compile(r' ?\[--[^\]]*\]')
TOOL = re.compile(r'^python (tools/\S+\.py|-m benchmarks\.\w+|"[^"]+/\.mim/tools/[^"]+\.py")( |$)')


@dataclass(frozen=True)
class GuideCommand:
    guide: str
    written: str  # as the guide writes it, continuation lines joined, comment dropped
    expanded: str  # $NAME expanded, [--optional] parts dropped
    with_options: str  # $NAME expanded, every [--optional] part given
    computed: tuple[str, ...] = ()  # what the $(python -c ...) names it uses printed

    @classmethod
    def of(cls, guide: str, written: str, expanded: str,
           computed: tuple[str, ...] = ()) -> GuideCommand:
        """The command; ``expanded`` still has its ``[--optional]`` parts."""
        given = re.sub(r'\[(--[^\]]*?)( \.\.\.)?\]', r'\1', expanded)
        return cls(guide, written, re.sub(OPTIONAL, '', expanded), given, computed)

    def fill(self, checkpoints: Checkpoints | dict[str, Path]) -> str:
        """``expanded`` with the placeholders filled (``_fill``)."""
        return _fill(self.expanded, checkpoints, self.computed)


def _block_lines(text: str) -> list[str]:
    """The lines of the page's bash and indented code blocks, continuations joined."""
    blocks = [body for lang, body in FENCED.findall(text) if lang == 'bash']
    unfenced = FENCED.sub('', text)
    blocks += [re.sub(r'^    ', '', body, flags=re.M) for body in INDENTED.findall(unfenced)
               if COMMAND.match(body.lstrip())]
    joined = '\n'.join(block.replace('\\\n', ' ') for block in blocks)
    return [re.sub(r'[ \t]+', ' ', line) for line in joined.splitlines()]


def _and_list(line: str) -> list[str]:
    """``a && b`` as its commands (a quoted ``&&`` stays)."""
    parts, quote, start = [], '', 0
    for i, char in enumerate(line):
        quote = '' if char == quote else (char if not quote and char in '"\'' else quote)
        if not quote and line.startswith(' && ', i):
            parts.append(line[start:i])
            start = i + 4
    return [part.strip() for part in parts + [line[start:]]]


def _python_name(code: str, suffix: str) -> str:
    """What ``$(python -c "CODE")SUFFIX`` prints, run in this interpreter."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, '<guide>', 'exec'), {'__name__': '__main__'})  # noqa: S102
    return out.getvalue().strip() + suffix


def guide_commands(guide: str, text: str | None = None) -> list[GuideCommand]:
    """The commands of ``guide``'s code blocks, in the page's order; ``NAME=`` lines
    define names for the others and are not commands themselves."""
    text = (REPO_ROOT / guide).read_text() if text is None else text
    names: dict[str, str] = {}
    computed: set[str] = set()  # the names defined by what python printed
    commands = []
    for line in _block_lines(text):
        line = re.sub(r'(^|\s+)#.*$', '', line).strip()
        parts = line.split('; ') if all(map(STRING_NAME.match, line.split('; '))) else \
            _and_list(line)
        for part in parts:
            if match := STRING_NAME.match(part):
                names[match.group(1)] = match.group(2)
                computed.discard(match.group(1))
            elif match := PYTHON_NAME.match(part):
                names[match.group(1)] = _python_name(match.group(2), match.group(3))
                computed.add(match.group(1))
            elif part:
                used = [name for name in re.findall(r'\$(\w+)', part) if name in names]
                expanded = re.sub(r'\$(\w+)', lambda m: names.get(m.group(1), m.group(0)), part)
                values = tuple(names[name] for name in used if name in computed)
                commands.append(GuideCommand.of(guide, part, expanded, values))
    return commands


def quoted_commands(guide: str) -> list[GuideCommand]:
    """``python tools/...`` / ``python -m benchmarks...`` quoted in the page's prose."""
    text = FENCED.sub('', (REPO_ROOT / guide).read_text()).replace('\n', ' ')
    commands = []
    for match in QUOTED.finditer(text):
        written = re.sub(r'\s+', ' ', match.group(1)).strip()
        expanded = re.sub(r'^(?:\w+=\S+ )*(?:nice )?', '', written)
        if '$' not in expanded and '<' not in expanded and '...' not in expanded:
            commands.append(GuideCommand.of(guide, written, expanded))
    return commands


# ------------------------------------------------------------------ what is not run, and why
_NETWORK = 'downloads from the package index (no network here)'
_FAULTS = ('a trial trains a reference and a faulted run, then resumes (one trial: 100 s of CPU '
           'here); tests/engine/hooks/test_resume.py and test_preemption.py, '
           'tests/engine/test_resume_choice.py, test_launch.py and test_preflight.py and '
           'tests/test_interrupted_save.py test the mechanisms it counts')
NOT_RUN = {
    'bash tools/install.sh': 'reinstalls the environment this suite runs in, from the network '
                             '(tests/tools/test_install.py runs its checks)',
    'source .venv/bin/activate': "shell set-up: this interpreter is that environment's python",
    'python tools/demo.py': 'run as written, with the bounds below and on a demo set at '
                            'data/demo_coco, by tests/tools/test_demo.py, which checks its '
                            'table and picture and resumes it',
    'bash tools/run_tests.sh': 'runs this suite',
    'python tools/data/make_demo_data.py coco': 'would write the full demo set over the one '
                                                'this module made small '
                                                '(tests/tools/data/test_make_demo_data.py '
                                                'runs the tool)',
    'bash tools/run_tests.sh -m "not slow"': 'runs this suite, less its slow tests',
    'bash tools/run_isa_tests.sh': 'runs tests of this suite, once per ISA level',
    'bash tools/run_isa_tests.sh '
    '"tests/tools/test_train.py::test_compiled_training_has_the_eager_losses"':
        'runs a test of this suite, once per ISA level',
    'time python -m pytest -q tests/configs/test_host_heads.py --durations=0':
        'runs a file of this suite, which the suite runs',
    'pip install --no-deps openmim': _NETWORK,
    'pip install click colorama model-index pandas requests rich tabulate': _NETWORK,
    'mim train mmdet configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py --work-dir '
    'work_dirs/mim_det': 'needs openmim, which the two pip lines above download',
    'mim test mmseg configs/xcit/upernet_xcit-d6-p8_demo-ade.py --checkpoint CHECKPOINT':
        'needs openmim, which the two pip lines above download',
    'mim run mmdet get_flops configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py':
        'needs openmim, which the two pip lines above download',
    'echo /.whl/ >> .git/info/exclude': "writes into the checkout's git folder; part of the "
                                        'wheel download below',
    'mkdir -p .whl work_dirs/gpu_report': 'part of the wheel download below',
    'for p in mmengine==0.10.7 mmcv-lite==2.1.0 mmdet==3.3.0 mmsegmentation==1.2.2 '
    'mmpretrain==1.2.0 addict==2.4.0 yapf termcolor terminaltables pycocotools==2.0.11 shapely '
    'prettytable wcwidth mat4py modelindex model-index ordered-set ftfy timm==1.0.31 '
    'platformdirs setuptools==80.9.0 importlib_metadata==8.7.0 zipp; do': _NETWORK,
    'python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 '
    '--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 '
    '--platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d .whl "$p"; done':
        _NETWORK,
    'python -m benchmarks.gpu_report --out work_dirs/gpu_report.jsonl [--cases PATTERN ...] '
    '[--no-compile]': 'needs a CUDA GPU (tests/benchmarks/test_gpu_report.py runs its code '
                      'with --device cpu at toy size)',
    'SKIP_CUDA_TESTS=1 bash benchmarks/gpu_report_call.sh --cases floors --budget-s 240':
        'needs a CUDA GPU and the carried wheels (tests/benchmarks/test_gpu_report.py lists '
        'the floors set and runs its stages case with --device cpu at toy size)',
    'NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 PORT=29500 bash tools/dist_train.sh CONFIG 8 '
    '--work-dir /shared/run --resume': 'two hosts, node 0 at 10.0.0.1 (benchmarks.preemption '
                                       'runs the same launch as 2 nodes on loopback)',
    'NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 PORT=29500 bash tools/dist_train.sh CONFIG 8 '
    '--work-dir /shared/run --resume': 'two hosts, node 0 at 10.0.0.1 (benchmarks.preemption '
                                       'runs the same launch as 2 nodes on loopback)',
    'sbatch -p PARTITION --nodes=2 tools/slurm/train.sbatch CONFIG /shared/run':
        "SLURM's queue (tests/tools/test_slurm.py runs this job script under the stand-in "
        'srun, with its preemption signal)',
    'OMP_NUM_THREADS=1 python -m benchmarks.preemption --out /tmp/preemption':
        'minutes: 3 runs of 3 epochs on 1 process and on 2 nodes x 2 processes '
        '(tests/engine/hooks/test_preemption.py preempts and resumes 1 and 2 processes)',
    'OMP_NUM_THREADS=1 python -m benchmarks.preemption --layouts 2x2 --finished-only --out '
    '/tmp/tail': 'a minute and more: 3 epochs on 2 nodes x 2 processes '
                 '(tests/engine/hooks/test_preemption.py checks that a finished run ends its '
                 'loader workers, and why)',
    'OMP_NUM_THREADS=1 python -m benchmarks.benchmark_ddp_exactness':
        'minutes: ViT-S iterations at 2 and 4 gloo processes (tests/engine/wrappers/test_distributed.py '
        'checks the exactness and the bucket layout)',
    'python tools/mmcv_ops_inventory.py --out inventory.json':
        '~8 minutes: loads every config of mmdet and mmseg (tests/tools/'
        'test_mmcv_ops_inventory.py checks how it resolves config types to ops)',
    'python -m benchmarks.benchmark_mmcv_ops --pure-torch --device cpu --repeats 5 --out '
    'pure_torch.json': 'minutes: 4 interpreters, each 6 steps of DINO\'s encoder at 512x512 '
                       '(~13 s a step here); tests/compat/test_mmcv_ext_ops.py holds the same '
                       'ops to the same pure-torch paths',
    **{f'python -m benchmarks.fault_injection --trials 6 --seed {seed} --out /tmp/f{seed}':
       _FAULTS for seed in (7, 11, 13, 41, 43)},
    **{f'python -m benchmarks.fault_injection --trials 6 --seed {seed} --faults kill-rank '
       f'corrupt-data --out /tmp/r{seed}': _FAULTS for seed in (7, 11, 13)},
}

# --------------------------------------------------------------- what the test fills in
CONFIG = 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py'
#: where each config's data root expects its demo set, and how small the set is made
DEMO_SETS = {
    'demo_coco': functools.partial(make_demo_coco, num_train=4, num_val=2, size=64),
    'demo_ade': functools.partial(make_demo_ade, num_train=4, num_val=2, size=64),
    'demo_in10': functools.partial(make_demo_imagenet, num_train=1, num_val=1, size=72),
    'imagenet': functools.partial(make_demo_imagenet, num_train=1, num_val=1, size=72),
}
#: the placeholders for a user's own values (checkpoints: see ``_fill``)
PLACEHOLDERS = {'CONFIG': CONFIG, 'PARTITION': 'cpu', 'JOB_NAME': 'guide', 'iter_N': 'iter_1',
                '/shared/': 'shared/', '/tmp/': 'tmp/'}
#: a process per GPU -> one CPU process (tests/tools/test_train.py and test_slurm.py run the
#: launchers with 2)
PROCESSES = [(r'\b(GPUS|GPUS_PER_NODE)=\d+ ', r'\1=1 '),
             (r'(dist_(?:train|test)\.sh \S+(?: \S+\.pth| CHECKPOINT)?) 8\b', r'\1 1')]
LOADERS = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
           for key in ('num_workers=0', 'persistent_workers=False')]


def _make_cait_checkpoint(path: Path, checkpoints: Checkpoints) -> None:
    """A CaiT-XXS24 classifier's checkpoint as tools/train.py writes it: ``state_dict`` and
    the config in ``meta['cfg']``."""
    from vitdense.models import CaiT
    from vitdense.models.backbones.timm_export import backbone_options
    config = Config.fromfile(str(REPO_ROOT / 'configs/cait/cait-xxs24_8xb128_in1k.py'))
    meta = {'cfg': config.dump()}
    backbone = CaiT(**backbone_options({'meta': meta})).state_dict()
    torch.save({'meta': meta, 'state_dict': {f'backbone.{k}': v for k, v in backbone.items()}},
               path)


def _make_xcit_backbone(path: Path, checkpoints: Checkpoints) -> None:
    """An XCiT-S12/8 dense backbone's plain state dict."""
    from vitdense.models import XCiT
    torch.save(XCiT('small_12', patch_size=8).state_dict(), path)


def _make_images(path: Path, checkpoints: Checkpoints) -> None:
    """The three pictures of the sizes their names say."""
    for name in ('a_224x224.png', 'b_256x320.png', 'c_200x333.png'):
        height, width = map(int, re.search(r'(\d+)x(\d+)', name).groups())
        pixels = np.random.default_rng(height).integers(0, 255, (height, width, 3), np.uint8)
        Image.fromarray(pixels).save(path.parent / name)


def _copy_checkpoint(path: Path, checkpoints: Checkpoints) -> None:
    """The last checkpoint of a long run of ``CONFIG``."""
    shutil.copy(checkpoints[CONFIG], path)


#: files a guide's command reads that a user brings, made where the command reads them
INPUTS = {
    'work_dirs/run/epoch_300.pth': _make_cait_checkpoint,
    'backbone.pth': _make_xcit_backbone,
    'a_224x224.png': _make_images,
    'shared/run/iter_16000.pth': _copy_checkpoint,
}
#: guides whose commands read a later epoch's checkpoint of their own training
TRAIN_EPOCHS = {'docs/inside.md': 2}
TRAINS = re.compile(r'(?:tools/(?:train\.py|dist_train\.sh|slurm_train\.sh)|/\.mim/tools/train\.py"?)'
                    r' (?:\S+ \S+ )?(configs/\S+\.py)')
TESTS_OR_EXPORTS = re.compile(r'tools/(?:test\.py|dist_test\.sh|slurm_test\.sh|'
                              r'deployment/export\.py)|/\.mim/tools/test\.py')


@functools.cache
def _iteration_based(config: str) -> bool:
    return 'max_iters' in Config.fromfile(str(REPO_ROOT / config)).train_cfg


def bounds(guide: str, command: str) -> str:
    """What the test appends to ``command`` (placeholders filled) so that it fits a test."""
    if 'tools/demo.py' in command:
        return ' --minutes 0.05 --num-pictures 2'
    if match := TRAINS.search(command):
        loop = ('train_cfg.max_iters=1' if _iteration_based(match.group(1)) else
                f'train_cfg.max_epochs={TRAIN_EPOCHS.get(guide, 1)}')
        return (f' --cfg-options {loop} train_cfg.val_interval=1 '
                'default_hooks.checkpoint.interval=1 train_dataloader.batch_size=2 '
                'train_dataloader.dataset.indices=2 val_dataloader.dataset.indices=2 ' +
                ' '.join(LOADERS))
    return ' --cfg-options ' + ' '.join(LOADERS) if TESTS_OR_EXPORTS.search(command) else ''


def _fill_placeholders(text: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        start = r'(?<![\w/])' if placeholder.startswith('/') else r'(?<!\w)'
        end = '' if placeholder.endswith('/') else r'(?!\w)'
        text = re.sub(rf'{start}{re.escape(placeholder)}{end}', value, text)
    return text


def _fill(command: str, checkpoints: Checkpoints | dict[str, Path],
          computed: tuple[str, ...] = ()) -> str:
    """``command`` with the placeholders filled where the guide wrote them, not inside the
    ``computed`` values expanded into it; a checkpoint is that of the config before it in
    the command."""
    kept = '|'.join(map(re.escape, sorted(set(computed), key=len, reverse=True)))
    pieces = re.split(f'({kept})', command) if kept else [command]
    command = ''.join(piece if i % 2 else _fill_placeholders(piece)
                      for i, piece in enumerate(pieces))
    for pattern, replacement in PROCESSES:
        command = re.sub(pattern, replacement, command)
    words = command.split(' ')
    for i, word in enumerate(words):
        if word in ('CHECKPOINT', 'CKPT'):
            config = next(w for w in reversed(words[:i]) if w.startswith('configs/'))
            words[i] = str(checkpoints[config])
    return ' '.join(words)


# ------------------------------------------------------------------------------ running
class _ToolFailed(Exception):
    """A guide's command ended with an error."""


def _run_python(argv: list[str]) -> None:
    """``python ARGV`` in this process: the tools and benchmarks return on a normal end.
    The process state they change (arguments, environment, threads) is put back, and each
    starts without the visualizers of earlier runs, as a new process would: mmengine keeps
    them by experiment name, a time to the second, so a run started in the same second as
    another would take over the other's (a segmentor's visualizer in a detector's run)."""
    forget_instances(Visualizer)
    saved = sys.argv, dict(os.environ), torch.get_num_threads()
    torch.set_num_threads(1)  # as the shell's commands: OMP_NUM_THREADS=1
    try:
        if argv[0] == '-c':
            sys.argv = ['-c']
            exec(compile(argv[1], '<guide>', 'exec'), {'__name__': '__main__'})  # noqa: S102
        elif argv[0] == '-m':
            sys.argv = [argv[1]] + argv[2:]
            runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name='__main__')
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise _ToolFailed(f'exit {exit_.code}') from exit_
    except Exception as error:  # noqa: BLE001  (what the user would see, with the command)
        raise _ToolFailed(f'{type(error).__name__}: {error}') from error
    finally:
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
        torch.set_num_threads(saved[2])


def _shell_env() -> dict[str, str]:
    """``python`` this interpreter, this checkout's vitdense, SLURM's stand-in ``srun``."""
    path = os.pathsep.join([str(Path(sys.executable).parent),
                            str(REPO_ROOT / 'tests/tools/fake_slurm'), os.environ['PATH']])
    return {**CHECKOUT_ENV, 'PATH': path, 'PYTHON': sys.executable, 'OMP_NUM_THREADS': '1'}


def run_command(command: str, folder: Path) -> None:
    """Run ``command`` from ``folder``: python in this process, anything else in bash."""
    python = re.sub(r'^timeout \d+ ', '', command)
    if python.startswith('python '):
        cwd = Path.cwd()
        os.chdir(folder)
        try:
            _run_python(shlex.split(python)[1:])
        finally:
            os.chdir(cwd)
        return
    result = subprocess.run(['bash', '-c', command], cwd=folder, env=_shell_env(),
                            capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise _ToolFailed(f'exit {result.returncode}\n{result.stdout[-3000:]}'
                          f'{result.stderr[-3000:]}')


def _clocks() -> tuple[float, float]:
    """Wall seconds, and CPU seconds of this process and its finished children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + children.ru_utime + children.ru_stime


def _link_checkout(folder: Path, data: Path) -> None:
    for name in ('configs', 'tools', 'benchmarks'):
        (folder / name).symlink_to(REPO_ROOT / name)
    (folder / 'data').symlink_to(data)


class Checkpoints:
    """A 1-iteration checkpoint of a config, trained on first use by tools/train.py with the
    test's bounds on the demo sets of ``data``."""

    def __init__(self, data: Path, folder: Path) -> None:
        self.data, self.folder, self.trained = data, folder, {}
        folder.mkdir()
        _link_checkout(folder, data)

    def __getitem__(self, config: str) -> Path:
        if config not in self.trained:
            work_dir = f'work_dirs/{Path(config).stem}'
            command = f'python tools/train.py {config} --work-dir {work_dir}'
            run_command(command + bounds('', command), self.folder)
            last = (self.folder / work_dir / 'last_checkpoint').read_text().strip()
            self.trained[config] = Path(last)
        return self.trained[config]


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory) -> Checkpoints:
    """The demo sets (``data/``) and the checkpoints a guide's commands pair with them."""
    root = tmp_path_factory.mktemp('guides')
    for name, make in DEMO_SETS.items():
        make(root / 'data' / name)
    return Checkpoints(root / 'data', root / 'checkpoints')


def _in_order(commands: list[GuideCommand]) -> list[GuideCommand]:
    """The guide's order, except that a training whose work dir another command reads runs
    first (docs/inside.md trains at its end what its drawings read)."""
    read = ' '.join(command.expanded for command in commands)

    def after_producers(command: GuideCommand) -> bool:
        work_dir = re.search(r'--work-dir (\S+)', command.expanded)
        return not (work_dir and f'{work_dir.group(1)}/' in read)
    return sorted(commands, key=after_producers)


RUN_GUIDES = [guide for guide in GUIDES
              if any(c.written not in NOT_RUN for c in guide_commands(guide))]


@pytest.mark.parametrize('guide', RUN_GUIDES)
def test_guide_commands_run_as_written(guide, checkpoints, tmp_path):
    """Each command ends with status 0 and writes what its ``--out`` / ``--out-dir`` /
    ``--output-dir`` / ``--work-dir`` names; ``pytest -s`` prints the seconds each took."""
    _link_checkout(tmp_path, checkpoints.data)
    trained = checkpoints
    commands = [c for c in guide_commands(guide) if c.written not in NOT_RUN]
    for command in _in_order(commands):
        filled = command.fill(trained)
        for path, make in INPUTS.items():
            if re.search(rf'(?<!\S){re.escape(path)}(?!\S)', filled):
                (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
                make(tmp_path / path, trained)
        started = _clocks()
        try:
            run_command(filled + bounds(guide, filled), tmp_path)
        except _ToolFailed as error:
            pytest.fail(f'{guide}: `{command.written}` failed, run as '
                        f'`{filled + bounds(guide, filled)}`: {error}')
        for output in re.findall(r'--(?:out|out-dir|output-dir|work-dir)[ =](\S+)', filled):
            out = tmp_path / output
            assert out.exists() and (out.is_file() and out.stat().st_size or
                                     any(out.iterdir())), f'{command.written}: no {output}'
        wall, cpu = (now - then for now, then in zip(_clocks(), started))
        print(f'{wall:6.1f} s ({cpu:5.1f} s CPU) {guide}: {command.written}')


def test_every_listed_command_is_in_a_guide():
    """``NOT_RUN`` names only commands the guides have: a listed command changed in a guide
    is run (or listed again, with its reason)."""
    written = {command.written for guide in GUIDES for command in guide_commands(guide)}
    assert not set(NOT_RUN) - written, sorted(set(NOT_RUN) - written)


# ------------------------------------------------------------------ finding and parsing
def test_commands_are_found_expanded_and_bounded():
    text = ('```bash\nL="python tools/x.py"; O="--out o"\n$L a $O  # note\n'
            'mkdir -p d && python -c "print(1); x = [2]" \\\n  && bash tools/dist_train.sh CONFIG 8\n'
            'D=$(python -c "print(\'/a\')")/b\npython $D/train.py C [--amp]\n```\n'
            'Measured: `python -m benchmarks.b --k 1` (prose).\n\n'
            '    GPUS=16 bash tools/slurm_test.sh PARTITION J CONFIG /shared/run/CKPT\n'
            '\n    backbone=dict(type="x")\n')
    found = guide_commands('x.md', text)
    assert [c.expanded for c in found] == [
        'python tools/x.py a --out o', 'mkdir -p d', 'python -c "print(1); x = [2]"',
        'bash tools/dist_train.sh CONFIG 8', 'python /a/b/train.py C',
        'GPUS=16 bash tools/slurm_test.sh PARTITION J CONFIG /shared/run/CKPT']
    assert found[-2].written == 'python $D/train.py C [--amp]'
    assert found[-2].with_options == 'python /a/b/train.py C --amp'
    assert _fill(found[3].expanded, {}) == f'bash tools/dist_train.sh {CONFIG} 1'
    assert _fill(found[-1].expanded, {}) == \
        f'GPUS=1 bash tools/slurm_test.sh cpu J {CONFIG} shared/run/CKPT'
    assert bounds('x.md', 'python tools/test.py C K').startswith(' --cfg-options ')
    assert 'train_cfg.max_iters=1 ' in bounds('x.md', _fill(found[3].expanded, {}))


@pytest.mark.parametrize('folder', ['checkout', 'my checkout'])
def test_computed_paths_are_kept_under_tmp(folder, monkeypatch):
    """A checkout whose environment lies under ``/tmp/`` (and under a folder with a space):
    the path get_started.md's ``MMDET=$(python -c ...)`` prints is run as printed, while the
    guide's own ``/tmp/`` and placeholders are still filled."""
    with tempfile.TemporaryDirectory(dir='/tmp') as root:
        package = Path(root) / folder / '.venv/lib/python3.11/site-packages/mmdet'
        (package / '.mim/tools').mkdir(parents=True)
        (package / '.mim/tools/train.py').touch()
        monkeypatch.setitem(sys.modules, 'mmdet',
                            types.SimpleNamespace(__file__=str(package / '__init__.py')))
        commands = [c for c in guide_commands('docs/get_started.md') if '/.mim/tools/' in c.expanded]
        train = next(c for c in commands if '/train.py' in c.expanded)
        filled = train.fill({})
        script = shlex.split(filled)[1]
        assert script == f'{package}/.mim/tools/train.py' and Path(script).is_file()
        assert TRAINS.search(filled).group(1) == 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'
        assert all(TOOL.match(c.fill({})) for c in commands)
    text = ('```bash\nD=$(python -c "print(\'/tmp/env\')")/bin\n'
            'python "$D/x.py" CONFIG --out /tmp/o\n```\n')
    command, = guide_commands('x.md', text)
    assert command.fill({}) == f'python "/tmp/env/bin/x.py" {CONFIG} --out tmp/o'


class _Parsed(BaseException):
    """Raised once a tool's arguments parsed: the tool itself does not run (a BaseException,
    as SystemExit, so that no tool's ``except Exception`` takes it)."""


def _parse_only(command: str, monkeypatch) -> None:
    """Run the tool of ``command`` up to its argument parsing, in this process."""
    argv = shlex.split(command)[1:]
    original = argparse.ArgumentParser.parse_args

    def parse_args(parser, args=None, namespace=None):
        original(parser, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', parse_args)
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(_Parsed):
        _run_python(argv)


@pytest.mark.parametrize('guide', GUIDES)
def test_every_command_parses(guide, monkeypatch):
    """Each ``python tools/...`` / ``python -m benchmarks...`` command of the guide's code
    blocks and prose, run or not, takes its arguments as written with every ``[--option]``
    it shows (placeholders such as CONFIG stand for any value): a renamed option or a missing
    argument fails here."""
    commands = guide_commands(guide) + quoted_commands(guide)
    for command in commands:
        for variant in {command.expanded, command.with_options}:
            variant = re.sub(r'^(?:\w+=\S+ )*(?:timeout \d+ )?', '', variant)
            if TOOL.match(variant):
                with monkeypatch.context() as patch:
                    try:
                        _parse_only(variant, patch)
                    except _ToolFailed as error:
                        pytest.fail(f'{guide}: `{variant}` does not parse ({error})')
