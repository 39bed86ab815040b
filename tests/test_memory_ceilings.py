"""A memory budget the run could never have is refused at set-up: above the machine's memory (MemTotal), above the
memory limit of the process's control group (a SLURM job's ``--mem``, a container's limit; cgroup v1 and v2, the
tightest limit up the hierarchy), above the room under RLIMIT_AS (``tests/test_memory_refusals.py``). The control
groups are folders written here in the kernel's layout, read by the same code that reads ``/sys/fs/cgroup``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from inference_helpers import ERRORS_DOC

from anemo_like.runtime.cgroup_memory import cgroup_memory
from anemo_like.runtime.process_memory import AvailableMemory, MemoryCeiling, cpu_memory_ceilings
from anemo_like.runtime.size_limits import check_budget_below, format_gib, run_memory

GIB = 2**30
CGROUP_REMEDY = "ask for more memory (SLURM --mem, a container's limit)"


def write_group(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def test_cgroup_v2_the_tightest_limit_up_the_tree(tmp_path) -> None:
    """A SLURM step inside its job: the step has no limit of its own, the job's 8 GiB holds, less what its
    processes use that the kernel cannot drop (usage less the inactive page cache)."""
    membership = tmp_path / "cgroup"
    membership.write_text("0::/slurm/job_7/step_0\n")
    write_group(tmp_path / "slurm", memory_max="max")
    write_group(tmp_path / "slurm/job_7", memory_max=str(8 * GIB), memory_current=str(3 * GIB),
                memory_stat=f"anon {GIB}\ninactive_file {GIB}\nactive_file {GIB}")  # fmt: skip
    write_group(tmp_path / "slurm/job_7/step_0", memory_max="max", memory_current=str(GIB))
    group = cgroup_memory(tmp_path, membership)
    assert group is not None
    assert (group.limit, group.in_use, group.room) == (8 * GIB, 2 * GIB, 6 * GIB)
    assert group.where == str(tmp_path / "slurm/job_7/memory.max")


def test_cgroup_v1_memory_controller(tmp_path) -> None:
    """v1 (this machine's layout): the memory controller's own hierarchy; the page-rounded 2^63 - 1 means none."""
    membership = tmp_path / "cgroup"
    membership.write_text("5:devices:/\n4:memory:/jobs/abc\n0::/\n")
    no_limit = "9223372036854771712"
    write_group(tmp_path / "memory", memory_limit_in_bytes=no_limit)
    write_group(tmp_path / "memory/jobs", memory_limit_in_bytes=str(4 * GIB), memory_usage_in_bytes=str(GIB),
                memory_stat="cache 0\ntotal_inactive_file 0")  # fmt: skip
    write_group(tmp_path / "memory/jobs/abc", memory_limit_in_bytes=str(6 * GIB), memory_usage_in_bytes=str(GIB))
    group = cgroup_memory(tmp_path, membership)
    assert group is not None and (group.limit, group.room) == (4 * GIB, 3 * GIB)
    assert group.where == str(tmp_path / "memory/jobs/memory.limit_in_bytes")


def test_no_limit_anywhere_is_none(tmp_path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/jobs/abc\n0::/\n")
    write_group(tmp_path / "memory/jobs/abc", memory_limit_in_bytes="9223372036854771712")
    write_group(tmp_path, memory_max="max")
    assert cgroup_memory(tmp_path, membership) is None
    assert cgroup_memory(tmp_path, tmp_path / "no-such-file") is None


def test_a_budget_above_the_jobs_limit_is_refused_naming_it(tmp_path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("0::/slurm/job_7\n")
    write_group(tmp_path / "slurm/job_7", memory_max=str(8 * GIB), memory_current=str(GIB))
    group = cgroup_memory(tmp_path, membership)
    assert group is not None
    memory = AvailableMemory(group.limit, f"the memory limit of this process's control group, {group.where}")
    ceiling = MemoryCeiling(memory, "{source} ({limit})", CGROUP_REMEDY)
    with pytest.raises(ValueError) as info:
        check_budget_below(12, "system.hardware.memory_budget_gb", [ceiling])
    line = (
        "system.hardware.memory_budget_gb=12 is more than the memory limit of this process's control group, "
        "LIMIT_FILE (8.0 GiB); set system.hardware.memory_budget_gb to at most 8.0 GiB, or ask for more memory "
        "(SLURM --mem, a container's limit)"
    )
    assert str(info.value) == line.replace("LIMIT_FILE", group.where)
    assert f"`{line}`" in ERRORS_DOC
    check_budget_below(8, "system.hardware.memory_budget_gb", [ceiling])  # at the limit: kept


def test_the_lowest_ceiling_is_named() -> None:
    ceilings = [
        MemoryCeiling(
            AvailableMemory(6 * GIB, "the memory limit of this process's control group, /j/memory.max"),
            "{source} ({limit})",
            CGROUP_REMEDY,
        ),
        MemoryCeiling(AvailableMemory(4 * GIB, "this machine's memory, MemTotal"), "{source} ({limit})"),
    ]
    with pytest.raises(ValueError, match=r"MemTotal \(4.0 GiB\); set K to at most 4.0 GiB$"):
        check_budget_below(7, "K", ceilings)
    with pytest.raises(ValueError, match=r"/j/memory.max \(6.0 GiB\); set K to at most 6.0 GiB, or ask for more "):
        check_budget_below(7, "K", ceilings[:1])


def test_a_budget_above_this_machines_memory_is_refused_by_both_commands() -> None:
    total = next(c.memory.bytes for c in cpu_memory_ceilings() if c.memory.source == "this machine's memory, MemTotal")
    for key in ("system.hardware.memory_budget_gb", "memory_budget_gb"):
        with pytest.raises(ValueError) as info:
            run_memory(100_000, key, torch.device("cpu"))
        line = f"{key}=100000 is more than this machine's memory, MemTotal (TOTAL); set {key} to at most TOTAL"
        assert str(info.value) == line.replace("TOTAL", format_gib(total))
        assert f"`{line}`" in ERRORS_DOC or key == "memory_budget_gb"  # one row names both keys


def test_anemo_train_exits_2_with_one_line_and_writes_nothing(tmp_path) -> None:
    output = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "anemo_like.cli.train", "system.hardware.memory_budget_gb=100000",
         f"system.paths.output={output}", "hydra.run.dir=" + str(tmp_path / "hydra"), "hydra.output_subdir=null"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line or "Traceback" in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(errors) == 1 and "memory_budget_gb=100000 is more than this machine's memory, MemTotal" in errors[0]
    assert not output.exists() or [p.name for p in output.iterdir()] == [".run.lock"]  # the folder's lock alone


def real_cgroup(limit: int) -> Path | None:
    """A new memory control group below this process's own, limited to ``limit`` bytes (None where this process
    may not make one: not root, no memory controller, a read-only /sys/fs/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, group = line.split(":", 2)
        v1 = "memory" in controllers.split(",")
        if v1 or (number == "0" and controllers == ""):
            parent = Path("/sys/fs/cgroup") / ("memory" if v1 else "") / group.lstrip("/")
            folder = parent / f"anemo-test-{os.getpid()}"
            try:
                folder.mkdir()
                (folder / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
            except OSError:
                if folder.exists():
                    folder.rmdir()
                continue
            return folder
    return None


def test_a_real_control_group_limit_is_what_a_run_may_use(tmp_path) -> None:
    """anemo-train started in a real 3 GiB control group: a budget of 8 GiB is refused naming the group's limit."""
    folder = real_cgroup(3 * GIB)
    if folder is None:
        pytest.skip("this process may not create a memory control group")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "anemo_like.cli.train", "system.hardware.memory_budget_gb=8",
             f"system.paths.output={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())),
        )  # fmt: skip
    finally:
        folder.rmdir()
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 2 and len(errors) == 1, result.stdout + result.stderr
    limit_file = "memory.limit_in_bytes" if (folder.parent / "memory.limit_in_bytes").exists() else "memory.max"
    assert errors[0].endswith(
        f"system.hardware.memory_budget_gb=8 is more than the memory limit of this process's control group, "
        f"{folder / limit_file} (3.0 GiB); set system.hardware.memory_budget_gb to at most 3.0 GiB, or ask for more "
        "memory (SLURM --mem, a container's limit)"
    )
