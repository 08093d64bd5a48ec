"""``import vitdense.models`` needs torch, mmengine and timm only: the host libraries (mmcv,
mmdet, mmseg, mmpretrain), the tools' drawing and logging libraries and peft (with the
transformers it imports: seconds), which only a backbone built with ``peft`` needs, stay
unimported."""
import subprocess
import sys

from common import TINY_ARCH

OPTIONAL = ('mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'matplotlib', 'tensorboard', 'peft',
            'transformers')

BLOCK_AND_BUILD = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {OPTIONAL!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import torch
from vitdense.models import XCiT
model = XCiT({TINY_ARCH!r}, out_indices=(0, 1, 2, 3)).eval()
print([tuple(f.shape) for f in model(torch.randn(1, 3, 64, 64))])
"""


def test_models_import_without_the_host_libraries():
    result = subprocess.run([sys.executable, '-c', BLOCK_AND_BUILD], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    width = TINY_ARCH['embed_dims']
    assert result.stdout.strip() == str([(1, width, 64 // stride, 64 // stride)
                                         for stride in (4, 8, 16, 32)])
