"""Fixes that make the host libraries work on this stack (torch 2.14, numpy 2).

Imported first by ``import vitdense`` (and so by ``custom_imports=dict(imports=['vitdense'])``
in every config).  Each submodule fixes one symptom, named in its docstring; fixes for
mmcv / mmdet / mmseg / mmpretrain are applied when those modules are imported, so
importing vitdense does not import them.
"""
from . import checkpoint, packages, syncbn

checkpoint.apply()
packages.apply()
syncbn.apply()
