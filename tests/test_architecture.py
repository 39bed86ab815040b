"""The package layers: each package imports only the packages below it (read from the source with ``ast``); the
benchmarks: grouped by purpose, sharing one module for running commands and reading what they print."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "anemo_like"
BASE = {"atomic_io", "interrupts", "links", "partition", "progress", "sphere"}  # single modules every layer may use
# package -> the packages it may import; docs/architecture.md describes each layer
ALLOWED: dict[str, set[str]] = {
    "atomic_io": {"interrupts"},
    "interrupts": set(),
    "links": set(),
    "partition": set(),
    "progress": set(),
    "sphere": set(),
    "config": BASE,
    "graphs": {"config"} | BASE,
    "data": {"config"} | BASE,
    "models": {"config", "graphs", "data"} | BASE,
    "runtime": {"config", "graphs", "data", "models"} | BASE,
    "checkpoints": {"config", "graphs", "data", "models", "runtime"} | BASE,
    "diagnostics": {"config", "graphs", "data", "models", "runtime"} | BASE,
    "distributed": {"config", "graphs", "data", "models", "runtime"} | BASE,
    "tracking": {"config"} | BASE,
    "scoring": {"config", "data"} | BASE,
    "anemoi_import": {"config", "graphs", "data", "models", "runtime", "checkpoints"} | BASE,
}
ALLOWED["training"] = {*ALLOWED, "checkpoints", "diagnostics", "distributed"} - {"training", "anemoi_import"}
ALLOWED["inference"] = set(ALLOWED["training"])  # beside training, not on it: what both need lives below them
ALLOWED["profiling"] = set(ALLOWED["training"]) | {"training"}
ALLOWED["cli"] = {*ALLOWED} - {"cli"}


def imported_packages(path: Path) -> list[tuple[int, str, str]]:
    """(line, anemo_like package, full module) of every anemo_like import in ``path``, lazy imports included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "anemo_like":
            modules = [node.module] if "." in node.module else [f"anemo_like.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.startswith("anemo_like.")]
        else:
            continue
        found += [(node.lineno, module.split(".")[1], module) for module in modules]
    return found


def package_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_package_has_a_row_and_the_table_has_no_cycle() -> None:
    packages = {package_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert packages == set(ALLOWED), f"add or remove rows: {packages ^ set(ALLOWED)}"
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"cycle: {' -> '.join((*path, package))}"
        if package not in done:
            for below in ALLOWED[package]:
                visit(below, (*path, package))
            done.add(package)

    for package in ALLOWED:
        visit(package, ())


def test_packages_import_only_packages_below_them() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)}:{line} ({package_of(path)}) imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if package_of(path) != "__init__"
        for line, target, module in imported_packages(path)
        if target not in (package_of(path), "__version__") and target not in ALLOWED[package_of(path)]
    ]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_kernels_do_not_import_the_network() -> None:
    ops = PACKAGE / "models" / "ops"
    upward = [
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in sorted(ops.rglob("*.py"))
        for line, target, module in imported_packages(path)
        if target == "models" and not module.startswith("anemo_like.models.ops")
    ]
    assert not upward, "\n".join(upward)


KERNELS = {PACKAGE / "models" / "ops" / "triton_graph_attention.py"}  # Triton kernels: long by nature


def test_files_and_functions_stay_small() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if source.count("\n") > 400:
            too_long.append(f"{path.relative_to(PACKAGE)}: {source.count(chr(10))} lines (at most 400)")
        if path in KERNELS:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                lines = node.end_lineno - node.lineno + 1
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines} lines (at most 60)")
    assert not too_long, "\n".join(too_long)


