"""The torch-native stand-ins for mmcv's compiled functions, one module per op kind.

``vitdense/compat/mmcv_ext.py`` serves them as ``mmcv._ext``: each module's ``__all__`` names
the compiled functions it serves, with the arguments mmcv's Python wrappers pass to them.
``kernel.py`` holds what they share.  Of vitdense they import ``kernel.py`` and the
deformable sampler of ``vitdense/models/layers/deformable_sampling.py`` only (each importing
torch alone), so that ``mmcv._ext`` loads them without importing the ``vitdense`` package.
"""
