"""anemo-import's refusals (docs/errors.md, "anemo-import"): options it does not reproduce, versions and layouts it
does not know, files that are not anemoi checkpoints, damaged files, pickles that would run code, and an output that
exists. Each is refused with one line naming the file, checked word for word against its row, and nothing is written.

The crafted files are copies of a real anemoi checkpoint (tests/data/anemoi/default) with one zip member replaced."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inference_helpers import documented

from anemo_like.anemoi_import.archive import ImportRefused
from anemo_like.anemoi_import.convert import import_checkpoint

SOURCE = Path(__file__).resolve().parent / "data" / "anemoi" / "default" / "inference-last.ckpt"
UNREPRODUCED = "uses what anemo-import does not reproduce: "
BOUNDING = "anemoi.models.layers.bounding."


# ------------------------------------------------------------------------------------------------ helpers
def replaced(tmp_path: Path, suffix: str, change: Callable[[bytes], bytes]) -> Path:
    """A copy of SOURCE whose one member ending in ``suffix`` holds ``change(its bytes)``; the others, and the
    members' order, as they are."""
    path = tmp_path / "crafted.ckpt"
    with zipfile.ZipFile(SOURCE) as source, zipfile.ZipFile(path, "w") as crafted:
        members = source.infolist()
        assert sum(m.filename.endswith(suffix) for m in members) == 1
        for info in members:
            data = source.read(info)
            crafted.writestr(info, change(data) if info.filename.endswith(suffix) else data)
    return path


