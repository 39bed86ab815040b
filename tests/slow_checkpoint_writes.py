"""``anemo-train`` whose file writes through torch.save pause halfway, so a test can kill it mid-write.

python tests/slow_checkpoint_writes.py SECONDS key=value ...
"""

from __future__ import annotations

import io
import sys
import time

import torch

from anemo_like.cli.train import main

_save = torch.save


def save_pausing_halfway(obj: object, f: object, *args: object, seconds: float, **kwargs: object) -> None:
    """torch.save into a file object: half the bytes, a flush, ``seconds`` of sleep, the rest."""
    buffer = io.BytesIO()
    _save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    time.sleep(seconds)
    f.write(data[len(data) // 2 :])


if __name__ == "__main__":
    pause = float(sys.argv.pop(1))
    torch.save = lambda obj, f, *args, **kwargs: save_pausing_halfway(obj, f, *args, seconds=pause, **kwargs)
    main()
