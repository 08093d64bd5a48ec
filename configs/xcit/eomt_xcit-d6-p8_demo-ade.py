# Demo: EoMT with a small XCiT (6 blocks, 128 wide, 8×8 patches) from scratch on the demo
# ADE20k-layout set. The queries join the tokens in the last 2 blocks: each takes its
# cross-covariance attention over the patches its mask covers, and the local patch
# interaction leaves them out (docs/eomt.md). out_type='avg_featmap' builds the final norm
# the mask module reads through and no class-attention stage (EoMT does not run one).
_base_ = '../_base_/demo_eomt_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.XCiT', out_type='avg_featmap')))
