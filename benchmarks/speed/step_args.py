"""The flags of ``step_time.py`` (the anchor harness's, ../shared/bench/anchor/run.py, and ours), and the reference
model size of the memory and speed issues as such flags."""

from __future__ import annotations

import argparse

REFERENCE = ["--grid", "96x192", "--mesh-res", "4", "--channels", "256", "--layers", "8", "--heads", "16"]
"""The reference model size of the memory and speed issues, as flags of this script."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("graph")
    g.add_argument(
        "--grid", default="32x64", help="O<N> octahedral, NLATxNLON cell-centred lat/lon grid, or N Fibonacci points"
    )
    g.add_argument("--mesh-res", type=int, default=3, help="icosahedron refinements of the hidden mesh")
    g.add_argument("--cutoff-factor", type=float, default=0.6)
    g.add_argument("--knn", type=int, default=3)
    m = p.add_argument_group("model")
    m.add_argument("--processor", choices=["graphtransformer", "transformer"], default="graphtransformer")
    m.add_argument("--channels", type=int, default=128)
    m.add_argument("--heads", type=int, default=16)
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--mlp-hidden-ratio", type=float, default=4.0)
    m.add_argument("--num-vars", type=int, default=8, help="prognostic variables")
    m.add_argument("--multistep", type=int, default=2)
    m.add_argument("--num-chunks-mapper", type=int, default=4)
    m.add_argument("--num-chunks-processor", type=int, default=None, help="default: 4 if it divides --layers, else 1")
    m.add_argument("--no-grad-checkpointing", action="store_true")
    m.add_argument("--graph-attention-backend", choices=["torch", "reference", "triton"], default="torch")
    m.add_argument(
        "--block-elements",
        default="auto",
        help="model.block_elements: elements of one scratch block (auto: 2^18 on CPU, 2^24 on a GPU)",
    )
    m.add_argument("--window-size", type=int, default=512, help="transformer processor half window")
    m.add_argument("--node-trainable", type=int, default=8)
    m.add_argument("--edge-trainable", type=int, default=8)
    r = p.add_argument_group("run")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: timed by CUDA events")
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch default)")
    r.add_argument("--optim", choices=["none", "adamw"], default="none")
    r.add_argument(
        "--mode",
        choices=["train", "infer"],
        default="train",
        help="train: forward+backward; infer: eval-mode forward without gradients (ANEMOI_INFERENCE_NUM_CHUNKS* apply)",
    )
    r.add_argument(
        "--release-cpu-heap-mib",
        type=float,
        default=32.0,
        help="system.hardware.release_cpu_heap_mib (0: off, glibc keeps freed heap resident)",
    )
    r.add_argument(
        "--precision",
        choices=["32", "bf16-mixed", "16-mixed", "bf16"],
        default="32",
        help="training.precision: autocast for the mixed modes, a bf16 model and inputs for bf16",
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--live-tensors",
        action="store_true",
        help="after the timed steps, run one more under LiveTensorTracker: peak of live tensors, no allocator effects",
    )
    r.add_argument(
        "--count-flops",
        action="store_true",
        help="after the timed steps, count the matmul FLOPs of one more step (torch.utils.flop_counter)",
    )
    r.add_argument(
        "--count-ops",
        action="store_true",
        help="after the timed steps, count the aten operators one more step dispatches and its host syncs (the "
        "harness's own loss read left out)",
    )
    r.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture the step as a CUDA graph after the warm-up and time its replays (training: forward, backward "
        "and a fused AdamW step, --optim adamw; --mode infer: the forward); CUDA only",
    )
    r.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps (torch.profiler)")
    r.add_argument(
        "--triton-stand-in",
        action="store_true",
        help="on CPU, run the triton backend's custom ops as their shape-only stand-ins (zeros): its host-side "
        "operators can then be counted without a GPU; times and losses mean nothing",
    )
    r.add_argument(
        "--memory-budget-gb",
        type=float,
        default=None,
        help="plan chunks and recomputation for this budget (num_chunks and gradient_checkpointing auto: the "
        "chunk and checkpointing flags are ignored); reports the plan and its predicted peak",
    )
    r.add_argument("--label", default="")
    r.add_argument("--out", default="", help="also append the JSON line to this file")
    args = p.parse_args(argv)
    if args.num_chunks_processor is None:
        args.num_chunks_processor = 4 if args.layers % 4 == 0 else 1
    if args.cuda_graphs and (args.device != "cuda" or args.precision == "16-mixed"):
        p.error("--cuda-graphs needs --device cuda and a precision without a gradient scaler (not 16-mixed)")
    if args.cuda_graphs and args.mode == "train" and args.optim != "adamw":
        p.error("--cuda-graphs in training needs --optim adamw (the captured step ends with a fused AdamW update)")
    if args.channels % args.heads:
        p.error(f"--channels ({args.channels}) must be divisible by --heads ({args.heads})")
    return args
