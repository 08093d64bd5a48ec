"""Builds a wheel whose start-up file, ``vitdense-mmcv-ext.pth``, lies at the root of
``site-packages`` beside ``vitdense_mmcv_ext.py``, so pip records both (and ``pip uninstall``
removes both).

At every interpreter start, ``site`` runs the file's one line, which calls
:func:`vitdense_mmcv_ext.register_finder`: the finder that serves
``vitdense/compat/mmcv_ext.py`` as ``mmcv._ext`` under mmcv-lite. setuptools ships its own
``distutils-precedence.pth`` the same way: the build step copies it beside the modules.
"""
from __future__ import annotations

import os.path as osp

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_FILE = 'vitdense-mmcv-ext.pth'


class BuildWithStartupFile(build_py):
    """``build_py`` that also puts the start-up file at the root of the wheel."""

    def run(self) -> None:
        super().run()
        self.copy_file(osp.join(osp.dirname(osp.abspath(__file__)), STARTUP_FILE),
                       osp.join(self.build_lib, STARTUP_FILE))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + [osp.join(self.build_lib, STARTUP_FILE)]


setup(py_modules=['vitdense_mmcv_ext'], cmdclass={'build_py': BuildWithStartupFile})
