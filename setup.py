import os.path as osp

from setuptools import find_packages, setup

version: dict = {}
exec(open('vitdense/version.py').read(), version)

setup(
    name='vitdense',
    version=version['__version__'],
    description='ViT, CaiT, XCiT and ConViT backbones for the OpenMMLab stack',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['vitdense', 'vitdense.*']),
    python_requires='>=3.10',
    install_requires=[
        'torch>=2.6', 'torchvision', 'mmengine>=0.10.3,<0.11', 'timm>=1.0', 'numpy>=1.24',
        'packaging',
        # mmengine 0.10 finds the packages behind `mmdet::` / `mmseg::` config bases with
        # pkg_resources, which setuptools 81 and later no longer ship.
        'setuptools>=77.0.3,<81',
    ],
    extras_require={
        # mmcv-lite plus vitdense's torch-native ops, served as mmcv._ext by the start-up
        # file of vitdense-mmcv-ext (packaging/vitdense-mmcv-ext); the compiled mmcv
        # (tools/install.sh --full-mmcv) is used instead whenever it is installed.
        'openmmlab': ['mmcv-lite>=2.1.0,<2.2', 'vitdense-mmcv-ext>=1.0,<2',
                      'mmdet>=3.3.0,<3.4', 'mmsegmentation>=1.2.2,<1.3',
                      'mmpretrain>=1.2.0,<1.3', 'pycocotools', 'ftfy', 'regex'],
        'tests': ['pytest', 'pytest-xdist'],
    },
)
