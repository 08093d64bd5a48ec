"""Every fix vitdense makes to the host libraries, in one table, each checked against the
versions it was written for.

A user who only wants a backbone should know what ``import vitdense`` changes: the fixes
below, nothing else.  Each names its symptom in its module's docstring and raises
:class:`~vitdense_startup.HostVersionError` on a library version it was not written for
(no fix is applied silently to code it was not checked against).

===========================  ==========================  ===============================
fix                          written for                 applied
===========================  ==========================  ===============================
package look-ups without     mmengine >=0.10.3,<0.11     at interpreter start-up
pkg_resources                                            (``vitdense-startup.pth``) and
(``vitdense_startup``)                                   ``import vitdense``
torch-native mmcv ops        mmcv >=2.0.0,<2.2.0         on ``import mmcv.ops`` when no
(``compat/mmcv_ext.py``)                                 compiled ``mmcv._ext`` exists
safe checkpoint loading and  torch >=2.6,<2.15;          ``import vitdense``
atomic checkpoint writing    mmengine >=0.10.3,<0.11
(``compat/checkpoint.py``)
SyncBatchNorm on CPU: its    torch >=2.6,<2.15           ``import vitdense``
forward and DDP's check
(``compat/syncbn.py``)
===========================  ==========================  ===============================

Importing vitdense imports torch and mmengine, never mmcv, mmdet, mmseg or mmpretrain.
"""
from __future__ import annotations

import mmengine
import torch

import vitdense_startup
from vitdense_startup import HostVersionError, require

from . import checkpoint, syncbn

__all__ = ['HostVersionError', 'TORCH_WRITTEN_FOR', 'MMENGINE_WRITTEN_FOR']

TORCH_WRITTEN_FOR = '>=2.6,<2.15'
MMENGINE_WRITTEN_FOR = vitdense_startup.PACKAGE_LOOKUPS_WRITTEN_FOR

vitdense_startup.install()
require('safe checkpoint loading and atomic checkpoint writing', 'torch', torch.__version__,
        TORCH_WRITTEN_FOR)
require('safe checkpoint loading and atomic checkpoint writing', 'mmengine',
        mmengine.__version__, MMENGINE_WRITTEN_FOR)
checkpoint.apply()
require('SyncBatchNorm on CPU', 'torch', torch.__version__, TORCH_WRITTEN_FOR)
syncbn.apply()
