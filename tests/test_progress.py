"""The progress display: a tqdm bar on a real pseudo-terminal, plain log lines otherwise, nothing when disabled."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap

import pytest

from anemo_like.progress import Progress

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from anemo_like.progress import Progress

    with Progress(total=20, desc="demo", enabled=sys.argv[1] == "on") as progress:
        for step in range(20):
            time.sleep(0.01)
            progress.update(loss=0.25, rollout=2)
    """
)


def _run_on_a_terminal(enabled: bool) -> str:
    """What a child running :data:`SCRIPT` with its stderr on a 120-column pseudo-terminal writes there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "on" if enabled else "off"], stdin=subprocess.DEVNULL, stderr=slave
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert child.wait(timeout=30) == 0
    return b"".join(chunks).decode()


def test_on_a_terminal_a_bar_shows_steps_rate_and_fields() -> None:
    screen = _run_on_a_terminal(enabled=True)
    last = screen.replace("\r\n", "\n").split("\r")[-1]  # the bar as last redrawn
    assert "\r" in screen, "the bar is redrawn in place"
    assert "demo" in last and "20/20" in last and "it/s" in last
    assert "loss=0.25" in last and "rollout=2" in last
    assert "<00:00" in last  # elapsed<remaining: the ETA


def test_on_a_terminal_disabled_prints_nothing() -> None:
    assert _run_on_a_terminal(enabled=False) == ""


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> io.StringIO:
    """stderr a plain file; this module's log records captured at INFO."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    caplog.set_level(logging.INFO, logger="anemo_like.progress")
    return stderr


def test_off_a_terminal_plain_lines_every_log_every_and_the_last(
    not_a_terminal: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    with Progress(total=12, desc="training", log_every=5) as progress:
        for step in range(1, 13):
            progress.update_to(step, loss=1.0 / step)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" it ")[0] for line in lines] == ["training: 5/12", "training: 10/12", "training: 12/12"]
    assert "it/s" in lines[-1] and "ETA" in lines[-1] and "loss 0.08333" in lines[-1]
    assert not any("\r" in line for line in lines)
    assert not_a_terminal.getvalue() == ""  # nothing written around logging
    assert progress.rate() > 0


def test_off_a_terminal_close_logs_where_it_stopped(
    caplog: pytest.LogCaptureFixture, not_a_terminal: io.StringIO
) -> None:
    progress = Progress(total=100, initial=40, log_every=50, unit="step")
    progress.update(7, loss=0.5)
    assert caplog.records == []
    progress.close()
    progress.close()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["47/100 step"]


def test_off_a_terminal_lines_by_time(caplog: pytest.LogCaptureFixture, not_a_terminal: io.StringIO) -> None:
    with Progress(total=3, log_seconds=0.0) as progress:
        progress.update()
        progress.update()
    assert [r.getMessage().split(" it ")[0] for r in caplog.records] == ["1/3", "2/3"]


def test_disabled_prints_nothing_and_still_counts(
    caplog: pytest.LogCaptureFixture, not_a_terminal: io.StringIO
) -> None:
    with Progress(total=5, enabled=False) as progress:
        progress.update_to(5, loss=1.0)
    assert caplog.records == [] and not_a_terminal.getvalue() == ""
    assert progress.position == 5 and progress.rate() > 0
