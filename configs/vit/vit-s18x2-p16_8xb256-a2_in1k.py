# Parallel ViT-S18x2 ("Three things" §3): 18 layers of two parallel (MHSA, FFN) branches, the
# parameters and FLOPs of a ViT-S36. A2 recipe at lr 4e-3; stochastic depth 0.1, raised from
# the S12 value for the 36 residual blocks (the paper adjusts it per model, following CaiT).
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(backbone=dict(depth=18, num_parallel=2, drop_path_rate=0.1))
