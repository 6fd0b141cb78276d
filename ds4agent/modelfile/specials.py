"""The special tokens of the DeepSeek V4 vocabulary that the code names (protocol constants:
they must match the official vocabulary byte for byte; docs/protocol.md §1.1).

Kept apart from the tokenizer so that the chat protocol can use them without loading the GGUF
reader (numpy) or the tokenizer library."""

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "｜DSML｜"
REQUIRED_SPECIALS = {"bos": BOS, "eos": EOS, "user": USER, "assistant": ASSISTANT,
                     "think_open": THINK_OPEN, "think_close": THINK_CLOSE, "dsml": DSML}
