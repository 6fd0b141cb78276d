"""Whether the model file and this machine compute what DeepSeek's model computes: `ds4 check`
against DeepSeek's official log-probability vectors (official.py)."""
