"""Install mindone_zero and parallel_modules.

`python -m pip install -e .` for the library and tools; add `[test]` for the test suite,
`[docs]` for the documentation site (`mkdocs build --strict`, also run by the tests) and
`[plot]` for the benchmark plots. Packages are found, not listed, so that a new subpackage
is never left out of the wheel (tests/unit/test_wheel.py builds and imports it). The console
commands are the offline combine and the memory estimator (`mindone_zero/cli/`).
"""
from setuptools import find_packages, setup

setup(
    name="mindone_zero",
    version="0.1.0",
    description="MindSpore-native ZeRO (stages 0-3) with MindOne's mindone.trainers.zero API",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mindone_zero", "mindone_zero.*", "parallel_modules", "parallel_modules.*"]),
    entry_points={
        "console_scripts": [
            "mindone-zero-convert = mindone_zero.cli.convert:main",
            "mindone-zero-estimate-memory = mindone_zero.cli.estimate_memory:main",
        ],
    },
    python_requires=">=3.9",
    install_requires=[
        # Any 2.10.x build named mindspore: pip keeps an installed Ascend or GPU build of 2.10 instead
        # of replacing it with PyPI's (docs/guides/ascend-gpu.md, tests/unit/test_install_pin.py).
        "mindspore>=2.10.0,<2.11",
        "numpy<2",
        "pyyaml",
    ],
    extras_require={
        # wheel: tests/unit/test_wheel.py; matplotlib: the benchmark pages' figures are tested as their tables are;
        # pytest-xdist: the suite's scheduler subclasses its scope scheduling ([Note: test scheduling] in
        # tests/scheduling.py; tests/unit/test_scheduling.py runs it)
        "test": ["pytest>=8,<10", "pytest-timeout", "pytest-xdist>=3.8,<4", "setuptools", "wheel", "matplotlib"],
        # MindOne's documentation stack; tests/unit/test_docs_build.py runs `mkdocs build --strict`.
        # ruff: mkdocstrings formats (wraps) the signatures with it.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26", "ruff"],
        "plot": ["matplotlib"],
    },
)
