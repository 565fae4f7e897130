"""Stop on signals and die with parent: the one implementation every command and worker uses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from throughline.runtime import StopOnSignals


def test_the_first_signal_asks_for_a_stop_and_a_second_interrupts() -> None:
    stop = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignals(lambda _: stop.set()) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises in this thread long before
    assert signals.signals == [signal.SIGTERM, signal.SIGINT] and signals.exit_code == 0
    assert signal.getsignal(signal.SIGTERM) is before  # restored on exit


def test_a_second_handler_replaces_the_interrupt_and_sigint_first_exits_130() -> None:
    seen: list[str] = []
    signals = StopOnSignals(lambda _: seen.append("graceful"), lambda _: seen.append("immediate"))
    signals.handle(signal.SIGINT, None)
    signals.handle(signal.SIGTERM, None)
    signals.handle(signal.SIGTERM, None)
    assert seen == ["graceful", "immediate", "immediate"] and signals.exit_code == 130


def test_handlers_are_installed_only_from_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    installed: list[object] = []

    def enter() -> None:
        with StopOnSignals(lambda _: None):
            installed.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(5)
    assert installed == [before]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["in process", "preexec"])
def test_a_child_dies_with_its_parent(how: str) -> None:
    # The parent starts a child that arms die-with-parent and sleeps, prints its pid and exits at once.
    child = (
        "import time; from throughline.runtime import die_with_parent; die_with_parent(); time.sleep(60)"
        if how == "in process"
        else "import time; time.sleep(60)"
    )
    parent = (
        "import subprocess, sys, signal; from throughline.runtime import die_with_parent_preexec\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], "
        f"preexec_fn={'None' if how == 'in process' else 'die_with_parent_preexec(signal.SIGKILL)'})\n"
        "import time; time.sleep(1.0); print(p.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=30, check=True)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie waits for init to reap it: it is dead
    except FileNotFoundError:
        return False
