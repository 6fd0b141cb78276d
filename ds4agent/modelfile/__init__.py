"""The model file: the GGUF reader, the model configuration and its validator, the tokenizer
built from the file's vocabulary, the inspection report, and the demo-model generator.

Names resolve lazily: a front end asking for one name does not load numpy or gguf for the rest.
"""

from __future__ import annotations

from .. import lazy

_EXPORTS = {
    "GGUFFile": ".gguf", "GGUFError": ".gguf",
    "ModelConfig": ".config", "ConfigError": ".config",
    "Tokenizer": ".tokenizer",
    "describe": ".info", "ModelReport": ".info",
    "ensure_demo": ".demo", "write_demo": ".demo", "write_model": ".demo", "shape_config": ".demo",
    "default_demo_path": ".demo",
    "resolve_model": ".choice", "ModelChoice": ".choice", "DEMO_BANNER": ".choice",
    "BOS": ".specials", "EOS": ".specials", "USER": ".specials", "ASSISTANT": ".specials", "THINK_OPEN": ".specials",
    "THINK_CLOSE": ".specials", "DSML": ".specials",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy.exports(__name__, _EXPORTS)
