"""The torch-native stand-ins for mmcv's compiled functions, one module per op kind.

``vitdense/compat/mmcv_ext.py`` serves them as ``mmcv._ext``: each module's ``__all__`` names
the compiled functions it serves, with the arguments mmcv's Python wrappers pass to them.
``kernel.py`` holds what they share.  The modules import torch, torchvision and each other
only, so that ``mmcv._ext`` loads them without importing the ``vitdense`` package.
"""
