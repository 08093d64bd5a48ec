"""vitdense is a plugin: importing it, and training one of its configs through
``tools/train.py``, leaves torch's, mmengine's and the hosts' own objects in place; training a
demo config through mmengine's own Runner leaves the process's signal handlers,
``sys.excepthook`` and mmengine's checkpoint loaders as they were; and the models import and
build on torch releases after the one the stack was pinned at."""
import json
import subprocess
import sys

import pytest

from vitdense.demo_data import make_demo_ade

from common import CHECKOUT_ENV, REPO_ROOT, TINY_BACKBONES

# Runs in a fresh interpreter: the objects the libraries define, captured before vitdense is
# imported, compared by identity after the import and after tools/train.py trains (in this
# same interpreter, through runpy).
UNCHANGED = """
import json, runpy, sys
from inspect import getattr_static
import torch
from mmengine.hooks import CheckpointHook
from mmengine.runner import checkpoint, runner
from torch.nn.parallel import DistributedDataParallel


def objects():
    return {
        'torch.nn.SyncBatchNorm.forward': getattr_static(torch.nn.SyncBatchNorm, 'forward'),
        'DistributedDataParallel._passing_sync_batchnorm_handle':
            getattr_static(DistributedDataParallel, '_passing_sync_batchnorm_handle'),
        'mmengine.runner.checkpoint.save_checkpoint': checkpoint.save_checkpoint,
        'mmengine.runner.runner.save_checkpoint': runner.save_checkpoint,
        'CheckpointHook._save_checkpoint_with_step':
            getattr_static(CheckpointHook, '_save_checkpoint_with_step'),
        'CheckpointLoader.load_checkpoint':
            getattr_static(checkpoint.CheckpointLoader, 'load_checkpoint'),
    }


# vitdense's import finders, and what torch's weights-only allow-list holds of numpy,
# mmengine or vitdense (vitdense.checkpoint_io allows those for its own loads only)
def state():
    allowed = [entry[0] if isinstance(entry, tuple) else entry
               for entry in torch.serialization.get_safe_globals()]
    return dict(meta_path=[type(finder).__qualname__ for finder in sys.meta_path
                           if type(finder).__module__.startswith('vitdense')],
                safe_globals=[repr(obj) for obj in allowed if getattr(obj, '__module__', '')
                              .startswith(('numpy', 'mmengine', 'vitdense'))])


before, before_state = objects(), state()
import vitdense  # noqa: E402
report = dict(after_import=[k for k, v in objects().items() if v is not before[k]],
              state_after_import=state() == before_state)
sys.argv = ['tools/train.py', *sys.argv[1:]]
runpy.run_path('tools/train.py', run_name='__main__')
report['after_train'] = [k for k, v in objects().items() if v is not before[k]]
# the tool applied the host fixes (vitdense.compat), i.e. mmcv-lite's ops finder
report['state_after_train'] = state() == dict(before_state, meta_path=['_MmcvExtFinder'])
report['checked'] = sorted(before)
print('REPORT', json.dumps(report))
"""


def test_import_and_training_leave_the_libraries_unchanged(tmp_path):
    data = make_demo_ade(tmp_path / 'ade', num_train=2, num_val=1, size=64)
    loaders = [f'{split}_dataloader.dataset.data_root={data}'
               for split in ('train', 'val', 'test')]
    workers = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in ('num_workers=0', 'persistent_workers=False')]
    work = tmp_path / 'work'
    result = subprocess.run(
        [sys.executable, '-c', UNCHANGED, 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py',
         '--work-dir', str(work), '--cfg-options', *loaders, *workers,
         'train_cfg.max_iters=2', 'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2',
         'model.data_preprocessor.size=(64,64)', 'train_dataloader.batch_size=2'],
        cwd=REPO_ROOT, capture_output=True, text=True,
        env={**CHECKOUT_ENV, 'PYTHONPATH': f'{REPO_ROOT}:{REPO_ROOT / "tools"}'})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout.split('REPORT ', 1)[1])
    assert (work / 'iter_2.pth').is_file()  # it trained and saved, through vitdense's hook
    assert report['after_import'] == [] and report['state_after_import']
    assert report['after_train'] == [] and report['state_after_train']
    assert len(report['checked']) == 6


