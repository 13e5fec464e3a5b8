"""Ready-to-run training examples; run them from the repository root as modules (``python -m examples...``)."""
