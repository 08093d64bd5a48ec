"""Checkpoint I/O (``vitdense.checkpoint_io``) and ``vitdense.SafeCheckpointHook``: mmengine
checkpoints load with weights_only=True, code-running pickles are refused, damaged files are
named, and saves are atomic, without touching torch's own allow-list."""
from __future__ import annotations

import builtins
import io
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.hooks import Hook
from mmengine.registry import DefaultScope
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn
from torch.utils.data import Dataset

from vitdense.checkpoint_io import (ALLOWED_GLOBALS, PLAIN_TAG, CorruptCheckpointError,
                                   UnsafeCheckpointError, atomic_write, from_plain,
                                   load_from_local, safe_load, to_plain, use_safe_loading)
from vitdense.internals import checkpoint_loader_for, checkpoint_schemes

from common import RegressToOne


def linear_regression(init_cfg: dict | None = None) -> RegressToOne:
    """Linear regression to 1, enough for a Runner to train, log and checkpoint."""
    return RegressToOne(nn.Linear(2, 1), init_cfg)


class Ones(Dataset):
    metainfo = dict(classes=('thing', 'stuff'), palette=[(1, 2, 3), (4, 5, 6)])

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return dict(inputs=torch.full((2,), float(i)))


def make_runner(work_dir: Path, max_epochs: int, max_keep_ckpts: int = -1, **kwargs) -> Runner:
    return Runner(
        model=linear_regression(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=Ones(), batch_size=2, collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2),
                         dict(type='MultiStepLR', milestones=[1], by_epoch=True)],
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', interval=1,
                                           max_keep_ckpts=max_keep_ckpts),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), **kwargs)


@pytest.fixture(scope='module')
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A real checkpoint written by Runner.save_checkpoint after one epoch."""
    work_dir = tmp_path_factory.mktemp('run')
    runner = make_runner(work_dir, max_epochs=1)
    runner.train()
    weights = {k: v.clone() for k, v in runner.model.state_dict().items()}
    return work_dir / 'epoch_1.pth', weights


def test_checkpoints_hold_only_tensors_and_builtins(trained):
    assert torch.serialization.get_unsafe_globals_in_checkpoint(trained[0]) == []
    plain = torch.load(trained[0])  # torch's defaults: weights_only, no allow-list
    loss = plain['message_hub']['log_scalars']['train/loss']
    assert loss[PLAIN_TAG] == 'HistoryBuffer' and loss['log_history']['data'].dtype == torch.float64
    assert plain['meta']['dataset_meta'] == Ones.metainfo


@pytest.fixture(scope='module')
def old_style(trained, tmp_path_factory) -> Path:
    """A checkpoint as mmengine writes it: HistoryBuffers and numpy values as objects."""
    path = tmp_path_factory.mktemp('old') / 'epoch_1.pth'
    torch.save(safe_load(trained[0]), path)
    return path


def test_safe_load_allows_mmengine_globals_for_its_own_call_only(old_style):
    # The premise: torch refuses mmengine checkpoints with weights_only=True; safe_load
    # reads them and leaves torch's process-wide allow-list as it was.
    allowed = set(torch.serialization.get_safe_globals())
    with pytest.raises(Exception, match='numpy|HistoryBuffer'):
        torch.load(old_style, weights_only=True)
    assert safe_load(old_style)['meta']['epoch'] == 1
    assert set(torch.serialization.get_safe_globals()) == allowed
    with pytest.raises(Exception, match='numpy|HistoryBuffer'):
        torch.load(old_style, weights_only=True)


def test_plain_data_round_trips_exactly():
    buffer = HistoryBuffer(max_length=5)
    for value, count in [(1.5, 1), (2, 3)]:
        buffer.update(value, count)
    data = {'hub': buffer, 'scalars': (np.float32(1.25), np.int64(-3), np.bool_(True)),
            'arrays': [np.arange(6, dtype=np.uint16).reshape(2, 3).T, np.zeros((0, 2))],
            'text': 'kept', 'tensor': torch.ones(2)}
    plain = to_plain(data)
    path = io.BytesIO()
    torch.save(plain, path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(path.getvalue())) == []
    back = from_plain(torch.load(io.BytesIO(path.getvalue())))
    assert isinstance(back['hub'], HistoryBuffer) and back['hub'].max_length == 5
    for got, want in [*zip(back['hub'].data, buffer.data),
                      *zip(back['scalars'], data['scalars']), *zip(back['arrays'], data['arrays'])]:
        assert type(got) is type(want) and got.dtype == want.dtype
        assert got.shape == want.shape and np.array_equal(got, want)
    assert back['text'] == 'kept' and torch.equal(back['tensor'], data['tensor'])
    assert to_plain(back)['tensor'] is back['tensor']  # nothing copied that needs no change


@pytest.fixture
def mmengine_local_loader():
    """mmengine's own local scheme, restored to what it was after the test."""
    before = checkpoint_schemes()['']
    CheckpointLoader.register_scheme('', mmengine_checkpoint.load_from_local, force=True)
    yield
    CheckpointLoader.register_scheme('', before, force=True)


