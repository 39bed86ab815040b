"""``anemo-import CHECKPOINT OUTPUT``: an anemoi checkpoint (``inference-*.ckpt`` or Lightning's ``last.ckpt``
written by anemoi-training 0.17 / anemoi-models 0.19) into an anemo_like ``inference.pt``.

The file is read without running any of its pickled code. The result takes anemoi's graph, weights, variables,
normalisation, multistep input and output, output floors and imputer as they are, so anemo-infer forecasts what
anemoi-models forecasts, and training.init_from fine-tunes it here. An option we do not reproduce is refused by name
(exit 2) and nothing is written. See docs/anemoi.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from anemo_like.cli.one_line import fail

PROGRAM = "anemo-import"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="the anemoi checkpoint: inference-*.ckpt or last.ckpt")
    parser.add_argument("output", type=Path, help="the inference.pt to write, or a folder to write it into")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    # its steps on stdout (a big checkpoint takes a while); stderr holds a refusal's one line alone
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    logging.getLogger("anemo_like").setLevel(logging.INFO)
    from anemo_like.anemoi_import.archive import ImportRefused  # torch: only once the arguments parse
    from anemo_like.anemoi_import.convert import import_checkpoint

    try:
        report = import_checkpoint(args.checkpoint, args.output)
    except ImportRefused as refused:
        fail(PROGRAM, str(refused), 2)
    except OSError as error:  # the output cannot be written (no space, no permission)
        fail(PROGRAM, f"{args.output}: cannot write the import ({error.strerror or error}); nothing was kept", 1)
    spec = report.spec
    print(
        f"{PROGRAM}: {args.checkpoint} -> {report.output}: anemoi-models {spec.models_version} graph transformer, "
        f"{report.parameters / 1e6:.2f}M parameters, {report.grid_points} grid points, {spec.multistep_input} input "
        f"and {spec.multistep_output} output step(s) of {spec.timestep}; inputs {', '.join(report.inputs)}; outputs "
        f"{', '.join(report.outputs)}"
    )


if __name__ == "__main__":
    main()
