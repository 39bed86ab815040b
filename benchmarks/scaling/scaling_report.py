"""The scaling benchmark's report: a markdown table with per-grid-point costs, the cost curves as a PNG and an
O1280 projection from the measured per-point costs (``benchmarks/scaling/scaling.py --report DIR``)."""

from __future__ import annotations

from pathlib import Path

O1280_POINTS = 4 * 1280**2 + 36 * 1280
"""Points of the O1280 grid (6,599,680)."""
SYSTEMS = ("ours", "anchor", "ours planned")


def _gib(mib: float) -> str:
    return f"{mib / 1024:.2f}"


def model_table(rows: list[dict]) -> list[str]:
    reads = {r["grid"]: r.get("sample_read_s") for r in rows if r["row"] == "read"}
    lines = [
        "| grid | points | mesh | system | graph build s | graph build peak GiB | step CPU s | µs / point "
        "| step memory MiB | KiB / point | peak RSS GiB | sample read s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["row"] == "model"):
        read = reads.get(r["grid"]) if r["system"] == "ours" else None
        read_text = f"{read:.3f}" if read is not None else ""
        if "stopped" in r:
            seen = r.get("peak_rss_seen_mib", 0)
            lines.append(
                f"| {r['grid']} | | r{r['mesh_res']} | {r['system']} | stopped: {r['stopped']} after "
                f"{r.get('after_s', '?')} s, {_gib(seen)} GiB resident | | | | | | | |"
            )
            continue
        lines.append(
            f"| {r['grid']} | {r['points']:,} | r{r['mesh_res']} ({r['hidden_nodes']:,}) | {r['system']} "
            f"| {r['graph_build_s']:.1f} | {_gib(r['graph_build_peak_rss_mib'])} | {r['step_cpu_s']:.2f} "
            f"| {r['step_cpu_us_per_point']:.1f} | {r['step_memory_mib']:.0f} | {r['step_memory_kib_per_point']:.3f} "
            f"| {_gib(r['peak_rss_mib'])} | {read_text} |"
        )
    return lines


def ratio_table(rows: list[dict]) -> list[str]:
    by = {(r["grid"], r["system"]): r for r in rows if r["row"] == "model" and "stopped" not in r}
    grids = list(dict.fromkeys(r["grid"] for r in rows if r["row"] == "model"))
    lines = [
        "| grid | CPU ours / anchor | memory ours / anchor | CPU planned / anchor | memory planned / anchor "
        "| plan (budget MiB: chunks, recomputation) | predicted / measured tensor peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for grid in grids:
        ours, anchor, planned = (by.get((grid, s)) for s in SYSTEMS)
        if anchor is None or ours is None:
            continue
        cells = [
            f"{ours['step_cpu_s'] / anchor['step_cpu_s']:.2f}",
            f"{ours['step_memory_mib'] / anchor['step_memory_mib']:.2f}",
        ]
        if planned is not None and planned.get("memory_plan"):
            plan = planned["memory_plan"]
            cells += [
                f"{planned['step_cpu_s'] / anchor['step_cpu_s']:.2f}",
                f"{planned['step_memory_mib'] / anchor['step_memory_mib']:.2f}",
                f"{plan['budget_mib']:.0f}: {plan['settings']}",
                f"{plan['predicted_peak_mib']:.0f} / {planned['tensor_peak_mib']:.0f}",
            ]
        else:
            cells += ["", "", "", ""]
        lines.append(f"| {grid} | " + " | ".join(cells) + " |")
    return lines


def sharded_table(rows: list[dict]) -> list[str]:
    lines = []
    for r in (r for r in rows if r["row"] == "sharded" and "settings" in r):
        lines += [
            f"Sharded at {r['grid']} ({r['graph']['data_nodes']:,} points), edges strategy, gloo, 1 thread per rank:",
            "",
            "| ranks | per-rank step memory MiB (max) | live tensors MiB (max) | step CPU s per rank (max) "
            "| step wall s (max) | activation bytes / step | gradient bytes / step |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in r["settings"]:
            wall = max(p["step_wall_s"] for p in s["per_rank"])
            sent = s["bytes_per_step_all_ranks"]
            lines.append(
                f"| {s['ranks_per_model']} | {s['peak_step_mib_max']:.0f} | {s['live_tensor_peak_mib_max']:.0f} "
                f"| {s['step_cpu_s_max']:.1f} | {wall:.1f} | {sent['activations'] / 2**20:.0f} MiB "
                f"| {sent['gradients'] / 2**20:.0f} MiB |"
            )
    return lines


ANCHOR_GPU_O96_STEP_S = 0.098
"""anemoi-models' O96-class step (40,320 points, mesh r5, same model) on one H200, bf16-mixed, Triton:
docs/gpu.md, 2026-11-26. With the anchor's CPU step at O96 it gives a GPU / CPU-core speed ratio."""
NVLINK_BYTES_PER_S = 450e9
"""One direction of an H100/H200 NVLink 4 port group (900 GB/s both ways)."""


def projection(rows: list[dict]) -> list[str]:
    """O1280 from the largest grid's measured per-point costs (linear in points) and counted bytes."""
    done = {(r["grid"], r["system"]): r for r in rows if r["row"] == "model" and "stopped" not in r}
    ours = [r for (_, system), r in done.items() if system == "ours"]
    if not ours:
        return []
    largest = max(ours, key=lambda r: r["points"])
    scale = O1280_POINTS / largest["points"]
    cpu_s, memory_gib = largest["step_cpu_s"] * scale, largest["step_memory_mib"] * scale / 1024
    weights_gib = 4 * largest["params"] * scale / 2**30
    lines = [
        f"From {largest['grid']} ({largest['points']:,} points, mesh r{largest['mesh_res']}) to O1280 "
        f"({O1280_POINTS:,} points, x{scale:.1f}), costs linear in points (batch 1, fp32, default chunking):",
        "",
        f"- one step: {cpu_s:,.0f} CPU-s of one core of this machine;",
        f"- memory of one instance: {memory_gib:.0f} GiB of step memory (gradients, AdamW moments, activations) "
        f"+ {weights_gib:.1f} GiB of weights (trainable node and edge features grow with the graph);",
    ]
    anchor_o96 = done.get(("O96", "anchor"))
    if anchor_o96 is not None:
        ratio = anchor_o96["step_cpu_s"] / ANCHOR_GPU_O96_STEP_S
        lines.append(
            f"- on GPUs: anemoi-models' O96 step is {ratio:.0f}x faster on one H200 (bf16-mixed, "
            f"{ANCHOR_GPU_O96_STEP_S} s) than on one core here ({anchor_o96['step_cpu_s']:.1f} s); at that "
            f"ratio our O1280 step takes {cpu_s / ratio:.1f} s on one GPU, {cpu_s / ratio / 4:.1f} s on 4 and "
            f"{cpu_s / ratio / 8:.1f} s on 8 if sharding divided the work evenly;"
        )
    sharded = [r for r in rows if r["row"] == "sharded" and "settings" in r]
    for setting in sharded[-1]["settings"] if sharded else []:
        ranks, sent = setting["ranks_per_model"], sum(setting["bytes_per_step_all_ranks"].values()) * scale
        if ranks < 2:
            continue
        lines.append(
            f"- sharded over {ranks}: {setting['peak_step_mib_max'] * scale / 1024:.0f} GiB of step memory per rank "
            f"(measured {setting['peak_step_mib_max']:.0f} MiB per rank at {largest['grid']}), {sent / 2**30:.1f} GiB "
            f"sent per step by all ranks together (activations and gradients, counted), "
            f"{sent / ranks / NVLINK_BYTES_PER_S:.2f} s per rank at NVLink's 450 GB/s."
        )
    return lines


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for system, style in zip(SYSTEMS, ("o-", "s--", "^:"), strict=True):
        done = sorted(
            (r for r in rows if r["row"] == "model" and r["system"] == system and "stopped" not in r),
            key=lambda r: r["points"],
        )
        if not done:
            continue
        points = [r["points"] for r in done]
        time_ax.plot(points, [r["step_cpu_us_per_point"] for r in done], style, label=system)
        memory_ax.plot(points, [r["step_memory_kib_per_point"] for r in done], style, label=system)
    for ax, label in ((time_ax, "step CPU µs per grid point"), (memory_ax, "step memory KiB per grid point")):
        ax.set_xscale("log")
        ax.set_xlabel("grid points (O48, O96, O160, O320)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Training step (forward, backward, AdamW), 256 channels, 8 layers, 1 thread")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(rows: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    bench = [r for r in rows if r["row"] == "bench"]
    sections = [model_table(rows), ratio_table(rows), sharded_table(rows), projection(rows)]
    if bench:
        b = bench[-1]
        sections.append([f"anemo-bench at {b['grid']}: bound {b.get('bound')}; {b.get('advice', b.get('stopped'))}"])
    (folder / "scaling.md").write_text("\n\n".join("\n".join(s) for s in sections if s) + "\n")
    plot(rows, folder / "scaling.png")