class RecordLocalLoader(Hook):
    """Remembers which loader mmengine used for local files while the run trained."""

    def before_train(self, runner) -> None:
        self.loader = checkpoint_loader_for('a.pth')


def test_config_naming_the_hook_loads_safely_during_its_run(mmengine_local_loader, tmp_path):
    assert checkpoint_loader_for('a.pth') is mmengine_checkpoint.load_from_local
    record = RecordLocalLoader()
    make_runner(tmp_path, max_epochs=1, custom_hooks=[record]).train()
    assert record.loader is load_from_local
    assert checkpoint_loader_for('a.pth') is mmengine_checkpoint.load_from_local  # as it was


def test_safe_load_restores_message_hub(trained):
    ckpt = safe_load(str(trained[0]), map_location='cpu')
    scalars = ckpt['message_hub']['log_scalars']
    assert isinstance(scalars['train/loss'], HistoryBuffer)
    assert scalars['train/loss'].statistics('mean') == pytest.approx(
        float(np.mean(scalars['train/loss'].data[0])))
    assert ckpt['meta']['dataset_meta']['classes'] == ('thing', 'stuff')
    assert ckpt['meta']['epoch'] == 1
    assert isinstance(ckpt['message_hub']['runtime_info']['eta'], np.floating)


class RecordStart(Hook):
    """Remembers where training started, i.e. what resume restored."""

    def before_train(self, runner) -> None:
        self.start = (runner.epoch, runner.iter, {k: v.clone() for k, v in
                                                  runner.model.state_dict().items()})


def test_runner_resume_round_trips(trained, tmp_path):
    ckpt, weights = trained
    record = RecordStart()
    runner = make_runner(tmp_path, max_epochs=2, resume=True, load_from=str(ckpt),
                         custom_hooks=[record])
    runner.train()
    epoch, iteration, start_weights = record.start
    assert (epoch, iteration) == (1, 2)
    for key, value in start_weights.items():
        torch.testing.assert_close(value, weights[key])
    saved = safe_load(str(ckpt))['message_hub']['log_scalars']['train/loss'].data[0]
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 4 and np.array_equal(losses[:2], saved)  # 2 resumed + 2 new
    assert runner.epoch == 2 and (tmp_path / 'epoch_2.pth').is_file()


def test_load_checkpoint_and_pretrained_init(trained):
    ckpt, weights = trained
    use_safe_loading()
    model = linear_regression()
    load_checkpoint(model, str(ckpt), map_location='cpu')
    torch.testing.assert_close(model.net.weight, weights['net.weight'])

    model = linear_regression(init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)))
    model.init_weights()
    torch.testing.assert_close(model.net.bias, weights['net.bias'])


