"""Configuration: the Hydra config tree shipped with the package and its pydantic validation."""

from anemo_like.config.paths import config_dir
from anemo_like.config.schema import RunConfig
from anemo_like.config.validate import ConfigError, validate_config

__all__ = ["ConfigError", "RunConfig", "config_dir", "validate_config"]
