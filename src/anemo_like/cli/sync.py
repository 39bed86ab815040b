"""``anemo-sync RUN_DIR [--tracking-uri URI]``: send a run's tracking record to an MLflow server.

For runs trained with ``diagnostics.tracking.backend=mlflow`` whose server was down or unreachable (a compute node
without network): the events recorded in ``RUN_DIR/tracking`` go to the same MLflow run the background sender
created, or to a new one the first time. Syncing again sends only what is new, so a second call changes nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from anemo_like.cli.one_line import fail
from anemo_like.config.system_schema import check_tracking_uri
from anemo_like.tracking.mlflow_target import MlflowTarget, TrackingUnavailable
from anemo_like.tracking.record import RunRecord
from anemo_like.tracking.sync import sync

PROGRAM = "anemo-sync"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[1])
    parser.add_argument("run_dir", type=Path, help="the run folder (holds tracking/run.json)")
    parser.add_argument(
        "--tracking-uri", type=_tracking_uri, help="MLflow tracking URI; default: the one the run was trained with"
    )
    return parser.parse_args(argv)


def _tracking_uri(uri: str) -> str:
    try:
        return check_tracking_uri(uri)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"'{uri}': {error}") from None


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    record = RunRecord(args.run_dir)
    if not record.exists():
        fail(
            PROGRAM,
            f"{args.run_dir} holds no tracking record ({record.identity_path} is missing): only runs trained with "
            "diagnostics.tracking.backend=mlflow can be synced",
            2,
        )
    uri = None
    try:
        uri = args.tracking_uri or record.identity().tracking_uri
        result = sync(record, MlflowTarget(uri))
    except (ValueError, TrackingUnavailable) as error:
        fail(PROGRAM, str(error), 2)
    except Exception as error:  # the server: unreachable, refusing, or failing mid-way
        first_line = str(error).splitlines()[0][:300] if str(error) else ""
        fail(
            PROGRAM,
            f"{uri} did not accept the run ({type(error).__name__}: {first_line}); nothing is lost: what was sent "
            f"is recorded in {record.sync_path}, run {PROGRAM} again when the server answers",
            1,
        )
    news = f"{result.sent} event(s) sent" if result.sent else "already up to date"
    print(f"{PROGRAM}: {args.run_dir} -> MLflow run {result.run_id} at {result.uri}: {news} ({result.total} in all)")


if __name__ == "__main__":
    main()
