"""VeOmni engine (``strategy=veomni``, optional dependency ``pip install verl[veomni]``).

Importing this package does not import ``veomni``; the engine imports it when it builds its model.
"""

from verl.workers.engine.veomni.config import VeOmniEngineConfig
from verl.workers.engine.veomni.transformer_impl import VeOmniEngine, VeOmniEngineWithLMHead, import_veomni

__all__ = ["VeOmniEngine", "VeOmniEngineConfig", "VeOmniEngineWithLMHead", "import_veomni"]