def test_benchmarks_and_tests_stay_under_400_lines() -> None:
    repo = PACKAGE.parents[1]
    too_long = [
        f"{path.relative_to(repo)}: {lines} lines (at most 400)"
        for folder in (repo / "benchmarks", repo / "tests")
        for path in sorted(folder.rglob("*.py"))
        if (lines := path.read_text().count("\n")) > 400
    ]
    assert not too_long, "\n".join(too_long)


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The anemo_like modules ``path`` imports; ``from package import module`` names the module, not the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("anemo_like"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
    return found & modules


def test_no_module_import_cycle_type_checking_imports_included() -> None:
    """Module by module, every anemo_like import (lazy and ``TYPE_CHECKING`` ones too): no cycle, not even of two."""
    modules = {module_of(path): path for path in PACKAGE.rglob("*.py")}
    edges = {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}
    cycles, state = [], dict.fromkeys(modules, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for below in sorted(edges[name]):
            if state[below] == 1:
                cycles.append(" -> ".join([*path[path.index(below) :], below]))
            elif state[below] == 0:
                visit(below, [*path, below])
        state[name] = 2

    for name in sorted(modules):
        if state[name] == 0:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


BENCHMARKS = PACKAGE.parents[1] / "benchmarks"
PURPOSES = {"speed", "scaling", "anchor", "skill", "gpu", "data"}  # benchmarks/__init__.py says what each holds
SHARED_RUNNER = BENCHMARKS / "script_runs.py"
READS_PRINTED_JSON = re.compile(r"json\.loads\([^)\n]*(stdout|lines\[-1\]|splitlines\(\)\[-1\])")


def test_benchmarks_sit_in_folders_by_purpose_beside_one_shared_module() -> None:
    """Scripts live in one folder per purpose, each a package with a docstring; at the top only the shared module."""
    assert {p.name for p in BENCHMARKS.glob("*.py")} == {"__init__.py", SHARED_RUNNER.name}
    folders = {p.name for p in BENCHMARKS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == PURPOSES
    for folder in sorted(folders):
        init = BENCHMARKS / folder / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{init}: say what the folder holds"
        assert list((BENCHMARKS / folder).glob("*.py")) != [init], f"{folder}: an empty folder"


def test_benchmarks_run_commands_and_read_their_json_through_the_shared_module() -> None:
    """Reading the JSON line a command printed, and the helpers every script needs (CPU seconds, VmHWM, a free port),
    are written once, in ``benchmarks/script_runs.py``."""
    shared = {"last_json", "print_json", "run_json", "run_checked", "run_logged", "recorded", "cpu_s", "status_mib"}
    shared |= {"free_port", "console_script", "script"}
    again = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        if path == SHARED_RUNNER:
            continue
        source = path.read_text()
        if found := READS_PRINTED_JSON.search(source):
            again.append(f"{path.relative_to(BENCHMARKS)}: reads printed JSON ({found.group(0)})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name in shared | {"json_line", "cpu_time_s", "run_once"}:
                again.append(f"{path.relative_to(BENCHMARKS)}:{node.lineno} defines {node.name}")
    assert not again, "use benchmarks/script_runs.py instead:\n" + "\n".join(again)
    assert shared <= {n.name for n in ast.parse(SHARED_RUNNER.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_every_benchmark_module_imports_from_its_folder() -> None:
    """Every benchmark module imports (its siblings and the shared module by their ``benchmarks.*`` names), in one
    process: a moved script whose imports broke fails here, before its slower dry run."""
    names = [
        ".".join(path.relative_to(BENCHMARKS.parent).with_suffix("").parts)
        for path in sorted(BENCHMARKS.glob("*/*.py"))
        if path.name != "__init__.py"
    ]
    code = f"import importlib, sys\nsys.path.insert(0, {str(BENCHMARKS.parent)!r})\n"
    code += f"for name in {names!r}:\n    importlib.import_module(name)\nprint(len(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


DRY_RUN_ELSEWHERE = {  # scripts without a dry run of their own in tests/, and why
    "anchor/anemoi_big_model.py": "anemoi's side of anchor/import_big.py, run by that script's dry run",
    "gpu/gpu_anchor.py": "needs anemoi-models' CUDA wheels: gpu/gpu_check.py runs it on a GPU (docs/gpu.md)",
    "gpu/gpu_wheels.py": "downloads the GPU machine's wheels (GBs of CUDA builds): make gpu-wheels",
    "skill/ensemble_skill.py": "hours of ensemble training; its tables and targets are tested on saved scores",
    "skill/finetune_skill.py": "hours of Held-Suarez training to score; docs/training.md gives its figures",
    "skill/regional_skill.py": "hours of regional training to score; docs/regional.md gives its figures",
}


def test_every_benchmark_script_has_its_dry_run_in_the_suite() -> None:
    """A script (a module with a ``__main__`` block) is run by a test that names it by its folder, or says here
    why not; a script that gains a dry run leaves the list."""
    others = sorted(p for p in (PACKAGE.parents[1] / "tests").glob("*.py") if p.name != Path(__file__).name)
    tests = "".join(path.read_text() for path in others)
    untested = set()
    for path in sorted(BENCHMARKS.glob("*/*.py")):
        folder, name = path.parent.name, path.name
        if '__name__ == "__main__"' in path.read_text() and not any(
            mention in tests for mention in (f'"{folder}" / "{name}"', f"{folder}/{name}")
        ):
            untested.add(f"{folder}/{name}")
    assert untested == set(DRY_RUN_ELSEWHERE), f"without a dry run: {sorted(untested)}"
