# mmseg runtime (logging, visualiser) with the vitdense modules imported; mmseg keeps its
# default hooks in the schedule files; every process draws its own random numbers (seed + rank,
# as the DeiT / CaiT / XCiT training code).
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(imports=['vitdense'], allow_failed_imports=False)
# seed=None: process 0 draws one seed and shares it (mmengine's Runner needs the key)
randomness = dict(seed=None, diff_rank_seed=True)
