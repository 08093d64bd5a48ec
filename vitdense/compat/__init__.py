"""Fixes that make the host libraries work on this stack (torch 2.14, numpy 2, setuptools 84).

Imported first by ``import vitdense`` (and so by ``custom_imports=dict(imports=['vitdense'])``
in every config).  Each submodule fixes one symptom, named in its docstring.  All of them
patch torch or mmengine, so importing vitdense does not import mmcv / mmdet / mmseg /
mmpretrain; their training, evaluation and visualisation paths that vitdense uses needed
no fix of their own on numpy 2.
"""
from . import checkpoint, packages, syncbn

checkpoint.apply()
packages.apply()
syncbn.apply()
