# Demo: Mask R-CNN with a small XCiT (6 blocks, 128 wide, 8×8 patches) from scratch on the
# seeded demo COCO set (python tools/data/make_demo_data.py coco); minutes on a CPU.
_base_ = '../_base_/demo_mask-rcnn_coco.py'
