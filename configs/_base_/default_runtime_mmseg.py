# mmseg runtime (logging, visualiser) with the vitdense modules imported; mmseg keeps its
# default hooks in the schedule files; every process draws its own random numbers (seed + rank,
# as the DeiT / CaiT / XCiT training code).
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(imports=['vitdense'], allow_failed_imports=False)
randomness = dict(diff_rank_seed=True)