def with_metadata(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """SOURCE with its anemoi.json edited in place by ``edit``."""

    def change(raw: bytes) -> bytes:
        metadata = json.loads(raw)
        edit(metadata)
        return json.dumps(metadata).encode()

    return replaced(tmp_path, "/anemoi-metadata/anemoi.json", change)


def with_pickle(tmp_path: Path, payload: bytes) -> Path:
    """SOURCE, anemoi-metadata and storages intact, with ``payload`` as its data.pkl."""
    return replaced(tmp_path, "/data.pkl", lambda _: payload)


def refused(source: Path, output: Path) -> str:
    """``import_checkpoint(source, output)``'s refusal: one line naming ``source``; nothing at ``output``
    afterwards and nothing else beside it (its folder's listing unchanged)."""
    folder = output.parent
    before = sorted(folder.iterdir())
    with pytest.raises(ImportRefused) as info:
        import_checkpoint(source, output)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(source) in message, message
    assert not output.exists()
    assert sorted(folder.iterdir()) == before
    return message


def model(metadata: dict[str, Any]) -> dict[str, Any]:
    return metadata["config"]["model"]


def processors(metadata: dict[str, Any]) -> dict[str, Any]:
    return metadata["config"]["data"]["datasets"]["data"]["processors"]


def bounding(target: str, **extra: Any) -> Callable[[dict[str, Any]], None]:
    def edit(metadata: dict[str, Any]) -> None:
        entry = {"_target_": BOUNDING + target, "variables": ["sp"], **extra}
        model(metadata)["bounding"]["datasets"]["data"] = [entry]

    return edit


def set_key(where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Callable[[dict], None]:
    return lambda metadata: where(metadata).__setitem__(key, value)


def processor(metadata: dict[str, Any]) -> dict[str, Any]:
    return model(metadata)["processor"]


def encoder(metadata: dict[str, Any]) -> dict[str, Any]:
    return model(metadata)["encoders"]["0"]["mapper"]


REMAPPER = {"_target_": "anemoi.models.preprocessing.remapper.Remapper", "config": {"cos_sin": {"t_850": "x"}}}
TRUNCATED = {"_target_": "anemoi.models.layers.residual.TruncatedConnection"}


# ------------------------------------------------------------------------------------------------ options
# (edit of anemoi.json, what the message must name: the key and the value)
OPTIONS = {
    "qk_norm": (set_key(processor, "qk_norm", True), ["model.processor.qk_norm=true"]),
    "glu": (set_key(processor, "mlp_implementation", "gated"), ['model.processor.mlp_implementation="gated"']),
    "edge_pre_mlp": (set_key(encoder, "edge_pre_mlp", True), ["model.encoders.0.mapper.edge_pre_mlp=true"]),
    "attn_channels": (set_key(processor, "attn_channels", 16), ["model.processor.attn_channels=16"]),
    "silu": (set_key(processor, "layer_kernels", {"Activation": {"_target_": "torch.nn.SiLU"}}), ["Activation="]),
    "second_encoder": (
        lambda m: model(m)["encoders"].__setitem__("1", model(m)["encoders"]["0"]),
        ["model.encoders and model.decoders hold 2 and 1 entries"],
    ),
    "second_decoder": (
        lambda m: model(m)["decoders"].__setitem__("1", model(m)["decoders"]["0"]),
        ["model.encoders and model.decoders hold 1 and 2 entries"],
    ),
    "second_dataset": (lambda m: m["data_indices"].__setitem__("era5", m["data_indices"]["data"]), ["'era5'"]),
    "ensemble_model": (
        set_key(lambda m: model(m)["model"], "_target_", "anemoi.models.models.AnemoiEnsModelEncProcDec"),
        ["model.model._target_=anemoi.models.models.AnemoiEnsModelEncProcDec"],
    ),
    "ensemble_task": (
        set_key(lambda m: m["config"]["task"], "_target_", "anemoi.training.tasks.EnsembleForecaster"),
        ["task anemoi.training.tasks.EnsembleForecaster"],
    ),
    "diffusion_task": (
        set_key(lambda m: m["config"]["task"], "_target_", "anemoi.training.tasks.DiffusionForecaster"),
        ["task anemoi.training.tasks.DiffusionForecaster"],
    ),
    "hardtanh": (bounding("HardtanhBounding", min_val=0.0, max_val=1.0), ["HardtanhBounding on ['sp']"]),
    "fraction": (bounding("FractionBounding", min_val=0.0, max_val=1.0, total_var="t_850"), ["FractionBounding"]),
    "remapper": (set_key(processors, "remapper", REMAPPER), ["remapper", REMAPPER["_target_"]]),
    "normalizer_remap": (
        lambda m: processors(m)["normalizer"]["config"].__setitem__("remap", {"sp": "t_850"}),
        ["data processor normalizer (remap;"],
    ),
    "truncated": (
        lambda m: model(m)["residual"]["datasets"].__setitem__("data", TRUNCATED),
        ["model.residual=", "TruncatedConnection"],
    ),
}


@pytest.mark.parametrize("case", OPTIONS)
def test_unsupported_option_is_refused_by_name(case, tmp_path) -> None:
    edit, names = OPTIONS[case]
    path = with_metadata(tmp_path, edit)
    message = refused(path, tmp_path / "imported")
    for name in names:
        assert name in message, message
    documented(message, FILE=path)


def test_several_options_in_one_message(tmp_path) -> None:
    def edit(metadata: dict[str, Any]) -> None:
        processor(metadata).update(qk_norm=True, mlp_implementation="gated")
        model(metadata)["model"]["_target_"] = "anemoi.models.models.AnemoiEnsModelEncProcDec"
        bounding("HardtanhBounding", min_val=0.0, max_val=1.0)(metadata)

    path = with_metadata(tmp_path, edit)
    message = refused(path, tmp_path / "imported")
    assert message.startswith(f"{path} {UNREPRODUCED}") and message.count(str(path)) == 1
    problems = message.removeprefix(f"{path} {UNREPRODUCED}").split("; ")
    assert [p.split(" (")[0] for p in problems] == [
        "model.model._target_=anemoi.models.models.AnemoiEnsModelEncProcDec",
        "model.processor.qk_norm=true",
        'model.processor.mlp_implementation="gated"',
        f"model.bounding {BOUNDING}HardtanhBounding on ['sp']",
    ]
    documented(message, FILE=path)


# ------------------------------------------------------------------------------------------------ versions, layouts
@pytest.mark.parametrize("release", ["0.21.0", "0.18.2"])
def test_another_anemoi_models_release_is_refused(release, tmp_path) -> None:
    versions = lambda m: m["provenance_training"]["module_versions"]  # noqa: E731
    path = with_metadata(tmp_path, set_key(versions, "anemoi.models", {"version": release}))
    message = refused(path, tmp_path / "imported")
    assert f"anemoi-models {release}" in message and "reads the layout of anemoi-models 0.19.x" in message
    assert ("migrate it to anemoi-models 0.19" in message) == (release < "0.19")
    documented(message, FILE=path)


def test_unknown_metadata_version_is_refused(tmp_path) -> None:
    path = with_metadata(tmp_path, lambda m: m.__setitem__("version", "9.9"))
    message = refused(path, tmp_path / "imported")
    assert "'9.9'" in message
    documented(message, FILE=path)


def test_pickle_of_another_layout_is_refused(tmp_path) -> None:
    path = with_pickle(tmp_path, pickle.dumps({"weights": [1.0, 2.0]}, protocol=2))
    message = refused(path, tmp_path / "imported")
    assert "a layout anemo-import does not know (it holds a dict," in message
    documented(message, FILE=path)


# ------------------------------------------------------------------------------------------------ not an anemoi file
def test_text_file_is_refused(tmp_path) -> None:
    path = tmp_path / "notes.ckpt"
    path.write_text("an anemoi checkpoint, honestly\n")
    documented(refused(path, tmp_path / "imported"), FILE=path)


def test_empty_file_is_refused(tmp_path) -> None:
    path = tmp_path / "empty.ckpt"
    path.touch()
    documented(refused(path, tmp_path / "imported"), FILE=path)


def test_missing_file_is_refused(tmp_path) -> None:
    path = tmp_path / "nowhere" / "inference-last.ckpt"
    documented(refused(path, tmp_path / "imported"), FILE=path)


def test_zip_without_anemoi_metadata_is_refused(tmp_path) -> None:
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("other/readme.txt", "not a checkpoint")
    documented(refused(path, tmp_path / "imported"), FILE=path)


def test_our_own_inference_checkpoint_needs_no_import(tmp_path) -> None:
    ours = import_checkpoint(SOURCE, tmp_path / "ours").output
    message = refused(ours, tmp_path / "imported")
    assert "an anemo_like inference.pt needs no import" in message
    documented(message, FILE=ours)


# ------------------------------------------------------------------------------------------------ damaged files
def test_truncated_file_is_refused(tmp_path) -> None:
    path = tmp_path / "inference-last.ckpt"
    raw = SOURCE.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    documented(refused(path, tmp_path / "imported"), FILE=path)


def test_corrupted_storage_member_is_refused(tmp_path) -> None:
    path = tmp_path / "inference-last.ckpt"
    raw = bytearray(SOURCE.read_bytes())
    with zipfile.ZipFile(SOURCE) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size if "/data/" in i.filename else 0)
    assert info.compress_type == zipfile.ZIP_STORED
    name_length, extra_length = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    middle = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
    raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])  # the CRC left as it was
    path.write_bytes(raw)
    message = refused(path, tmp_path / "imported")
    assert f"its member {info.filename} is corrupted (CRC mismatch)" in message
    documented(message, FILE=path)


