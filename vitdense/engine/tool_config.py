"""The command line every vitdense tool takes, and what a tool changes in the config it loads.

Loading a config only reads it (:func:`load_config`); the host library it names is imported
by :func:`vitdense.model_factory.register_host` and the process joins its job in
:mod:`vitdense.engine.launch`. Every change is made in memory: no config file is rewritten.
"""
from __future__ import annotations

import argparse
import difflib
import inspect
import os
import os.path as osp

from mmengine.config import Config, ConfigDict, DictAction
from mmengine.runner import Runner


def tool_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every OpenMMLab train/test tool takes: config, work dir, overrides, launcher"""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs, checkpoints and metrics go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value (e.g. train_cfg.max_iters=10)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
    parser.add_argument('--dist-timeout', type=float, metavar='SECONDS',
                        help='how long a process waits for the others in a collective '
                             'before failing (torch default: 30 min)')
    return parser


def parse_tool_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, and export LOCAL_RANK for launchers that pass it as an argument."""
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


# Top-level keys that Runner.from_cfg reads besides the config's own.
RUNNER_KEYS = frozenset(inspect.signature(Runner.__init__).parameters) - {'self', 'cfg'} | {
    'runner_type', 'launcher', 'custom_imports', 'default_scope', 'model_wrapper_cfg'}


def check_cfg_options(cfg: Config, cfg_options: dict, path: str) -> None:
    """Refuse ``--cfg-options`` whose top-level key neither the config nor the Runner knows.

    ``merge_from_dict`` accepts any key, so ``train_dataloder.batch_size=2`` would silently
    add an unused entry and train with the configured batch size.
    """
    known = set(cfg.keys()) | RUNNER_KEYS
    for option in cfg_options:
        top = option.split('.')[0]
        if top not in known:
            nearest = difflib.get_close_matches(top, sorted(known), n=1, cutoff=0.5)
            hint = f'; did you mean {nearest[0]!r}?' if nearest else ''
            raise KeyError(f'--cfg-options {option}: {path} has no top-level key {top!r} '
                           f'and the Runner reads none of that name{hint}')


def load_config(path: str, cfg_options: dict | None, launcher: str,
                work_dir: str | None, dist_timeout: float | None = None) -> Config:
    """Read a config, apply ``--cfg-options``, the launcher and the work dir; nothing else.

    The work dir is, by priority, ``work_dir``, the config's own, ``work_dirs/<config name>``.
    ``dist_timeout`` (seconds) bounds how long a process waits for the others. The host library
    is imported by :func:`~vitdense.model_factory.register_host`, the job joined by
    :func:`~vitdense.engine.launch.join_job`.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        check_cfg_options(cfg, cfg_options, path)
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if dist_timeout is not None:
        if dist_timeout <= 0:
            raise ValueError(f'--dist-timeout must be positive, got {dist_timeout}')
        cfg.setdefault('env_cfg', ConfigDict()).setdefault('dist_cfg', ConfigDict())
        cfg.env_cfg.dist_cfg.timeout = dist_timeout
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def add_safety_hooks(cfg: Config, max_nonfinite: int = 5) -> None:
    """Exact resume (random state in checkpoints), the non-finite step guard and the save on
    preemption signals, unless the config has them already."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = {str(hook.get('type')).split('.')[-1] for hook in hooks}
    wanted = dict(ExactResumeHook=dict(type='vitdense.ExactResumeHook'),
                  NonFiniteGuardHook=dict(type='vitdense.NonFiniteGuardHook',
                                          max_consecutive=max_nonfinite),
                  PreemptionHook=dict(type='vitdense.PreemptionHook'))
    cfg.custom_hooks = hooks + [hook for name, hook in wanted.items() if name not in present]


def log_to_tensorboard(cfg: Config) -> None:
    """Also write the run's scalars as TensorBoard events (``<work_dir>/<time>/vis_data``),
    beside the backends the config already has."""
    backends = cfg.visualizer.setdefault('vis_backends', [])
    if not any(backend.get('type') == 'TensorboardVisBackend' for backend in backends):
        backends.append(dict(type='TensorboardVisBackend'))


def point_at_data_root(cfg: Config, data_root: str | os.PathLike) -> None:
    """Read every split from ``data_root``; evaluators with an annotation file (COCO) read
    the file of the same name from ``data_root/annotations``, COCO panoptic's its folder of
    segment PNGs (``seg_prefix``) too."""
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(data_root)
    for evaluator in ('val_evaluator', 'test_evaluator'):
        for key in ('ann_file', 'seg_prefix'):
            if key in cfg[evaluator]:
                name = osp.basename(osp.normpath(cfg[evaluator][key]))
                cfg[evaluator][key] = osp.join(str(data_root), 'annotations', name)


def add_test_metric(cfg: Config, metric: dict) -> None:
    """Append ``metric`` to the test evaluator (a dict or a list of dicts)."""
    evaluator = cfg.test_evaluator
    metrics = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
    cfg.test_evaluator = metrics + [metric]
