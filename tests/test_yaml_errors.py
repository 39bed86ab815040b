"""YAML syntax errors in config files (docs/errors.md, "Config"): the packaged trees, a user's --config-dir and
an +experiment file name the file, the line and what to fix, in one line, word for word."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from anemo_like.config import ConfigError, config_dir
from anemo_like.config.inference import inference_config_dir
from anemo_like.config.yaml_errors import check_yaml_files, config_dirs, yaml_config_error, yaml_file_error

BROKEN_YAML = {
    "tab indentation": (
        "training:\n  max_steps: 3\n\trollout:\n    max: 2\n",
        "3: YAML syntax error: found a tab character where indentation is expected (indent with spaces)",
    ),
    "tab after a colon": (
        "training:\n  max_steps:\t3\n",
        "2: YAML syntax error: found a tab character where YAML allows only spaces",
    ),
    "duplicate key": (
        "training:\n  lr: 1\n  rollout:\n    max: 2\n  lr: 2\n",
        "5: duplicate key 'lr' (first at line 2)",
    ),
    "duplicate key in a nested section": (
        "data:\n  variables:\n    prognostic: [sp]\n    forcing: []\n    prognostic: [t_850]\n",
        "5: duplicate key 'prognostic' (first at line 3)",
    ),
    "unclosed bracket": (
        "data:\n  variables:\n    prognostic: [sp, t_850\n  timestep: 6h\n",
        "3: YAML syntax error: the '[' opened here is not closed (expected ',' or ']', but got ':' at line 4)",
    ),
    "unclosed bracket at the end": (
        "data:\n  variables:\n    prognostic: [sp, t_850\n",
        "3: YAML syntax error: the '[' opened here is not closed (expected ',' or ']', but got the end of the file "
        "at line 4)",
    ),
    "unclosed quote": (
        'model:\n  name: "graph\ntraining:\n  max_steps: 3\n',
        "2: YAML syntax error: the quoted string opened here is not closed (found unexpected end of the file at "
        "line 5)",
    ),
    "bad indentation": (
        "training:\n  max_steps: 3\n   rollout: 2\n",
        "3: YAML syntax error: mapping values are not allowed here (check the indentation of this line and the one "
        "above, or quote a value that holds ': ')",
    ),
    "list item in a mapping": (
        "training:\n  max_steps: 3\n  - 2\n",
        "3: YAML syntax error: expected <block end>, but found '-' (while parsing a block mapping at line 2)",
    ),
}


@pytest.mark.parametrize("text, message", BROKEN_YAML.values(), ids=BROKEN_YAML)
def test_yaml_syntax_error_names_file_and_line(tmp_path, text: str, message: str) -> None:
    file = tmp_path / "broken.yaml"
    file.write_text(text)
    assert str(yaml_file_error(file)) == f"{file}:{message}"
    with pytest.raises(yaml.YAMLError) as info:  # what Hydra's OmegaConf.load raises for it
        OmegaConf.load(file)
    assert str(yaml_config_error(info.value)) == f"{file}:{message}"


def test_packaged_config_trees_are_valid_yaml() -> None:
    check_yaml_files([config_dir(), inference_config_dir()])


def test_yaml_error_in_a_copy_of_the_package_tree_and_in_a_user_config_dir(tmp_path) -> None:
    tree = Path(shutil.copytree(config_dir(), tmp_path / "tree"))
    user = tmp_path / "mine"
    (user / "experiment").mkdir(parents=True)
    (user / "experiment" / "short.yaml").write_text("# @package _global_\ntraining:\n  max_steps: 5\n")
    (user / "notes.txt").write_text("\tnot a config: Hydra reads only .yaml files\n")
    check_yaml_files(config_dirs(["-cd", str(user), "+experiment=short"], tree))
    (user / "experiment" / "short.yaml").write_text("training:\n  max_steps: 5\n  max_steps: 6\n")
    with pytest.raises(ConfigError) as info:
        check_yaml_files(config_dirs([f"--config-dir={user}", "+experiment=short"], tree))
    assert str(info.value) == f"{user / 'experiment' / 'short.yaml'}:3: duplicate key 'max_steps' (first at line 2)"
    default = tree / "training" / "default.yaml"
    default.write_text(default.read_text().replace("\nmax_steps:", "\n\tmax_steps:"))
    with pytest.raises(ConfigError) as info:
        check_yaml_files(config_dirs([], tree))
    line = default.read_text().splitlines().index(next(x for x in default.read_text().splitlines() if "\tmax" in x))
    assert str(info.value) == (
        f"{default}:{line + 1}: YAML syntax error: found a tab character where indentation is expected (indent with "
        "spaces)"
    )


def test_config_dirs_reads_hydras_directory_options(tmp_path) -> None:
    tree = tmp_path / "tree"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    argv = ["--config-dir", str(one), f"-cp={two}", "-cd", str(tmp_path / "absent"), "model.num_channels=8"]
    assert config_dirs(argv, tree) == [tree, one, two]


# ONE TEST, failing until run_hydra_command (cli/hydra_entry.py) calls check_yaml_files(config_dirs(argv, tree))
def test_cli_yaml_syntax_error_is_one_message_and_exit_2(tmp_path) -> None:
    mine, experiments = tmp_path / "mine", tmp_path / "experiments"
    (experiments / "experiment").mkdir(parents=True), mine.mkdir()
    (mine / "broken.yaml").write_text("defaults:\n  - quickstart\n  - _self_\ntraining:\n\tmax_steps: 3\n")
    (experiments / "experiment" / "dup.yaml").write_text("# @package _global_\ncheckpoint: x\ncheckpoint: y\n")
    commands = {
        "anemo-train": (
            ["anemo_like.cli.train", "--config-dir", str(mine), "--config-name=broken"],
            f"anemo-train: {mine / 'broken.yaml'}:5: YAML syntax error: found a tab character where indentation is "
            "expected (indent with spaces)\n",
        ),
        "anemo-infer": (
            ["anemo_like.cli.infer", f"--config-dir={experiments}", "+experiment=dup"],
            f"anemo-infer: {experiments / 'experiment' / 'dup.yaml'}:3: duplicate key 'checkpoint' (first at line 2)\n",
        ),
    }
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", *arguments],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (arguments, _) in commands.items()
    }
    for name, process in started.items():
        output, _ = process.communicate(timeout=60)
        assert (process.returncode, output) == (2, commands[name][1]), f"{name}:\n{output}"
