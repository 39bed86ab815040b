"""The memory limit of this process's control group (a SLURM job's ``--mem``, a container's limit): the kernel
kills the job when its processes use more, whatever the machine has free. cgroup v2 (``memory.max``) and v1
(``memory.limit_in_bytes``); the tightest limit on the path from the process's group up to the root counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMBERSHIP = Path("/proc/self/cgroup")
_NO_LIMIT = 2**62  # v1 writes "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class CgroupMemory:
    """A group's memory limit and what its processes hold now that the kernel cannot drop, bytes."""

    limit: int
    in_use: int  # usage less the page cache it may reclaim (inactive_file)
    where: str  # the limit's file, e.g. /sys/fs/cgroup/slurm/job_42/memory.max

    @property
    def room(self) -> int:
        return max(0, self.limit - self.in_use)


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2's "max": no limit


def _inactive_file(stat: Path, key: str) -> int:
    try:
        fields = dict(line.split() for line in stat.read_text().splitlines() if line.count(" ") == 1)
    except (OSError, ValueError):
        return 0
    return int(fields.get(key, 0))


def _group_paths(membership: Path) -> list[tuple[str, str]]:
    """(hierarchy folder below the root, group path) of the memory controller: v2's unified ``0::/path`` or v1's
    ``N:...memory...:/path``."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if "memory" in controllers.split(","):
            paths.append(("memory", group))
        elif number == "0" and controllers == "":
            paths.append(("", group))
    return paths


def cgroup_memory(root: Path = CGROUP_ROOT, membership: Path = MEMBERSHIP) -> CgroupMemory | None:
    """The tightest memory limit over this process's groups and their ancestors (None: no limit, or not Linux)."""
    tightest: CgroupMemory | None = None
    for hierarchy, group in _group_paths(membership):
        v2 = hierarchy == ""
        limit_file, usage_file = (
            ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        )
        folder = root / hierarchy / group.lstrip("/")
        for level in (folder, *folder.parents):
            if not level.is_relative_to(root):
                break
            limit = _number(level / limit_file)
            if limit is None or limit >= _NO_LIMIT:
                continue
            usage = _number(level / usage_file) or 0
            cache = _inactive_file(level / "memory.stat", "inactive_file" if v2 else "total_inactive_file")
            found = CgroupMemory(limit, max(0, usage - cache), str(level / limit_file))
            if tightest is None or found.room < tightest.room:
                tightest = found
    return tightest
