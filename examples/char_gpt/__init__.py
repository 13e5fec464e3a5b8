"""A small GPT-style character language model trained on generated text."""
