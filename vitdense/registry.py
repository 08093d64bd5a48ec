"""The ``vitdense`` registry scope.

Every registry here is a child of mmengine's root registry of the same kind, so a
config of any downstream library (mmdet, mmseg, mmpretrain) can name our modules as
``type='vitdense.XCiT'`` without clashing with its own ``XCiT``; the config's
``default_scope`` stays the downstream library's.
"""
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOG_PROCESSORS as MMENGINE_LOG_PROCESSORS
from mmengine.registry import MODEL_WRAPPERS as MMENGINE_MODEL_WRAPPERS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import \
    OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIMIZERS as MMENGINE_OPTIMIZERS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

SCOPE = 'vitdense'

MODELS = Registry('model', parent=MMENGINE_MODELS, scope=SCOPE,
                  locations=['vitdense.models'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
    scope=SCOPE, locations=['vitdense.engine'])
OPTIMIZERS = Registry('optimizer', parent=MMENGINE_OPTIMIZERS, scope=SCOPE,
                      locations=['vitdense.engine'])
RUNNERS = Registry('runner', parent=MMENGINE_RUNNERS, scope=SCOPE,
                   locations=['vitdense.engine'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, scope=SCOPE,
                    locations=['vitdense.engine'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope=SCOPE,
                 locations=['vitdense.engine'])
LOG_PROCESSORS = Registry('log_processor', parent=MMENGINE_LOG_PROCESSORS, scope=SCOPE,
                          locations=['vitdense.engine'])
MODEL_WRAPPERS = Registry('model_wrapper', parent=MMENGINE_MODEL_WRAPPERS, scope=SCOPE,
                          locations=['vitdense.engine'])
TRANSFORMS = Registry('transform', parent=MMENGINE_TRANSFORMS, scope=SCOPE,
                      locations=['vitdense.cls'])
