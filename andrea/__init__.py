"""ANDREA: a reproducible pipeline that grows small GPT language models from open chat data."""

__version__ = "0.1.0"
