from setuptools import find_packages, setup

setup(
    name="hetauto-megatron",
    version="0.1.0",
    description="Plan and run one LLM training job across clusters of different accelerators (Megatron-Core plugin).",
    python_requires=">=3.12",
    packages=find_packages(include=["hetauto_megatron", "hetauto_megatron.*"]),
    package_data={"hetauto_megatron": ["data/*.yaml", "data/*/*"]},
    install_requires=["pyyaml", "numpy"],
    entry_points={"console_scripts": ["hetauto=hetauto_megatron.cli:main",
                                      "hetauto-torchrun=hetauto_megatron.megatron.torchrun:main"]},
)
