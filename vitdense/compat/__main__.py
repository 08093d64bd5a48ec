"""``python -m vitdense.compat SCRIPT [ARGS]``: run a Python script with vitdense's host fixes.

For scripts that import mmcv.ops before a config can import vitdense, e.g. mmdet's or mmseg's
own ``tools/train.py`` under mmcv-lite::

    python -m vitdense.compat $(python -c "import mmdet, os; print(os.path.dirname(
        mmdet.__file__))")/.mim/tools/train.py configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py
"""
import runpy
import sys

from vitdense.compat import apply_host_fixes

if len(sys.argv) < 2 or sys.argv[1] in ('-h', '--help'):
    raise SystemExit(__doc__)
apply_host_fixes()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