class _RunsCode:
    """Pickles as a call of ``func(*args)`` on load: what a malicious checkpoint does."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _write(path: Path, payload: object) -> str:
    torch.save({'state_dict': {'net.weight': torch.zeros(1, 2)}, 'meta': payload}, path)
    return str(path)


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / 'pwned'


@pytest.mark.parametrize('how', ['load_checkpoint', 'load_from', 'pretrained', 'env_override'])
def test_malicious_checkpoint_is_refused(how, tmp_path, marker, monkeypatch):
    evil = _write(tmp_path / 'evil.pth', _RunsCode(os.system, f'touch {marker}'))
    if how == 'env_override':  # a user environment asking torch to trust every file
        monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    if how != 'load_from':  # a Runner's config names the hook, which does this
        use_safe_loading()
    with pytest.raises(UnsafeCheckpointError) as info:
        if how == 'load_from':
            runner = make_runner(tmp_path / 'wd', max_epochs=1, load_from=evil)
            runner.load_or_resume()
        elif how == 'pretrained':
            linear_regression(init_cfg=dict(type='Pretrained', checkpoint=evil)).init_weights()
        else:
            load_checkpoint(linear_regression(), evil)
    assert not marker.exists(), 'the payload ran'
    message = str(info.value)
    assert evil in message and 'system' in message
    assert 'Nothing from the file was executed' in message


def test_refusal_names_builtin_exec(tmp_path, marker):
    use_safe_loading()
    evil = _write(tmp_path / 'exec.pth',
                  _RunsCode(builtins.exec, f"open({str(marker)!r}, 'w').write('x')"))
    with pytest.raises(UnsafeCheckpointError, match=r'`builtins\.exec`|`exec`'):
        CheckpointLoader.load_checkpoint(evil)
    assert not marker.exists()


@pytest.mark.parametrize('target', [(HistoryBuffer, '__init__'), (np.ndarray, 'tofile')])
def test_getattr_only_resolves_history_buffer_statistics(target, tmp_path, marker):
    use_safe_loading()
    # HistoryBuffer pickles getattr(HistoryBuffer, 'mean'); nothing else may go through it.
    evil = _write(tmp_path / 'getattr.pth', _RunsCode(getattr, *target))
    with pytest.raises(UnsafeCheckpointError, match=target[1]):
        load_checkpoint(linear_regression(), evil)


def test_empty_history_buffer_loads(tmp_path):
    # An empty HistoryBuffer pickles its array's data as bytes(); that alone is allowed.
    path = tmp_path / 'empty_buffer.pth'
    torch.save({'message_hub': {'log_scalars': {'train/loss': HistoryBuffer()}}}, path)
    loaded = safe_load(str(path))['message_hub']['log_scalars']['train/loss']
    assert isinstance(loaded, HistoryBuffer) and len(loaded.data[0]) == 0


def test_bytes_with_arguments_is_refused(tmp_path):
    evil = _write(tmp_path / 'alloc.pth', _RunsCode(bytes, 10 ** 6))
    with pytest.raises(UnsafeCheckpointError, match='bytes'):
        safe_load(evil)


@pytest.mark.parametrize('damage, problem', [
    (lambda data: b'', 'empty'),
    (lambda data: data[:len(data) // 2], 'truncated'),
    (lambda data: b'not a checkpoint at all', 'not a torch checkpoint'),
])
def test_corrupt_checkpoint_names_file_and_problem(trained, tmp_path, damage, problem):
    use_safe_loading()
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(damage(trained[0].read_bytes()))
    for load in (lambda: safe_load(str(bad)), lambda: safe_load(str(bad), mmap=True),
                 lambda: load_checkpoint(linear_regression(), str(bad))):
        with pytest.raises(CorruptCheckpointError) as info:
            load()
        assert str(bad) in str(info.value) and problem in str(info.value)
        assert 'weights_only` set to `False' not in str(info.value)


def test_refusal_does_not_advise_turning_the_check_off(tmp_path, marker):
    evil = _write(tmp_path / 'evil.pth', _RunsCode(os.system, f'touch {marker}'))
    with pytest.raises(UnsafeCheckpointError) as info:
        safe_load(evil)
    assert 'weights_only' not in str(info.value).split('torch said:')[1]
    assert 'False' not in str(info.value)


class KillDuringSave(Hook):
    """Raises inside the second checkpoint save, after the checkpoint dict is complete:
    what a kill during ``torch.save`` leaves behind."""

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if runner.epoch >= 1:
            raise KeyboardInterrupt('killed while saving')


def test_interrupted_save_keeps_previous_checkpoint(tmp_path):
    runner = make_runner(tmp_path, max_epochs=2, custom_hooks=[KillDuringSave()],
                         max_keep_ckpts=1)
    with pytest.raises(KeyboardInterrupt):
        runner.train()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in ('.pth', '.tmp')) == \
        ['epoch_1.pth']
    assert (tmp_path / 'last_checkpoint').read_text() == str(tmp_path / 'epoch_1.pth')
    assert safe_load(str(tmp_path / 'epoch_1.pth'))['meta']['epoch'] == 1


class FailWrite(Hook):
    """Makes the disk fail (fsync) while the second checkpoint is written."""

    def __init__(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if runner.epoch >= 1:
            self.monkeypatch.setattr(os, 'fsync', self.fail)

    @staticmethod
    def fail(fd: int) -> None:
        raise OSError('disk full')


def test_failed_save_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    runner = make_runner(tmp_path, max_epochs=2, custom_hooks=[FailWrite(monkeypatch)])
    with pytest.raises(OSError, match='disk full'):
        runner.train()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in ('.pth', '.tmp')) == \
        ['epoch_1.pth']
    assert (tmp_path / 'last_checkpoint').read_text() == str(tmp_path / 'epoch_1.pth')


def test_atomic_write_leaves_old_content_on_failure(tmp_path, monkeypatch):
    target = tmp_path / 'last_checkpoint'
    atomic_write(target, 'old')

    def failing_fsync(fd: int) -> None:
        raise OSError('disk full')
    monkeypatch.setattr(os, 'fsync', failing_fsync)
    with pytest.raises(OSError, match='disk full'):
        atomic_write(target, 'new')
    assert target.read_text() == 'old' and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_atomic_write_without_overwrite_keeps_an_existing_file(tmp_path):
    target = tmp_path / 'merged.pth'
    atomic_write(target, 'new', overwrite=False)
    assert target.read_text() == 'new'
    with pytest.raises(FileExistsError, match='merged.pth exists; it is kept'):
        atomic_write(target, 'newer', overwrite=False)
    assert target.read_text() == 'new' and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_old_checkpoints_removed_only_after_new_one(tmp_path):
    runner = make_runner(tmp_path, max_epochs=3, max_keep_ckpts=2)
    runner.train()
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == ['epoch_2.pth', 'epoch_3.pth']
    assert (tmp_path / 'last_checkpoint').read_text() == str(tmp_path / 'epoch_3.pth')


@pytest.fixture
def statistics_table():
    """HistoryBuffer's class-wide statistics table, restored after the test."""
    saved = dict(HistoryBuffer._statistics_methods)
    yield HistoryBuffer._statistics_methods
    HistoryBuffer._statistics_methods.clear()
    HistoryBuffer._statistics_methods.update(saved)


