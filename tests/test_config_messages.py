"""Config messages name the key or file and what to do (docs/errors.md, "Config"): values the schema refused in a
library's words (seeds, ``graph.knn``, the tracking URI, empty paths, a value where a section goes), keys put in
the wrong section, and command-line overrides Hydra refuses with several lines or a traceback (a config group given
something other than its options, a value the shell split at a space, a character to quote, a sweep without
``--multirun``, ``+`` on a key already set). Each message is checked word for word, and against its row."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bad_input_helpers import assert_cli_cases, config_error, run_cli
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from inference_helpers import config_error as infer_config_error
from inference_helpers import documented
from omegaconf import OmegaConf

from anemo_like.cli.overrides import check_overrides, composition_error
from anemo_like.cli.sync import main as anemo_sync
from anemo_like.config import ConfigError, config_dir
from anemo_like.config.inference import inference_config_dir, validate_inference_config
from anemo_like.config.yaml_errors import config_dirs

PREFIX = "invalid configuration:\n  "


def override_error(*argv: str, tree=None) -> str:
    """The line for these command-line arguments, checked before Hydra composes (anemo-train's tree by default)."""
    arguments = list(argv)
    with pytest.raises(ConfigError) as info:
        check_overrides(arguments, config_dirs(arguments, tree or config_dir()))
    assert str(info.value).startswith(PREFIX)
    return str(info.value).removeprefix(PREFIX)


def composition_message(*overrides: str) -> str:
    """The line for overrides Hydra refuses while composing the quickstart config."""
    with pytest.raises(HydraException) as info, initialize_config_dir(str(config_dir()), version_base="1.3"):
        compose(config_name="quickstart", overrides=list(overrides))
    return composition_error(info.value, list(overrides))


# ------------------------------------------------------------------------------------- values the schema refuses
URI_HINT = (
    "give an MLflow tracking URI of scheme http, https, databricks, sqlite, postgresql, mysql or mssql, e.g. "
    "http://host:5000 or sqlite:///path/mlflow.db"
)
VALUE_CASES = {  # overrides, the line, whether docs/errors.md holds the line
    "seed below 0": (
        ["training.seed=-1"],
        "config key 'training.seed' = -1: expected at least 0",
        True,
    ),
    "seed above 2**32 - 1": (
        ["training.seed=4294967296"],
        "config key 'training.seed' = 4294967296: expected at most 4294967295",
        True,
    ),
    "seed above 2**63 - 1": (
        ["training.seed=9223372036854775808"],
        "config key 'training.seed' = 9223372036854775808: expected at most 4294967295",
        False,
    ),
    "built-in dataset seed below 0": (
        ["data.builtin_seed=-3"],
        "config key 'data.builtin_seed' = -3: expected at least 0",
        False,
    ),
    "knn above the mesh nodes": (
        ["graph.knn=43", "graph.mesh_resolution=1"],
        "config section 'graph': knn (43) is more than the 42 hidden (mesh) nodes of mesh_resolution 1; set "
        "graph.knn to at most 42 or raise graph.mesh_resolution",
        True,
    ),
    "knn above the mesh nodes, coarsest mesh": (
        ["graph.knn=13", "graph.mesh_resolution=0"],
        "config section 'graph': knn (13) is more than the 12 hidden (mesh) nodes of mesh_resolution 0; set "
        "graph.knn to at most 12 or raise graph.mesh_resolution",
        False,
    ),
    "tracking URI of an unknown scheme": (
        ["diagnostics.tracking.tracking_uri=htp://x"],
        f"config key 'diagnostics.tracking.tracking_uri' = 'htp://x': unknown scheme 'htp'; {URI_HINT}",
        True,
    ),
    "tracking URI that is a folder": (
        ["diagnostics.tracking.tracking_uri=/shared/mlruns"],
        f"config key 'diagnostics.tracking.tracking_uri' = '/shared/mlruns': no scheme; {URI_HINT}",
        False,
    ),
    "tracking URI without a host": (
        ["diagnostics.tracking.tracking_uri=http:/x"],
        f"config key 'diagnostics.tracking.tracking_uri' = 'http:/x': no host; {URI_HINT}",
        False,
    ),
    "single value where a section goes": (
        ["model.encoder=graphtransformer"],
        "config key 'model.encoder' = 'graphtransformer': expected a section of keys num_chunks, shard_strategy, "
        "gradient_checkpointing, e.g. model.encoder.num_chunks=...",
        True,
    ),
    "single value where a list of sections goes": (
        ["model.compile=[foo]"],
        "config key 'model.compile.0' = 'foo': expected a section of keys module, options",
        False,
    ),
    "value of neither type of a union": (
        ["model.encoder.num_chunks=abc"],
        "config key 'model.encoder.num_chunks' = 'abc': expected a whole number, or 'auto'",
        True,
    ),
    "boolean or auto": (
        ["model.processor.gradient_checkpointing=maybe"],
        "config key 'model.processor.gradient_checkpointing' = 'maybe': expected true or false, or 'auto'",
        False,
    ),
    "mapping where a value goes": (
        ["model.num_channels={a:1}"],
        "config key 'model.num_channels' = {'a': 1}: expected a whole number",
        True,
    ),
    "empty dataset path": (
        ["data.dataset="],
        "config key 'data.dataset' = '': an empty path would mean the current folder; give a path",
        True,
    ),
    "empty cache path": (
        ["system.paths.cache="],
        "config key 'system.paths.cache' = '': an empty path would mean the current folder; give a path",
        False,
    ),
}


@pytest.mark.parametrize("overrides, line, in_doc", VALUE_CASES.values(), ids=VALUE_CASES)
def test_values_refused_by_the_schema(overrides: list[str], line: str, in_doc: bool) -> None:
    assert config_error(*overrides) == PREFIX + line
    if in_doc:
        documented(line)


@pytest.mark.parametrize(
    "override", ["graph.knn=42", "diagnostics.tracking.tracking_uri=postgresql+psycopg2://me@db/mlflow"]
)
def test_values_at_the_limit_are_accepted(override: str) -> None:
    with pytest.raises(AssertionError, match="was accepted"):
        config_error("graph.mesh_resolution=1", override)


def test_inference_seed_is_bounded_too(tmp_path) -> None:
    def line(seed: int) -> str:
        return infer_config_error(tmp_path / "inference.pt", f"seed={seed}", "output=f.nc", "dates=[2000-11-01T00]")

    assert line(-1) == "config key 'seed' = -1: expected at least 0"
    assert line(2**32) == "config key 'seed' = 4294967296: expected at most 4294967295"


# ------------------------------------------------------------------------------------------ keys in another section
@pytest.mark.parametrize(
    "override, guess",
    [
        ("system.num_threads=4", "'system.hardware.num_threads'"),
        ("model.lr=1e-3", "'training.optimizer.lr'"),
        ("+model.lr=1e-3", "'training.optimizer.lr'"),  # added through Hydra: the path of a key in a config file
        ("training.num_channels=64", "'model.num_channels'"),
        ("training.encoder.num_chunks=2", "'model.encoder.num_chunks'"),
        ("lr=3", "'training.optimizer.lr'"),
        ("training.num_chanels=3", "'model.num_channels'"),  # misspelled and misplaced: the closest key anywhere
        (
            "model.num_chunks=2",
            "'model.encoder.num_chunks', 'model.decoder.num_chunks' or 'model.processor.num_chunks'",
        ),
    ],
)
def test_key_in_the_wrong_section_suggests_where_it_lives(override: str, guess: str) -> None:
    key = override.lstrip("+").split("=")[0]
    line, _, allowed = config_error(override).partition("; allowed here: ")
    assert line == f"{PREFIX}unknown config key '{key}' (did you mean {guess}?)" and allowed


def test_key_in_the_wrong_section_row() -> None:
    line = (
        "unknown config key 'system.num_threads' (did you mean 'system.hardware.num_threads'?); allowed here: "
        "hardware, paths"
    )
    assert config_error("system.num_threads=4") == PREFIX + line
    documented(line)


# ----------------------------------------------------------------------- overrides Hydra refuses before composing
GROUP_HINT = "choose one of graphtransformer, transformer, e.g. model=graphtransformer"
OVERRIDE_CASES = {  # command-line arguments, the line, whether docs/errors.md holds the line
    "group given a number": (["model=3"], f"config group 'model' has no option '3': {GROUP_HINT}", True),
    "group given null": (["model=null"], f"config group 'model' has no option 'null': {GROUP_HINT}", False),
    "group given nothing": (["model="], f"config group 'model' has no option '': {GROUP_HINT}", False),
    "group given a list": (["model=[a,b]"], f"config group 'model' has no option 'a', 'b': {GROUP_HINT}", False),
    "group given a mapping": (["model={a:1}"], f"config group 'model' has no option '{{a:1}}': {GROUP_HINT}", False),
    "group option that does not exist": (
        ["model=nonexistent"],
        f"config group 'model' has no option 'nonexistent': {GROUP_HINT}",
        False,
    ),
    "group that does not exist": (
        ["+experiment=missing"],
        "config group 'experiment' does not exist (+experiment=missing): the groups are data, dataloader, "
        "diagnostics, graph, model, system, training; put experiment/missing.yaml in a folder and pass it with "
        "--config-dir",
        True,
    ),
    "top-level config that does not exist": (
        ["--config-name=nonexistent"],
        "--config-name 'nonexistent': no such config; choose one of anemoi_finetune, hs_t21, hs_t21_cpu, hs_t21_day, "
        "hs_t21_ens, hs_t21_ens_day, hs_t21_finetune, hs_t21_full, quickstart, regional_global, regional_lam, "
        "regional_stretched",
        True,
    ),
    "value split by the shell": (
        ["training.max_minutes=1", "hours"],
        "cannot parse the override 'hours': it is not key=value; a value with spaces must be quoted as one "
        "argument, e.g. 'training.max_minutes=\"1 hours\"'",
        True,
    ),
    "path split by the shell": (
        ["data.dataset=/my", "data/x.zarr"],
        "cannot parse the override 'data/x.zarr': it is not key=value; a value with spaces must be quoted as one "
        "argument, e.g. 'data.dataset=\"/my data/x.zarr\"'",
        False,
    ),
    "word without a key": (
        ["hours"],
        "cannot parse the override 'hours': it is not key=value; a value with spaces must be quoted as one "
        "argument, e.g. 'key=\"a b\"'",
        False,
    ),
    "character to quote": (
        ["diagnostics.tracking.run_name=café"],
        "cannot parse the override 'diagnostics.tracking.run_name=café': the character 'é' must be quoted, e.g. "
        "'diagnostics.tracking.run_name=\"café\"'",
        True,
    ),
    "second equals sign": (
        ["a=b=c"],
        "cannot parse the override 'a=b=c' (mismatched input '=' expecting <EOF>): a value with spaces or special "
        "characters must be quoted, e.g. 'a=\"b=c\"'",
        False,
    ),
    "comma without brackets": (
        ["data.variables.prognostic=sp,t_850"],
        "config key 'data.variables.prognostic' = 'sp,t_850': a comma makes a sweep, which needs --multirun; write "
        "a list in brackets, data.variables.prognostic=[sp,t_850], or quote text, "
        "'data.variables.prognostic=\"sp,t_850\"'",
        True,
    ),
}


@pytest.mark.parametrize("argv, line, in_doc", OVERRIDE_CASES.values(), ids=OVERRIDE_CASES)
def test_overrides_refused_before_composing(argv: list[str], line: str, in_doc: bool) -> None:
    assert override_error(*argv) == line
    if in_doc:
        documented(line)


def test_good_overrides_pass(tmp_path) -> None:
    (tmp_path / "experiment" / "ablation").mkdir(parents=True)
    for name in ("small", "ablation/one"):
        (tmp_path / "experiment" / f"{name}.yaml").write_text("# @package _global_\n")
    arguments = [
        "--config-name", "hs_t21", f"--config-dir={tmp_path}", "model=transformer", "+experiment=[small,ablation/one]",
        "data.dataset=/my data/x.zarr", "diagnostics.tracking.run_name=\"café\"", "data.variables.forcing=[a,b]",
        "+data.normalizer.per_variable.q=none", "~model.noise", "hydra.run.dir=/tmp/x",
    ]  # fmt: skip
    check_overrides(arguments, config_dirs(arguments, config_dir()))
    check_overrides(["-m", "training.seed=1,2"], [config_dir()])  # a sweep with --multirun is Hydra's


def test_anemo_infer_overrides() -> None:
    assert override_error("lead_time=5", "d", tree=inference_config_dir()) == (
        "cannot parse the override 'd': it is not key=value; a value with spaces must be quoted as one argument, "
        "e.g. 'lead_time=\"5 d\"'"
    )
    assert override_error("--config-name=nope", tree=inference_config_dir()) == (
        "--config-name 'nope': no such config; choose one of default, quickstart"
    )


# --------------------------------------------------------------------------------- refused by Hydra while composing
COMPOSITION_CASES = {
    "+ on a key already set": (
        ["+training.seed=3"],
        "cannot add training.seed (+training.seed=3): it is already set; drop the +: training.seed=3",
    ),
    "key below a null section": (
        ["model.noise.channels=16"],
        "cannot set model.noise.channels (model.noise.channels=16): the composed config holds no such key (its "
        "section is null or lacks it); add it with +model.noise.channels=16",
    ),
    "deleting a key the config lacks": (
        ["~model.nope"],
        "cannot delete model.nope (~model.nope): the composed config holds no such key",
    ),
}


@pytest.mark.parametrize("overrides, line", COMPOSITION_CASES.values(), ids=COMPOSITION_CASES)
def test_overrides_refused_while_composing(overrides: list[str], line: str) -> None:
    assert composition_message(*overrides) == line
    documented(line)


# ---------------------------------------------------------------------------------------------------------- CLI
def test_cli_prints_one_line_and_no_traceback(tmp_path) -> None:
    """The command line: exit 2, the two lines and nothing else (no Hydra hints, no traceback)."""
    cases = {
        "group": ["model=3"],
        "split": ["training.max_minutes=1", "hours"],
        "quote": ["diagnostics.tracking.run_name=café"],
        "sweep": ["data.variables.prognostic=sp,t_850"],
        "add": ["+training.seed=3"],
        "null-section": ["model.noise.channels=16"],
    }
    started = {name: run_cli(tmp_path / name, *arguments) for name, arguments in cases.items()}
    lines = {
        "group": OVERRIDE_CASES["group given a number"][1],
        "split": OVERRIDE_CASES["value split by the shell"][1],
        "quote": OVERRIDE_CASES["character to quote"][1],
        "sweep": OVERRIDE_CASES["comma without brackets"][1],
        "add": COMPOSITION_CASES["+ on a key already set"][1],
        "null-section": COMPOSITION_CASES["key below a null section"][1],
    }
    infer = subprocess.run(
        [sys.executable, "-m", "anemo_like.cli.infer", "checkpoint=x.pt", "lead_time=5", "d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (infer.returncode, infer.stdout + infer.stderr) == (
        2,
        f"anemo-infer: {PREFIX}{override_error('lead_time=5', 'd', tree=inference_config_dir())}\n",
    )
    for name, process in started.items():
        output, _ = process.communicate(timeout=120)
        assert (process.returncode, output) == (2, f"anemo-train: {PREFIX}{lines[name]}\n"), name


def test_anemo_sync_checks_the_tracking_uri_too(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        anemo_sync([str(tmp_path), "--tracking-uri", "htp://x"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == f"anemo-sync: error: argument --tracking-uri: 'htp://x': unknown scheme 'htp'; {URI_HINT}"


def test_an_interpolation_that_names_nothing_is_one_line(tmp_path) -> None:
    """``${...}`` naming no key (or no environment variable) is resolved after composing: one line, exit 2."""
    assert_cli_cases(
        tmp_path,
        {
            "key": (
                ["training.seed=${oops}"],
                2,
                "invalid configuration:\n  config key 'training.seed' = '${oops}': Interpolation key 'oops' not found; "
                "give a value, or ${section.key} naming a key that exists",
            ),
            "environment": (["training.seed=${oc.env:ANEMO_NO_SUCH_VARIABLE}"], 2, "config key 'training.seed' = "),
        },
    )
    documented(
        "config key 'training.seed' = '${oops}': Interpolation key 'oops' not found; give a value, or ${section.key} "
        "naming a key that exists"
    )


def test_dates_given_on_the_command_line_replace_the_config_files_date_range() -> None:
    """The quickstart inference config sets a date_range: ``dates=`` on the command line replaces it (and
    ``date_range.start=`` a dates list), instead of a refusal of both."""
    from anemo_like.cli.infer import dates_given_win

    for given, kept in ((["dates=[2000-11-05T00]"], "dates"), (["date_range.start=2000-11-05T00"], "date_range")):
        arguments = ["checkpoint=x.pt", "output=f.nc", *dates_given_win(given)]
        with initialize_config_dir(config_dir=str(inference_config_dir()), version_base="1.3"):
            cfg = compose(config_name="quickstart", overrides=arguments)
        config = validate_inference_config(OmegaConf.to_container(cfg, resolve=True))
        assert (config.dates is not None, config.date_range.start is not None) == (kept == "dates", kept != "dates")
