# Demo: UperNet with a small XCiT (6 blocks, 128 wide, 8×8 patches) from scratch on the seeded
# demo ADE20k-layout set (python tools/data/make_demo_data.py ade); minutes on a CPU.
_base_ = '../_base_/demo_upernet_ade.py'