@pytest.mark.parametrize('state', [
    {'statistics_methods': {'mean': HistoryBuffer.max}},  # every later mean a max
    {'statistics_methods': {}, 'update': HistoryBuffer.max},  # an instance attribute
    {'statistics_methods': {}, '_log_history': 'not an array'},
])
def test_history_buffer_state_sets_only_what_mmengine_writes(state, tmp_path, statistics_table,
                                                             monkeypatch):
    state = dict({'max_length': 10, '_log_history': np.zeros(1), '_count_history': np.ones(1)},
                 **state)
    path = tmp_path / 'hub.pth'
    with monkeypatch.context() as crafting:  # a file holding a HistoryBuffer with this state
        crafting.setattr(HistoryBuffer, '__getstate__', lambda self: state)
        torch.save({'message_hub': {'log_scalars': {'train/loss': HistoryBuffer()}}}, path)
    before = dict(statistics_table)
    with pytest.raises(UnsafeCheckpointError, match='HistoryBuffer state other than mmengine '
                                                    'writes') as info:
        safe_load(path)
    assert str(path) in str(info.value)
    assert statistics_table == before


def test_history_buffer_state_as_mmengine_writes_it_loads(tmp_path, statistics_table):
    buffer = HistoryBuffer(max_length=5)
    buffer.update(3.0)
    buffer.update(4.5, count=2)
    path = tmp_path / 'hub.pth'
    # mmengine's own pickling (the full statistics table), where the message hub keeps it
    torch.save({'message_hub': {'log_scalars': OrderedDict(loss=buffer)}}, path)
    before = dict(statistics_table)
    loaded = safe_load(path)['message_hub']['log_scalars']['loss']
    assert type(loaded) is HistoryBuffer and loaded.statistics('mean') == 2.5
    assert loaded.max_length == 5 and 'statistics_methods' not in loaded.__dict__
    for ours, saved in zip(loaded.data, buffer.data):
        assert ours.dtype == saved.dtype and np.array_equal(ours, saved)
    assert statistics_table == before


