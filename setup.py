"""dlmrt: single-request inference engine for block-diffusion language models (ORL)."""

from setuptools import find_packages, setup

setup(
    name="dlmrt",
    version="0.1.0",
    description="Single-request inference engine and ORL trainer for block-diffusion language models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # The Triton kernels live in the top-level `kernels/` directory but are installed as
    # `dlmrt._kernels`: a top-level `kernels` package would clash with PyPI's `kernels`.
    # Every package under dlmrt/ (found, so a new subpackage cannot be forgotten), plus the two
    # directories mapped into it.
    packages=[p for p in find_packages(include=["dlmrt", "dlmrt.*"])]
    + ["dlmrt._kernels", "dlmrt._csrc"],
    package_dir={"dlmrt": "dlmrt", "dlmrt._kernels": "kernels", "dlmrt._csrc": "csrc"},
    # The embedded demo model (dlmrt/assets/demo, ~9.7 MB) ships inside the package.
    package_data={
        "dlmrt._csrc": ["*.cu"],
        "dlmrt": ["assets/demo/*"],
        "dlmrt.server": ["playground.html"],  # the page at / of `dlmrt serve`
    },
    install_requires=[
        # Any torch >= 2.4 works; CPU machines should install the CPU wheel first (see README).
        "torch>=2.4",
        "safetensors>=0.4",
        "tokenizers>=0.19",
        "jinja2>=3.1",
        "numpy>=1.24",
        "tqdm>=4.60",
    ],
    extras_require={
        "dev": [
            "pytest>=7",
            "pytest-xdist>=3",  # the README's test command spreads the suite over the cores
            "transformers>=5.0",
            "ruff==0.17.6",  # the version the code is formatted with: `ruff format` differs across versions
            # the server tests: a live uvicorn driven by the official openai client
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "openai>=1.30",
            "httpx>=0.27",
            # structured output's grammar engine (the `structured` extra): a ~3 MB pure-CPU
            # wheel with no dependencies, so CI runs the structured-output tests too
            "llguidance>=1.0",
        ],
        # structured output (response_format): docs/structured-output.md says why llguidance
        "structured": ["llguidance>=1.0"],
        "serve": ["fastapi>=0.110", "uvicorn>=0.29"],
        "bench": ["matplotlib>=3.7", "math-verify>=0.7"],
        # tests/quant/test_nvfp4_modelopt.py: our NVFP4 export vs ModelOpt's (layout agreement)
        "quant": ["nvidia-modelopt>=0.33"],
        # optional arena attention for a round's rows on SM90+ (dlmrt/ops/flash_attn4.py)
        "fa4": ["flash-attn-4>=4.0.0b36"],
    },
    entry_points={"console_scripts": ["dlmrt = dlmrt.cli:main"]},
)
