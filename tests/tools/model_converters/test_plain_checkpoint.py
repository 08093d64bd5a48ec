"""tools/model_converters/plain_checkpoint.py: a checkpoint as mmengine writes it (numpy values
and HistoryBuffers as objects) becomes one that ``torch.load`` reads with torch's defaults,
holding the same content; the user's files are kept unless overwriting is asked for."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.logging.history_buffer import HistoryBuffer

from vitdense.checkpoint_io import safe_load

from common import CHECKOUT_ENV, REPO_ROOT

CONVERTER = REPO_ROOT / 'tools/model_converters/plain_checkpoint.py'


def _convert(*args: str) -> subprocess.CompletedProcess:
    """The converter in a new interpreter, as a user runs it."""
    return subprocess.run([sys.executable, str(CONVERTER), *args], capture_output=True,
                          text=True, env=CHECKOUT_ENV)


@pytest.fixture
def old_checkpoint(tmp_path):
    buffer = HistoryBuffer()
    buffer.update(0.5)
    path = tmp_path / 'iter_1.pth'
    torch.save({'state_dict': {'w': torch.arange(3.)}, 'meta': {'seed': np.int64(7)},
                'message_hub': {'log_scalars': {'train/loss': buffer},
                                'runtime_info': {'eta': np.float64(1.5)}}}, path)
    return path


def test_old_checkpoint_is_rewritten_as_plain_data(old_checkpoint, tmp_path):
    with pytest.raises(Exception, match='numpy|HistoryBuffer'):
        torch.load(old_checkpoint)
    result = _convert(str(old_checkpoint))
    new = tmp_path / 'iter_1_plain.pth'
    assert result.returncode == 0 and f'wrote {new}' in result.stdout, result.stderr[-2000:]
    assert torch.serialization.get_unsafe_globals_in_checkpoint(new) == []
    torch.load(new)
    before, after = safe_load(old_checkpoint), safe_load(new)
    assert torch.equal(after['state_dict']['w'], before['state_dict']['w'])
    assert after['meta']['seed'] == 7 and type(after['meta']['seed']) is np.int64
    assert after['message_hub']['runtime_info']['eta'] == np.float64(1.5)
    loss = after['message_hub']['log_scalars']['train/loss']
    assert type(loss) is HistoryBuffer and loss.data[0].tolist() == [0.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ['iter_1.pth', 'iter_1_plain.pth']


def test_existing_files_are_kept_unless_overwrite_is_given(old_checkpoint, run_command):
    original = old_checkpoint.read_bytes()
    result = run_command(CONVERTER, str(old_checkpoint), str(old_checkpoint))
    assert result.returncode != 0 and f'{old_checkpoint} exists' in result.stderr
    assert old_checkpoint.read_bytes() == original
    overwritten = run_command(CONVERTER, str(old_checkpoint), str(old_checkpoint), '--overwrite')
    assert overwritten.returncode == 0, overwritten.stderr
    assert torch.serialization.get_unsafe_globals_in_checkpoint(old_checkpoint) == []
