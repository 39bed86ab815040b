"""anemo_like: train, shard and run encoder-processor-decoder graph-transformer weather forecast models."""

__version__ = "0.1.0"