# Runs in a fresh interpreter: a demo config with vitdense's safety hooks (as the tools add
# them) trained for 2 iterations by mmengine's Runner, no vitdense tool involved.
AS_LEFT = """
import json, signal, sys
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner
from vitdense.engine.tool_config import add_safety_hooks, point_at_data_root
from vitdense.internals import checkpoint_schemes


@HOOKS.register_module()
class RecordLocalLoader(Hook):
    def before_train(self, runner):
        runner.local_loader = checkpoint_schemes()[''].__module__


def state():
    handlers = {sig.name: repr(signal.getsignal(sig)) for sig in signal.Signals
                if sig not in (signal.SIGKILL, signal.SIGSTOP)}
    return dict(handlers=handlers, excepthook=repr(sys.excepthook),
                schemes={prefix: repr(loader) for prefix, loader in checkpoint_schemes().items()})


config, data, work_dir = sys.argv[1:]
cfg = Config.fromfile(config)
point_at_data_root(cfg, data)
cfg.merge_from_dict({'work_dir': work_dir, 'train_cfg.max_iters': 2,
                     'train_cfg.val_interval': 2, 'default_hooks.checkpoint.interval': 2,
                     'train_dataloader.batch_size': 2, 'model.data_preprocessor.size': (64, 64),
                     **{f'{split}_dataloader.{key}': value for split in ('train', 'val', 'test')
                        for key, value in (('num_workers', 0), ('persistent_workers', False))}})
add_safety_hooks(cfg)
cfg.custom_hooks.append(dict(type='RecordLocalLoader'))
before = state()
runner = Runner.from_cfg(cfg)
runner.train()
during = [type(hook).__name__ for hook in runner.hooks]
after = state()
print('REPORT', json.dumps(dict(
    hooks=during, changed={key: [name for name in before[key] if before[key][name] !=
                                 after[key].get(name)] if isinstance(before[key], dict)
                           else before[key] != after[key] for key in before},
    local_loader=[runner.local_loader, checkpoint_schemes()[''].__module__])))
"""


def test_training_through_mmengines_runner_leaves_the_process_as_it_was(tmp_path):
    data = make_demo_ade(tmp_path / 'ade', num_train=2, num_val=1, size=64)
    work = tmp_path / 'work'
    result = subprocess.run(
        [sys.executable, '-c', AS_LEFT, 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py',
         str(data), str(work)], cwd=REPO_ROOT, capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout.split('REPORT ', 1)[1])
    assert (work / 'iter_2.pth').is_file()  # it trained and saved, through vitdense's hook
    assert {'SafeCheckpointHook', 'PreemptionHook', 'ExactResumeHook'} <= set(report['hooks'])
    assert report['changed'] == dict(handlers=[], excepthook=False, schemes=[])
    # safe loading during the run only
    assert report['local_loader'] == ['vitdense.checkpoint_io.loading',
                                      'mmengine.runner.checkpoint']


BUILD_ON = """
import json, sys, warnings
import torch
torch.__version__ = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    import vitdense.models
    from vitdense.registry import MODELS
    shapes = {}
    for family, cfg in json.loads(sys.argv[2]).items():
        model = MODELS.build(cfg).eval()
        with torch.no_grad():
            shapes[family] = [list(f.shape) for f in model(torch.randn(1, 3, 224, 224))]
print('SHAPES', json.dumps(shapes))
print('WARNINGS', json.dumps([str(w.message) for w in caught if 'vitdense' in str(w.message)]))
"""


@pytest.mark.parametrize('torch_version', ['2.15.0', '2.99.0'])
def test_models_build_on_later_torch_releases(torch_version):
    result = subprocess.run(
        [sys.executable, '-c', BUILD_ON, torch_version, json.dumps(TINY_BACKBONES)],
        cwd=REPO_ROOT, capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    shapes = json.loads(result.stdout.split('SHAPES ', 1)[1].splitlines()[0])
    assert json.loads(result.stdout.split('WARNINGS ', 1)[1]) == []
    assert sorted(shapes) == sorted(TINY_BACKBONES)
    for family, outputs in shapes.items():
        assert outputs and all(shape[:2] == [1, 32] for shape in outputs), (family, outputs)
