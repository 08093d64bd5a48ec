"""Every tool that reads a checkpoint, given a file whose pickle asks to run a command: the
command does not run, the tool stops with an error, and the error names the file.

Each tool runs through its command line (``runpy`` with ``sys.argv`` set, in this process so
that an unsafe load would run the payload here and create the marker file)."""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest
import torch

from vitdense.checkpoint_io import UnsafeCheckpointError, use_safe_loading

from vitdense.demo_data import make_demo_imagenet

from common import REPO_ROOT, keep_checkpoint_loaders

CONFIG = REPO_ROOT / 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'
TOOLS = REPO_ROOT / 'tools'


class _RunsCode:
    """Pickles as ``func(*args)``: unpickling it runs the call."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> Path:
    return make_demo_imagenet(tmp_path_factory.mktemp('in10'), num_train=1, num_val=1, size=72)


def _loaders(data_root: Path) -> list[str]:
    return ['--cfg-options', *[f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
                               for key in (f'dataset.data_root={data_root}', 'num_workers=0',
                                           'persistent_workers=False')]]


def _command(tool: str, evil: Path, tmp_path: Path, data_root: Path,
             image_folder: Path) -> tuple[Path, list[str]]:
    """The script and its arguments for ``tool`` reading the checkpoint ``evil``."""
    work = ['--work-dir', str(tmp_path / 'work')]
    out = str(tmp_path / 'converted.pth')
    return {
        'infer': (TOOLS / 'infer.py', [str(CONFIG), str(evil), str(image_folder),
                                       '--out-dir', str(tmp_path / 'out'), '--device', 'cpu']),
        'test': (TOOLS / 'test.py', [str(CONFIG), str(evil), *work, *_loaders(data_root)]),
        'train --resume': (TOOLS / 'train.py', [str(CONFIG), '--resume', str(evil), *work,
                                                '--skip-data-check', *_loaders(data_root)]),
        'look_inside': (TOOLS / 'analysis_tools/look_inside.py',
                        ['attention', '--config', str(CONFIG), '--checkpoint', str(evil),
                         '--out-dir', str(tmp_path / 'out')]),
        'timm_to_vitdense': (TOOLS / 'model_converters/timm_to_vitdense.py',
                             ['vit', str(evil), out, '--arch', 'deit-tiny']),
        'xcit_dense_official': (TOOLS / 'model_converters/xcit_dense_official.py',
                                [str(evil), out]),
    }[tool]


def _run_tool(script: Path, argv: list[str]) -> BaseException | None:
    """Run ``script`` as ``python script argv...`` would; the exception it ended with."""
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name='__main__')
    except (Exception, SystemExit) as err:  # noqa: B902 (a tool's error is the result)
        return err
    finally:
        sys.argv = saved
    return None


@pytest.mark.parametrize('where', ['meta', 'state_dict'])
@pytest.mark.parametrize('tool', ['infer', 'test', 'train --resume', 'look_inside',
                                  'timm_to_vitdense', 'xcit_dense_official'])
def test_a_checkpoint_that_runs_code_is_refused(tool, where, tmp_path, data_root,
                                                image_folder):
    marker = tmp_path / 'payload-ran'
    payload = _RunsCode(os.system, f'touch {marker}')
    weights = {'backbone.cls_token': torch.zeros(1, 1, 128)}
    if where == 'state_dict':
        weights['backbone.pos_embed'] = payload
    evil = tmp_path / 'downloaded.pth'
    torch.save(dict(meta=payload if where == 'meta' else {}, state_dict=weights,
                    model=weights), evil)

    error = _run_tool(*_command(tool, evil, tmp_path, data_root, image_folder))

    assert not marker.exists(), f'{tool} ran the code in {evil}'
    assert isinstance(error, UnsafeCheckpointError), f'{tool} ended with {error!r}'
    assert str(evil) in str(error) and '`posix.system`' in str(error)
    assert not (tmp_path / 'converted.pth').exists()


def test_a_scheme_that_cannot_be_read_weights_only_is_refused(tmp_path, monkeypatch):
    # mmengine's remote schemes (http, ceph, pavi, ...) call torch.load without weights_only;
    # a scheme vitdense does not fetch itself is refused before it reads anything, even with
    # the user's environment asking torch to trust files, and that setting is left alone
    from mmengine.runner.checkpoint import CheckpointLoader
    marker = tmp_path / 'payload-ran'
    evil = tmp_path / 'remote.pth'
    torch.save(dict(meta=_RunsCode(os.system, f'touch {marker}')), evil)
    keep_checkpoint_loaders(monkeypatch)
    CheckpointLoader.register_scheme(
        'fake-remote://', lambda name, map_location=None: torch.load(
            str(tmp_path / name[len('fake-remote://'):]), map_location))
    use_safe_loading()
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(ValueError, match='fake-remote://remote.pth: checkpoints of the '
                       'fake-remote:// scheme cannot be read weights-only here; copy the file'):
        CheckpointLoader.load_checkpoint('fake-remote://remote.pth')
    assert not marker.exists()
    assert os.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] == '1'
