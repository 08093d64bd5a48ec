"""Checkpoint files: plain data (:mod:`.plain`), safe loading with errors that name the
file (:mod:`.loading`), atomic writing (:mod:`.writing`)."""
from .loading import (ALLOWED_GLOBALS, CorruptCheckpointError, UnsafeCheckpointError,
                      load_checkpoint, load_from_local, load_from_remote, safe_load,
                      use_safe_loading)
from .plain import PLAIN_TAG, from_plain, to_plain
from .writing import (ATOMIC_BACKEND, AtomicLocalBackend, atomic_write, plain_checkpoint,
                      save_plain)

__all__ = ['UnsafeCheckpointError', 'CorruptCheckpointError', 'ALLOWED_GLOBALS', 'safe_load',
           'load_from_local', 'load_from_remote', 'use_safe_loading', 'atomic_write',
           'AtomicLocalBackend', 'ATOMIC_BACKEND', 'PLAIN_TAG', 'to_plain', 'from_plain',
           'save_plain', 'plain_checkpoint', 'load_checkpoint']
