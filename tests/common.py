"""What many test files share: where the checkout is, the tiny architectures every family is
built at, a toy model for the engine and checkpoint tests, the tests' one access to
mmengine's process-wide tables (named instances, checkpoint loaders), the references
written from official code that several files check releases against, a subprocess whose
output a test waits for with a deadline (:class:`Watched`), and ``tools/train.py`` run that
way on a shipped config pointed at a demo set (:func:`train_tool`, :func:`shipped_leaf`).

Importable as ``common`` from any test folder: pytest puts ``tests/``, the folder of
``conftest.py``, on the module path.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import ManagerMixin
from torch import nn

from vitdense.checkpoint_io import safe_load
from vitdense.engine.tool_config import load_config, point_at_data_root
from vitdense.model_factory import register_host
from vitdense.models import ColumnarBackbone, backbone_families

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / 'configs'
# the environment for a tool run as a subprocess: this checkout's vitdense, whatever copy the
# environment has installed
CHECKOUT_ENV = {**os.environ, 'PYTHONPATH': str(REPO_ROOT)}

# 32 channels, 4 blocks, 2 heads (ConViT with one gated block): small enough for a CPU test,
# yet with every layer kind
TINY_ARCH = dict(embed_dims=32, num_layers=4, num_heads=2)
# ConViT's convolutional init gives each head one offset of a √heads × √heads kernel (ConViT
# §2, Eq. 5): 4 heads fill a 2×2 kernel, where 2 heads would leave a head with no offset. Two
# gated blocks let a test read a gate past the first.
TINY_CONVIT_ARCH = dict(TINY_ARCH, num_heads=4, num_local_layers=2)
#: what a family's tiny arch needs beyond TINY_ARCH
TINY_ARCH_EXTRAS = {'convit': dict(num_local_layers=1)}
#: every registered family at the tiny size, as a config's backbone
TINY_BACKBONES = {
    name: dict(type=f'vitdense.{family.__name__}',
               arch=dict(TINY_ARCH, **TINY_ARCH_EXTRAS.get(name, {})))
    for name, family in backbone_families().items()}


def load_tool_config(*args, **kwargs) -> Config:
    """A config as tools/train.py loads it (:func:`load_config`'s arguments), its host
    library imported."""
    cfg = load_config(*args, **kwargs)
    register_host(cfg)
    return cfg


def free_port() -> int:
    """A loopback TCP port that nothing listens on, chosen by the system: the rendezvous port
    of a test's processes, which a test running beside it (``pytest -n``) does not pick."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def require_onnx() -> None:
    """Skip the calling test unless the deployment packages are installed."""
    for name in ('onnx', 'onnxscript', 'onnxruntime'):
        pytest.importorskip(name, reason=f'{name} is not installed (bash tools/install.sh '
                                         f'--deploy installs it)')


class RegressToOne(BaseModel):
    """``net`` regressed to 1 with a squared error: enough for a Runner to train, evaluate
    (the outputs as a list) and checkpoint."""

    def __init__(self, net: nn.Module, init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.net = net

    def forward(self, inputs: torch.Tensor, mode: str = 'loss') -> dict | list:
        out = self.net(inputs)
        if mode == 'loss':
            return dict(loss=((out - 1) ** 2).mean())
        return list(out)


class IterationClock(Hook):
    """A clock that reads one second per finished iteration: a reproducible time budget."""

    priority = 'HIGHEST'
    now = [0.0]

    def before_train(self, runner) -> None:
        self.now[0] = float(runner.iter)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.now[0] = float(runner.iter + 1)


def reference_bias(rel_pos: nn.Module, q: torch.Tensor,
                   hw: tuple[int, int]) -> torch.Tensor:
    """(..., N, N) bias written out pair by pair, for tables sized for the grid ``hw``."""
    rows, cols = hw
    bias = q.new_zeros(*q.shape[:-1], rows * cols)
    for query in range(rows * cols):
        for key in range(rows * cols):
            (qi, qj), (ki, kj) = divmod(query, cols), divmod(key, cols)
            bias[..., query, key] = q[..., query, :] @ (rel_pos.height[qi - ki + rows - 1] +
                                                        rel_pos.width[qj - kj + cols - 1])
    return bias


def max_relative_diff(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference over the reference's largest magnitude: one number that
    holds features of any scale to the same floor."""
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def groups_by_parameter_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's group of each of ``model``'s parameters, by the parameter's name (a
    group holds every tensor whose options are equal)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g for g in optimizer.param_groups for p in g['params']}


def perturb_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter and BatchNorm statistic of ``model`` drawn at random (LayerScale
    gammas, temperatures and gates too, whose initial values would hide a tensor that is
    not loaded), so that a feature comparison sees each tensor."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=generator) * .2
                if name.endswith(('running_var', 'temperature')):
                    noise = noise.abs() + .5
                tensor.copy_(noise)
    model.eval()  # some libraries' train() returns None
    return model


def assert_features_match(ours, reference, floor: float = 1e-5) -> None:
    """Each of the feature tensors ``ours`` has the shape of the reference's and a
    :func:`max_relative_diff` within ``floor``; the largest printed (``pytest -s``)."""
    assert len(ours) == len(reference)
    for mine, theirs in zip(ours, reference):
        assert mine.shape == theirs.shape
        assert max_relative_diff(mine, theirs) <= floor
    print(f'max relative diff {max(max_relative_diff(*pair) for pair in zip(ours, reference)):.1e}')


def bucket_layouts(ddp: nn.parallel.DistributedDataParallel, inputs: torch.Tensor,
                   iterations: int) -> list[list[list[str]]]:
    """The parameter names of each bucket ``ddp`` reduces, in the order it reduces them, per
    iteration of a forward on ``inputs`` and a backward of the output's sum; replaces the
    wrapper's communication hook with a plain all-reduce that records the buckets."""
    names = {p: name for name, p in ddp.module.named_parameters()}
    layouts: list[list[list[str]]] = []

    def record(_, bucket):  # unannotated: DDP compares annotations as objects
        layouts[-1].append([names[p] for p in bucket.parameters()])
        return torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future().then(
            lambda reduced: reduced.value()[0])
    ddp.register_comm_hook(None, record)
    for _ in range(iterations):
        layouts.append([])
        ddp(inputs).sum().backward()
    return layouts


# mmengine keeps some tables for the life of the process, and tests must leave them as they
# found them. Its ManagerMixin classes (DefaultScope, Visualizer, MessageHub, MMLogger) keep
# every instance made, by name, in the class's ``_instance_dict``, the newest the current one:
# mmengine offers no public way to forget one (its own ``DefaultScope.overwrite_default_scope``
# puts the table back by assigning it, around a scope it sets), and a test that builds a Runner
# adds instances named by the time to the second, which a later run of the same name and
# second would take over. The functions below are the tests' only access to these tables.


@contextlib.contextmanager
def instances_kept(manager: type[ManagerMixin]) -> Iterator[None]:
    """Put ``manager``'s instances back as they were when the block began: those made in the
    block are forgotten, the current one is the one before."""
    saved = manager._instance_dict.copy()
    try:
        yield
    finally:
        manager._instance_dict = saved


def forget_instances(manager: type[ManagerMixin]) -> None:
    """Forget every instance of ``manager``, as a new process starts without any."""
    manager._instance_dict.clear()


def keep_checkpoint_loaders(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine's checkpoint loaders put back, at the end of the test, as they are now,
    those the test registers forgotten: ``CheckpointLoader.register_scheme`` adds or
    replaces a loader, and nothing public removes one, so the table itself
    (``CheckpointLoader._schemes``) is put back."""
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))


def eva02_official_rotary_tables(head_dim: int, reference: int, side: int
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """EVA-02's ``VisionRotaryEmbeddingFast`` buffers (baaivision/EVA, ``EVA-02/asuka/
    rope.py``), written from its code: frequencies ``theta^(-2j / (head_dim / 2))``,
    coordinates ``i / side * reference``, pairs interleaved, rows' angles then columns'."""
    dim = head_dim // 2
    frequencies = 1. / (10000 ** (torch.arange(0, dim, 2)[:dim // 2].float() / dim))
    coordinates = torch.arange(side) / side * reference
    angles = torch.einsum('i,f->if', coordinates, frequencies).repeat_interleave(2, dim=-1)
    angles = torch.cat([angles[:, None].expand(side, side, -1),
                        angles[None].expand(side, side, -1)], dim=-1).reshape(-1, head_dim)
    return angles.cos(), angles.sin()


#: timm's names of DINOv3's tensors -> the official hub file's (DINOv3 7B: SwiGLU ``w1`` gate,
#: ``w2``, ``w3``)
DINOV3_HUB_NAMES = (('reg_token', 'storage_tokens'), ('gamma_1', 'ls1.gamma'),
                    ('gamma_2', 'ls2.gamma'), ('mlp.fc1_g.', 'mlp.w1.'), ('mlp.fc1_x.', 'mlp.w2.'),
                    ('mlp.fc2.', 'mlp.w3.'))


def dinov3_hub_layout(timm_layout: dict, local_cls_norm: tuple[torch.Tensor, torch.Tensor]
                      ) -> dict:
    """A timm DINOv3 state dict (``vit_7b_patch16_dinov3``'s layout) in the official hub
    file's names, with the local crops' class-token norm (``local_cls_norm``: weight, bias)
    that DINOv3 7B's file keeps."""
    hub = {}
    for key, value in timm_layout.items():
        for theirs, official in DINOV3_HUB_NAMES:
            key = key.replace(theirs, official)
        hub[key] = value
    weight, bias = local_cls_norm
    return dict(hub, **{'local_cls_norm.weight': weight, 'local_cls_norm.bias': bias})


class Watched:
    """A command in a process group of its own (as a launcher starts it), its output (stdout
    and stderr) read line by line by a thread, so that the test waits for a line or for the
    end with a deadline: past it the group gets SIGKILL and the test fails with the output,
    where a blocking read would hang on a process that does not end (or on a loader worker
    that keeps the output open)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None,
                 cwd: Path = REPO_ROOT) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _fail(self, what: str, seconds: float) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        pytest.fail(f'{what} not within {seconds} s; output:\n{"".join(self.log)[-3000:]}')

    def until(self, text: str | re.Pattern, seconds: float) -> str:
        """Wait for a line that holds ``text`` (or where the pattern is found); that line."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f'a line with {text!r}', seconds)
            if line is None:
                pytest.fail(f'the output ended without {text!r}:\n{"".join(self.log)[-3000:]}')
            self.log.append(line)
            if (text.search(line) if isinstance(text, re.Pattern) else text in line):
                return line

    def end(self, seconds: float) -> tuple[int, str]:
        """Wait for the end of the output and the process's exit; its status and output."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail('the end of the output', seconds)
            if line is None:
                break
            self.log.append(line)
        try:
            return self.process.wait(timeout=max(0.0, deadline - time.monotonic())), ''.join(
                self.log)
        except subprocess.TimeoutExpired:
            self._fail('the exit', seconds)

    def exit(self, seconds: float) -> int:
        """Wait for the process's exit (its children and the output may outlive it)."""
        try:
            return self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self._fail('the exit', seconds)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)


#: the test hooks a trained config may import by name (``launcher_signals``)
TEST_HOOKS = REPO_ROOT / 'tests' / 'engine' / 'hooks'


def train_tool(config: Path, work_dir: Path, *extra: str) -> Watched:
    """``tools/train.py`` on ``config`` (which may import the modules of
    :data:`TEST_HOOKS`) in a process group of its own, one thread, watched."""
    env = {**CHECKOUT_ENV, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1',
           'PYTHONPATH': f'{REPO_ROOT}{os.pathsep}{TEST_HOOKS}'}
    return Watched([sys.executable, 'tools/train.py', str(config), '--work-dir', str(work_dir),
                    '--skip-data-check', *extra], env)


def train_to_end(config: Path, work_dir: Path, *extra: str) -> tuple[int, str]:
    """:func:`train_tool`'s exit status and output, once every process of its group (loader
    workers too) is gone."""
    return train_tool(config, work_dir, *extra).end(600)


def largest_difference(checkpoint: Path, reference: dict) -> float:
    """The largest absolute difference between the weights of ``checkpoint`` and
    ``reference`` (a state dict)."""
    weights = safe_load(str(checkpoint))['state_dict']
    return max(float((weights[key] - value).abs().max()) for key, value in reference.items())


def shipped_leaf(path: Path, config: Path, data_root: Path, settings: str = '',
                 moment: str | None = None, iterations_per_epoch: int = 1) -> Path:
    """A config at ``path``: ``config`` as shipped reading ``data_root`` (every split, and
    the evaluators' annotation files), with ``settings`` (config lines: the run's length,
    its checkpoints); with ``moment``, its process group gets SIGTERM then
    (``launcher_signals.LauncherSignalHook``, which counts ``iterations_per_epoch``)."""
    cfg = Config.fromfile(str(config))
    point_at_data_root(cfg, data_root)
    lines = [f"_base_ = ['{config}']"]
    lines += [f"{split}_dataloader = dict(dataset=dict(data_root='{data_root}'))"
              for split in ('train', 'val', 'test')]
    lines += [f"{name} = dict(ann_file='{cfg[name].ann_file}')"
              for name in ('val_evaluator', 'test_evaluator')
              if isinstance(cfg.get(name), dict) and 'ann_file' in cfg[name]]
    if moment is not None:
        imports = [*cfg.custom_imports.imports, 'launcher_signals']
        lines += [f'custom_imports = dict(imports={imports!r}, allow_failed_imports=False)',
                  f"custom_hooks = [dict(type='LauncherSignalHook', moment={moment!r}, "
                  f'iterations_per_epoch={iterations_per_epoch})]']
    path.write_text('\n'.join(lines) + '\n' + settings)
    return path


#: what a variant of ``arch`` sets and no keyword replaces (``depth`` sets the number of blocks)
SHAPE_KEYS = {'embed_dims', 'num_layers', 'num_heads'}


def options_missing_from_signature(family: type, arch: str | dict) -> set[str]:
    """The arch settings ``family`` declares (``arch_defaults``), its variants set
    (``arch_zoo``) or ``arch`` sets that its signature does not name."""
    settings = set(family.arch_defaults) | set(family.resolve_arch(arch)) | {
        key for variant in family.arch_zoo.values() for key in variant}
    return settings - SHAPE_KEYS - set(inspect.signature(family).parameters)


def arch_reads_while_building(family: type, arch: str | dict) -> set[str]:
    """The settings read back from ``self.arch`` (traced) while ``family`` builds densely and
    as a classifier: none where its builders read the attributes ``_set_arch`` sets."""
    read = set()

    class TracedArch(dict):
        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

    original = ColumnarBackbone._set_arch

    def traced(self, *args) -> None:
        original(self, *args)
        self.arch = TracedArch(self.arch)

    with mock.patch.object(ColumnarBackbone, '_set_arch', traced), torch.device('meta'):
        family(arch)
        family(arch, out_type='cls_token')
    return read