# ------------------------------------------------------------------------------------------------ malicious pickles
def _global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _call(function: bytes, *args: bytes) -> bytes:
    return function + b"(" + b"".join(args) + b"tR"


def _pickle(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


class _Touch:
    """Pickles, as any class may, to a call of os.system (protocol 2: GLOBAL 'posix system', REDUCE)."""

    def __init__(self, sentinel: Path) -> None:
        self.command = _touch(sentinel)

    def __reduce__(self) -> tuple:
        return os.system, (self.command,)


def _touch(sentinel: Path) -> str:
    return f"touch {shlex.quote(str(sentinel))}"


def _python_touch(sentinel: Path) -> str:
    return f"__import__('os').system({_touch(sentinel)!r})"


OS_MODULE = _call(_global("builtins", "__import__"), _text("os"))
# the global refused -> the pickle, given the sentinel file it would create
PAYLOADS: dict[str, tuple[str, Callable[[Path], bytes]]] = {
    "os.system": ("os.system", lambda s: _pickle(_call(_global("os", "system"), _text(_touch(s))))),
    "reduce": (f"{os.system.__module__}.system", lambda s: pickle.dumps(_Touch(s), protocol=2)),
    "posix.system": ("posix.system", lambda s: _pickle(_call(_global("posix", "system"), _text(_touch(s))))),
    "builtins.eval": ("builtins.eval", lambda s: _pickle(_call(_global("builtins", "eval"), _text(_python_touch(s))))),
    "builtins.exec": ("builtins.exec", lambda s: _pickle(_call(_global("builtins", "exec"), _text(_python_touch(s))))),
    "subprocess.Popen": (
        "subprocess.Popen",
        lambda s: _pickle(_call(_global("subprocess", "Popen"), b"](" + _text("touch") + _text(str(s)) + b"e")),
    ),
    # getattr(__import__('os'), 'system')('touch SENTINEL'): getattr is inert, __import__ refused
    "getattr_import": (
        "builtins.__import__",
        lambda s: _pickle(_call(_call(_global("builtins", "getattr"), OS_MODULE, _text("system")), _text(_touch(s)))),
    ),
}


@pytest.mark.parametrize("case", PAYLOADS)
def test_malicious_pickle_is_refused_and_nothing_runs(case, tmp_path) -> None:
    name, payload = PAYLOADS[case]
    sentinel = tmp_path / "SENTINEL"
    path = with_pickle(tmp_path, payload(sentinel))
    message = refused(path, tmp_path / "imported")
    assert f"its pickle calls {name}," in message and "nothing in it was run" in message
    assert not sentinel.exists()
    documented(message, FILE=path, GLOBAL=name)
    # the payload is live: an ordinary unpickler runs it
    result = pickle.loads(payload(sentinel))
    if isinstance(result, subprocess.Popen):
        result.wait(timeout=30)
    assert sentinel.exists()


def test_getattr_of_an_inert_class_runs_nothing(tmp_path) -> None:
    """getattr(AnemoiModelInterface, 'system')('touch SENTINEL'): anemoi's own class and getattr are inert stand-ins,
    so the call makes another stand-in; the file is then refused as an unknown layout."""
    sentinel = tmp_path / "SENTINEL"
    interface = _global("anemoi.models.interface", "AnemoiModelInterface")
    chain = _call(_call(_global("builtins", "getattr"), interface, _text("system")), _text(_touch(sentinel)))
    path = with_pickle(tmp_path, _pickle(chain))
    message = refused(path, tmp_path / "imported")
    assert message.startswith(f"{path}: a layout anemo-import does not know (it holds a ")
    assert not sentinel.exists()


def test_malicious_pickle_through_the_cli(tmp_path) -> None:
    sentinel = tmp_path / "SENTINEL"
    path = with_pickle(tmp_path, PAYLOADS["os.system"][1](sentinel))
    out = tmp_path / "imported"
    before = sorted(tmp_path.iterdir())
    result = subprocess.run(
        [sys.executable, "-m", "anemo_like.cli.import_anemoi", str(path), str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert all("[INFO]" in line for line in result.stdout.splitlines())  # the steps it took, nothing else
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("anemo-import: "), result.stderr
    assert not sentinel.exists() and not out.exists()
    assert sorted(tmp_path.iterdir()) == before
    documented(lines[0].removeprefix("anemo-import: "), FILE=path, GLOBAL="os.system")
