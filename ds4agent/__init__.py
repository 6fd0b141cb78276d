"""ds4agent: DeepSeek V4 Flash, local and in-process, as a terminal chat and a coding agent."""

__version__ = "0.1.0"
