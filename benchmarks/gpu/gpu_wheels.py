#!/usr/bin/env python3
"""Download the wheels the GPU proof kit needs on an offline CUDA machine into ``.gpu-wheels/`` (``make gpu-wheels``).

The GPU machine has torch, triton, torch-geometric, numpy, scipy, xarray, matplotlib, pytest and pyyaml, but not
hydra, pydantic or zarr: those and their dependencies are downloaded here as CPython 3.12 manylinux x86_64 (or
pure-python) wheels, pinned to the versions installed in the Python running this script (the project's ``.venv``),
so the GPU run uses what the tests here ran with. A package published as an sdist only (antlr4-python3-runtime) is
built into a wheel here (pure python). When ``benchmarks/gpu/gpu_anchor.py`` is there, its ``--download-wheels`` fetches
the anemoi-models side's wheels into ``.gpu-wheels/anchor/`` (its graphs, built by its ``--build-graphs``, go into
``.gpu-wheels/anchor_graphs/``).

The working tree travels with that folder, and both together must stay under 64 MiB: the sizes are printed and an
excess exits with status 1.

    .venv/bin/python benchmarks/gpu/gpu_wheels.py            # what `make gpu-wheels` runs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import REPO, script

PACKAGES = (
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "zarr",
    "numcodecs",
    "donfig",
    "google-crc32c",
)
"""Distributions the package imports (directly or through its dependencies) that the GPU machine lacks."""
ANCHOR_SCRIPT = script("gpu_anchor.py")
TARGET = ["--python-version", "3.12", "--implementation", "cp"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
LIMIT_MIB = 64.0
"""What may travel to the GPU machine: the working tree plus the wheels."""


def pinned(names: tuple[str, ...]) -> list[str]:
    """``NAME==VERSION`` of each distribution as installed in this Python."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in names]


def download(requirement: str, folder: Path) -> None:
    """One binary wheel for the GPU machine; a pure-python sdist (no wheel published) is built into one here."""
    platforms = [flag for name in PLATFORMS for flag in ("--platform", name)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run([*command, *TARGET, *platforms, "-d", str(folder), requirement], capture_output=True)
    if done.returncode == 0:
        return
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder), requirement],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise SystemExit(f"no wheel for {requirement}:\n{done.stderr.decode()[-1500:]}\n{built.stderr[-1500:]}")
    wheels = sorted(folder.glob(f"{requirement.split('==')[0].replace('-', '_')}-*.whl"))
    if not wheels or not all(w.name.endswith("-none-any.whl") for w in wheels):
        raise SystemExit(f"{requirement}: built a wheel that is not pure python: {[w.name for w in wheels]}")


def tracked_bytes() -> int:
    """Sizes of the files git tracks in the working tree (deleted ones count 0)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = (REPO / name for name in names.decode().split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file())


def mib(size: int) -> float:
    return size / 2**20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / ".gpu-wheels", help="wheel folder (ignored by git)")
    args = p.parse_args(argv)
    args.out.mkdir(exist_ok=True)
    for stale in args.out.glob("*.whl"):  # pins change: start afresh (the anchor's subfolders are its own)
        stale.unlink()
    for requirement in pinned(PACKAGES):
        download(requirement, args.out)
    subprocess.run([sys.executable, str(ANCHOR_SCRIPT), "--download-wheels", str(args.out / "anchor")], check=True)
    files = sorted(f for f in args.out.rglob("*") if f.is_file())
    for file in files:
        print(f"{mib(file.stat().st_size):8.2f} MiB  {file.relative_to(args.out)}")
    folder_bytes, tree_bytes = sum(f.stat().st_size for f in files), tracked_bytes()
    total = mib(folder_bytes + tree_bytes)
    print(f"{args.out.name}: {mib(folder_bytes):.2f} MiB ({len(files)} files), tracked tree {mib(tree_bytes):.2f} MiB")
    print(f"total {total:.2f} MiB of {LIMIT_MIB:.0f} MiB")
    if total >= LIMIT_MIB:
        raise SystemExit(
            f"{args.out.name} + tracked tree = {total:.2f} MiB: over the {LIMIT_MIB:.0f} MiB the GPU run may carry"
        )


if __name__ == "__main__":
    main()
