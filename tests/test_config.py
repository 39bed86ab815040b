"""Config validation: unknown keys, wrong types and impossible values fail early with the key, value and rule."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from pydantic import BaseModel

from anemo_like.config import ConfigError, RunConfig, config_dir, validate_config
from anemo_like.config.validate import check_override_keys

CONFIG_NAMES = [
    "quickstart", "hs_t21", "hs_t21_cpu", "hs_t21_day", "hs_t21_full", "regional_global", "regional_stretched",
    "regional_lam",
]  # fmt: skip


def composed(name: str, overrides: list[str] | None = None) -> dict:
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name=name, overrides=[*(overrides or []), "system.paths.output=/tmp/anemo-unused"])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_shipped_configs_validate(name: str) -> None:
    config = validate_config(composed(name))
    assert config.model.num_channels % config.model.num_heads == 0


def test_a_bare_year_is_a_split_date_as_in_anemoi_configs() -> None:
    config = validate_config(composed("hs_t21", ["data.splits.train.end=2000", "data.splits.val.start=2001"]))
    assert (config.data.splits.train.end, config.data.splits.val.start) == ("2000", "2001")


def test_transformer_model_group_composes() -> None:
    config = validate_config(composed("quickstart", ["model=transformer"]))
    assert config.model.processor.type == "transformer"
    assert config.model.processor.window_size == 512


def test_unknown_key_names_key_and_suggests() -> None:
    raw = composed("quickstart")
    raw["training"]["max_step"] = 10
    with pytest.raises(
        ConfigError, match=r"unknown config key 'training.max_step' \(did you mean 'training.max_steps'"
    ):
        validate_config(raw)


def test_wrong_type_and_impossible_values_are_named() -> None:
    raw = composed("quickstart")
    raw["model"]["num_channels"] = "wide"
    raw["model"]["encoder"]["num_chunks"] = 3
    raw["model"]["processor"]["num_chunks"] = 99
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    message = str(info.value)
    assert "'model.num_channels' = 'wide'" in message
    assert "'model.encoder.num_chunks' = 3" in message and "power of two" in message
    assert "num_chunks (99) must be between 1 and num_layers (4)" in message


def test_cross_field_rules() -> None:
    raw = composed("quickstart", ["model.num_channels=30", "model.num_heads=4"])
    with pytest.raises(ConfigError, match=r"config section 'model': num_channels \(30\) must be divisible") as info:
        validate_config(raw)
    assert len(str(info.value)) < 200, "a cross-key rule names the section, it does not dump it"
    raw = composed("quickstart", ["diagnostics.plot_variable=t_860"])
    with pytest.raises(ConfigError, match=r"diagnostics\.plot_variable 't_860' is not an output variable"):
        validate_config(raw)
    raw = composed("quickstart", ["+training.variable_loss_weights.sp=-1"])
    with pytest.raises(ConfigError, match="weights must be >= 0"):
        validate_config(raw)
    raw = composed("quickstart", ["training.lead_loss_weights=[1.0,0]"])
    with pytest.raises(ConfigError, match=r"training\.lead_loss_weights.*every weight must be > 0, got \[1\.0, 0\.0\]"):
        validate_config(raw)
    raw = composed("quickstart", ["data.variables.forcing=[z_500]", "data.variables.prognostic=[z_500]"])
    with pytest.raises(ConfigError, match="'z_500' is listed as both prognostic and forcing"):
        validate_config(raw)


def test_command_line_override_keys_are_checked_before_hydra() -> None:
    check_override_keys(["model.num_channels=8", "model=transformer", "hydra.run.dir=x", "+extra=1", "--cfg=job"])
    check_override_keys(["training.variable_loss_weights.sp=2"])  # free-form mapping below a known key
    with pytest.raises(ConfigError, match=r"'model.procesor.num_layers' \(did you mean 'model.processor'\?\)"):
        check_override_keys(["model.procesor.num_layers=2"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.num_chanels=3", "did you mean 'model.num_channels'"),
        ("model.num_heads=0", "'model.num_heads' = 0"),
    ],
)
def test_cli_bad_config_exits_2_with_message_before_importing_torch(tmp_path, override: str, expected: str) -> None:
    probe = (
        "import sys\n"
        f"sys.argv = ['anemo-train', '--config-name=quickstart', '{override}', 'hydra.run.dir={tmp_path}']\n"
        "from anemo_like.cli.train import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    print('exit', exc.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "exit 2 False" in done.stdout, done.stdout + done.stderr
    assert expected in done.stdout + done.stderr


def schema_keys(model, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf key in the schema."""
    keys = []
    for name, field in model.model_fields.items():
        nested = next(
            (
                c
                for c in (field.annotation, *getattr(field.annotation, "__args__", ()))
                if isinstance(c, type) and issubclass(c, BaseModel)
            ),
            None,
        )
        keys += schema_keys(nested, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return keys


def test_every_config_key_is_documented() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", text))
    # "a.b.c / .d" rows document siblings a.b.c and a.b.d
    for row in re.findall(r"`([a-z_.]+)`((?: / `\.[a-z_]+`)+)", text):
        base = row[0].rsplit(".", 1)[0]
        documented |= {base + sibling for sibling in re.findall(r"`(\.[a-z_]+)`", row[1])}
    missing = [key for key in schema_keys(RunConfig) if key not in documented]
    assert not missing, f"undocumented config keys in docs/configuration.md: {missing}"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["system.hardware.num_gpus_per_model=3"], "num_gpus_per_model=3 must be a power of two and at most"),
        (["system.hardware.num_gpus_per_model=16", "model.num_heads=8"], "at most model.num_heads (8)"),
        (["system.hardware.num_gpus_per_model=2", "dataloader.read_group_size=4"], "read_group_size=4 must divide"),
        (["model=transformer", "model.processor.shard_strategy=edges"], "the transformer processor shards by heads"),
        (["model.encoder.shard_strategy=rows"], "'model.encoder.shard_strategy' = 'rows'"),
    ],
)
def test_model_sharding_keys_are_checked(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(composed("quickstart", overrides))
    assert expected in str(info.value)


def test_transformer_processor_defaults_to_head_sharding() -> None:
    config = validate_config(composed("quickstart", ["model=transformer", "system.hardware.num_gpus_per_model=2"]))
    assert config.model.processor.shard_strategy == "heads"
    assert config.model.encoder.shard_strategy == "edges"
