"""The ``vitdense`` registry scope.

Every registry here is a child of mmengine's root registry of the same kind, so a
config of any downstream library (mmdet, mmseg, mmpretrain) can name our modules as
``type='vitdense.XCiT'`` without clashing with its own ``XCiT``; the config's
``default_scope`` stays the downstream library's.
"""
import mmengine.registry as mmengine_registry
from mmengine.registry import Registry

SCOPE = 'vitdense'


def _child(name: str, root: str, location: str) -> Registry:
    """Our registry of kind ``name``: a child of mmengine's ``root`` registry, its modules
    found by importing ``location``."""
    return Registry(name, parent=getattr(mmengine_registry, root), scope=SCOPE,
                    locations=[location])


MODELS = _child('model', 'MODELS', 'vitdense.models')
OPTIM_WRAPPER_CONSTRUCTORS = _child('optimizer wrapper constructor',
                                    'OPTIM_WRAPPER_CONSTRUCTORS', 'vitdense.engine')
OPTIMIZERS = _child('optimizer', 'OPTIMIZERS', 'vitdense.engine')
RUNNERS = _child('runner', 'RUNNERS', 'vitdense.engine')
DATASETS = _child('dataset', 'DATASETS', 'vitdense.engine')
HOOKS = _child('hook', 'HOOKS', 'vitdense.engine')
LOG_PROCESSORS = _child('log_processor', 'LOG_PROCESSORS', 'vitdense.engine')
MODEL_WRAPPERS = _child('model_wrapper', 'MODEL_WRAPPERS', 'vitdense.engine')
TRANSFORMS = _child('transform', 'TRANSFORMS', 'vitdense.cls')
