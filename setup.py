"""Install mindone_zero and parallel_modules.

`python -m pip install -e .` for the library and tools; add `[test]` for the test suite
and `[plot]` for the benchmark plots.
"""
from setuptools import setup

setup(
    name="mindone_zero",
    version="0.1.0",
    description="MindSpore-native ZeRO (stages 0-3) with MindOne's mindone.trainers.zero API",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=["mindone_zero", "mindone_zero.checkpoint", "parallel_modules"],
    python_requires=">=3.9",
    install_requires=[
        "mindspore==2.10.0",
        "numpy<2",
        "pyyaml",
    ],
    extras_require={
        "test": ["pytest", "pytest-timeout"],
        "plot": ["matplotlib"],
    },
)
