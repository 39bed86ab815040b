"""``anemo-train --config-name=NAME key=value ...``: validate the composed config, then train.

The config is validated before torch is imported, so a bad key fails in well under a second.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from anemo_like.config import ConfigError, config_dir, validate_config
from anemo_like.config.validate import check_override_keys

LOG = logging.getLogger("anemo_like")


def _train(cfg: DictConfig) -> None:
    try:
        config = validate_config(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as exc:
        LOG.error("%s", exc)
        sys.exit(2)
    from anemo_like.training.trainer import Trainer  # torch and friends: only once the config is known good

    try:  # setup checks the config against the dataset: a mismatch is the user's to fix, not a crash
        trainer = Trainer(config)
    except (ValueError, FileNotFoundError) as exc:
        LOG.error("%s", exc)
        sys.exit(2)
    trainer.fit()


def main() -> None:
    try:
        check_override_keys(sys.argv[1:])
    except ConfigError as exc:
        print(f"anemo-train: {exc}", file=sys.stderr)
        sys.exit(2)
    hydra.main(config_path=str(config_dir()), config_name="quickstart", version_base="1.3")(_train)()


if __name__ == "__main__":
    main()
