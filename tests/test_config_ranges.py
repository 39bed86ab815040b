"""Impossible values in the config, refused with one line naming the key, the value and what to give instead:
zero-sized layers, Adam betas outside [0, 1) and non-finite numbers; the values just inside are accepted."""

from __future__ import annotations

import pytest
from bad_input_helpers import config_error
from test_contradictions import accepted, one_problem

from anemo_like.config import RunConfig


# ------------------------------------------------------------------------------------------- zero-sized layers
def empty_mlp(ratio: str, channels: int, smallest: str) -> str:
    return (
        f"config section 'model': mlp_hidden_ratio ({ratio}) leaves the MLP hidden layer empty: int(num_channels "
        f"({channels}) * {ratio} + 0.5) = 0 units; raise mlp_hidden_ratio to at least {smallest}"
    )


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model.mlp_hidden_ratio=0.001"], empty_mlp("0.001", 64, "0.007813")),
        (
            ["model.num_channels=16", "model.num_heads=2", "model.mlp_hidden_ratio=0.03"],
            empty_mlp("0.03", 16, "0.03125"),
        ),
        (
            ["model=transformer", "model.num_channels=128", "model.mlp_hidden_ratio=0.003"],
            empty_mlp("0.003", 128, "0.003907"),
        ),
        (["model.num_channels=1", "model.num_heads=1", "model.mlp_hidden_ratio=0.4"], empty_mlp("0.4", 1, "0.5")),
        (
            ["model.num_channels=11", "model.num_heads=1", "model.mlp_hidden_ratio=1e-9"],
            empty_mlp("1e-09", 11, "0.045455"),
        ),
    ],
    ids=["quickstart", "tiny model", "transformer processor", "one channel", "odd channels"],
)
def test_empty_mlp_hidden_layer_is_refused(overrides: list[str], line: str) -> None:
    assert config_error(*overrides) == one_problem(line)


@pytest.mark.parametrize("channels, ratio", [(16, "0.03125"), (64, "0.007813"), (11, "0.045455"), (1, "0.5")], ids=str)
def test_the_smallest_suggested_ratio_gives_one_unit(channels: int, ratio: str) -> None:
    model = accepted(f"model.num_channels={channels}", "model.num_heads=1", f"model.mlp_hidden_ratio={ratio}").model
    assert int(model.num_channels * model.mlp_hidden_ratio + 0.5) == 1


def test_other_widths_cannot_be_zero() -> None:
    """Head width: fewer channels than heads does not divide; trainable features may be 0 (none appended)."""
    assert config_error("model.num_channels=2", "model.num_heads=4") == one_problem(
        "config section 'model': num_channels (2) must be divisible by num_heads (4)"
    )
    assert config_error("model.num_channels=0") == one_problem(
        "config key 'model.num_channels' = 0: expected at least 1"
    )
    assert accepted("model.trainable.nodes=0", "model.trainable.edges=0").model.trainable.edges == 0


# ---------------------------------------------------------------------------------------- betas outside [0, 1)
@pytest.mark.parametrize(
    "betas, shown, line",
    [
        ("[1.0,0.9]", "[1.0, 0.9]", "got beta1 = 1.0"),
        ("[-0.1,0.9]", "[-0.1, 0.9]", "got beta1 = -0.1"),
        ("[0.9,1.0]", "[0.9, 1.0]", "got beta2 = 1.0"),
        ("[0.9,1.5]", "[0.9, 1.5]", "got beta2 = 1.5"),
    ],
    ids=["beta1 = 1", "negative beta1", "beta2 = 1", "beta2 above 1"],
)
def test_betas_outside_zero_to_one_are_refused(betas: str, shown: str, line: str) -> None:
    assert config_error(f"training.optimizer.betas={betas}") == one_problem(
        f"config key 'training.optimizer.betas' = {shown}: Adam's betas must each be at least 0 and below 1, "
        f"{line}; e.g. [0.9, 0.95]"
    )


@pytest.mark.parametrize("betas, values", [("[0.0,0.0]", (0.0, 0.0)), ("[0.9,0.999]", (0.9, 0.999))], ids=str)
def test_betas_within_zero_to_one_are_accepted(betas: str, values: tuple[float, float]) -> None:
    assert accepted(f"training.optimizer.betas={betas}").training.optimizer.betas == values


# ------------------------------------------------------------------------------------------ non-finite numbers
NON_FINITE = [
    ("training.optimizer.lr=inf", "training.optimizer.lr", "inf"),
    ("training.optimizer.lr=nan", "training.optimizer.lr", "nan"),
    ("training.optimizer.weight_decay=-inf", "training.optimizer.weight_decay", "-inf"),
    ("training.optimizer.betas=[0.9,nan]", "training.optimizer.betas.1", "nan"),
    ("training.optimizer.gradient_clip_norm=inf", "training.optimizer.gradient_clip_norm", "inf"),
    ("training.max_minutes=inf", "training.max_minutes", "inf"),
    ("system.hardware.memory_budget_gb=inf", "system.hardware.memory_budget_gb", "inf"),
    ("model.mlp_hidden_ratio=nan", "model.mlp_hidden_ratio", "nan"),
    ("+training.variable_loss_weights.sp=inf", "training.variable_loss_weights.sp", "inf"),
]


@pytest.mark.parametrize("override, key, shown", NON_FINITE, ids=[case[0] for case in NON_FINITE])
def test_non_finite_numbers_are_refused(override: str, key: str, shown: str) -> None:
    assert config_error(override) == one_problem(f"config key '{key}' = {shown}: expected a finite number")


def test_every_non_finite_number_is_named() -> None:
    assert config_error("training.optimizer.lr=inf", "training.optimizer.lr_min=nan") == (
        "invalid configuration:\n"
        "  config key 'training.optimizer.lr' = inf: expected a finite number\n"
        "  config key 'training.optimizer.lr_min' = nan: expected a finite number"
    )


def test_a_validated_config_survives_its_json_round_trip() -> None:
    """What a checkpoint stores (model_dump_json) loads back: no value can be written as null in a float's place."""
    config = accepted("training.optimizer.lr=1e-2", "training.optimizer.lr_min=1e-2")
    assert RunConfig.model_validate_json(config.model_dump_json()) == config