def test_allow_list_is_exactly_what_mmengine_and_timm_checkpoints_need():
    names = sorted(entry[1] if isinstance(entry, tuple) else
                   f'{entry.__module__}.{entry.__qualname__}' for entry in ALLOWED_GLOBALS)
    numeric = ['Bool', 'Int8', 'UInt8', 'Int16', 'UInt16', 'Int32', 'UInt32', 'Int64', 'UInt64',
               'Float16', 'Float32', 'Float64', 'LongDouble', 'Complex64', 'Complex128']
    assert names == sorted([
        'mmengine.logging.history_buffer.HistoryBuffer', 'builtins.getattr', 'builtins.bytes',
        'argparse.Namespace', 'numpy.ndarray', 'numpy.dtype',
        *[f'numpy.{core}.multiarray.{name}' for core in ('_core', 'core')
          for name in ('_reconstruct', 'scalar')],
        *[f'numpy.dtypes.{kind}DType' for kind in numeric]])
    # the names a file can use resolve to our guarded stand-ins, not to the builtins
    resolved = {entry[1]: entry[0] for entry in ALLOWED_GLOBALS if isinstance(entry, tuple)}
    assert resolved['builtins.getattr'] is not getattr
    assert resolved['builtins.bytes'] is not bytes
    assert resolved['mmengine.logging.history_buffer.HistoryBuffer'] is not HistoryBuffer


@pytest.mark.parametrize('how', ['pretrained_backbone', 'build_teacher'])
def test_library_loads_are_weights_only_whatever_the_environment(
        how, tmp_path, marker, monkeypatch, mmengine_local_loader):
    from vitdense.cls import build_teacher
    from vitdense.registry import MODELS

    from common import TINY_BACKBONES
    evil = _write(tmp_path / 'evil.pth', _RunsCode(os.system, f'touch {marker}'))
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(UnsafeCheckpointError) as info:
        if how == 'pretrained_backbone':
            MODELS.build(dict(TINY_BACKBONES['vit'], init_cfg=dict(
                type='Pretrained', checkpoint=evil))).init_weights()
        else:  # the scope a Runner of this module left behind is not mmpretrain's
            with DefaultScope.overwrite_default_scope('mmpretrain'):
                build_teacher(dict(type='ImageClassifier', backbone=TINY_BACKBONES['vit'],
                                   head=dict(type='LinearClsHead', num_classes=2,
                                             in_channels=32)), evil)
    assert not marker.exists(), 'the payload ran'
    assert evil in str(info.value) and 'system' in str(info.value)


def test_remote_checkpoints_load_weights_only_without_touching_the_environment(
        tmp_path, marker, monkeypatch):
    """An https:// checkpoint (its download stubbed by a local copy) goes through torch's hub
    cache to safe_load; the environment a user set is what every step of the load sees."""
    from vitdense.checkpoint_io import load_checkpoint as load_file
    evil = _write(tmp_path / 'evil.pth', _RunsCode(os.system, f'touch {marker}'))
    good = _write(tmp_path / 'good.pth', {'epoch': 3})
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    seen = []

    def download(url: str, destination: str) -> None:
        seen.append(dict(os.environ))
        Path(destination).write_bytes(Path(good if url.endswith('/good.pth') else evil)
                                      .read_bytes())

    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    environment = dict(os.environ)
    assert load_file('https://example.org/ckpt/good.pth')['meta'] == {'epoch': 3}
    assert (tmp_path / 'hub/checkpoints/good.pth').is_file()  # cached as mmengine caches
    with pytest.raises(UnsafeCheckpointError, match='system'):
        load_file('https://example.org/ckpt/evil.pth')
    assert not marker.exists(), 'the payload ran'
    assert seen == [environment, environment] and dict(os.environ) == environment
    with pytest.raises(ValueError, match='pavi:// scheme cannot be read weights-only'):
        load_file('pavi://model/x.pth')
