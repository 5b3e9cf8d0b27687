"""Ctrl-C and SIGTERM on real processes: one line on stderr, exit 130 or 143, no traceback, and
no partial output, at start-up and in the middle of a ``--jobs 2`` batch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from obsdelta_cli import verify

from .conftest import SAMPLE, Cli, finish, in_the_foreground, load_sample

ENTRY_POINTS = {
    "script": [str(Path(sys.executable).with_name("obsdelta"))],
    "module": [sys.executable, "-m", "obsdelta_cli"],
}


def _start(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
        preexec_fn=in_the_foreground,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # stacks on SIGABRT, see finish
    )


def _wait_for_handlers(proc: subprocess.Popen[str]) -> None:
    """Until obsdelta's signal handlers are in place (SIGTERM caught, which Python alone never
    does): a fixed wait lands in Python's own start-up on a loaded machine."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{proc.pid}/status").read_text()
            caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
            if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
                return
        time.sleep(0.002)
    pytest.fail(f"no handlers installed: {proc.communicate()}")


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_interrupt_at_start_up(entry: str, tmp_path: Path) -> None:
    argv = [*ENTRY_POINTS[entry], "compress", str(SAMPLE / "hopper_ted"), "-o", "out"]
    # While the libraries load (torch alone takes over a second here): our line. (A signal
    # sent at once lands in Python's own start-up, before obsdelta's code: Python decides
    # what it prints there, see the README.)
    for signum, expected, word in (
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "terminated"),
    ):
        proc = _start(argv, tmp_path)
        _wait_for_handlers(proc)
        proc.send_signal(signum)
        code, out, err = finish(proc)
        assert code == expected, err
        assert "Traceback" not in err and err.count("\n") == 1 and word in err, err
        assert out == ""
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_handlers_are_installed_still_ends_in_one_line(
    tmp_path: Path, signum: int
) -> None:
    # The kernel shows SIGTERM caught as soon as its handler is set, while Python is still in
    # ``signal.signal``: a signal sent then ran the first handler before ``main`` was ready.
    script = (
        "import signal, sys\n"
        "from obsdelta_cli import __main__\n"
        "real = signal.signal\n"
        "def signal_then_interrupt(signum, handler):\n"
        "    previous = real(signum, handler)\n"
        "    if signum == signal.SIGTERM:\n"
        f"        signal.raise_signal({int(signum)})\n"
        "    return previous\n"
        "signal.signal = signal_then_interrupt\n"
        "sys.argv = ['obsdelta', '--help']\n"
        "__main__.main()\n"
    )
    proc = _start([sys.executable, "-c", script], tmp_path)
    code, out, err = finish(proc)
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert code == 128 + signum, err
    assert err == f"obsdelta: {word}; no partial output was left\n" and out == ""


def test_interrupt_in_generated_code_still_exits_130_under_python_m(tmp_path: Path) -> None:
    # A KeyboardInterrupt that leaves code run by exec() of a string (dataclasses and torch make
    # functions that way at import) sets a CPython flag that turns ``python -m``'s exit 130 into
    # death by SIGINT; the signal that does it can land at any moment of start-up.
    main = tmp_path / "interrupted_in_exec" / "__main__.py"
    main.parent.mkdir()
    main.write_text(
        "from obsdelta_cli import interrupts\n"
        "from obsdelta_cli.__main__ import _stopped\n"
        "interrupts.install()\n"
        "try:\n"
        "    exec('import signal; signal.raise_signal(signal.SIGINT)')\n"
        "except KeyboardInterrupt as exc:\n"
        "    _stopped(exc)\n"
    )
    proc = _start([sys.executable, "-m", "interrupted_in_exec"], tmp_path)
    code, out, err = finish(proc)
    assert code == 130, err
    assert err == "obsdelta: interrupted; no partial output was left\n" and out == ""


def test_a_signal_while_importing_torch_waits_for_the_import() -> None:
    # Raised inside torch's start-up, the exception crosses C++ code that aborts the process.
    code = (
        "import signal, sys\n"
        "from obsdelta_cli import interrupts\n"
        "interrupts.install()\n"
        "try:\n"
        "    with interrupts.deferred():\n"
        "        signal.raise_signal(signal.SIGTERM)\n"
        "        print('still importing')\n"
        "except KeyboardInterrupt as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == "still importing\nTerminated\n"


def test_a_signal_inside_a_finalizer_is_silent_and_still_stops_the_pass(tmp_path: Path) -> None:
    # A SIGTERM that lands while a ``__del__`` runs (the pool stopping a worker that was closing a
    # file) cannot propagate from there; the interpreter used to print it with a traceback. It is
    # remembered instead, and the next chunk of the pass raises it.
    code = (
        "import gc, os, signal, sys\n"
        "from obsdelta_cli import interrupts\n"
        "from obsdelta_cli.stream import ahead\n"
        "interrupts.install()\n"
        "class Closing:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        sum(range(1000))  # the handler runs here, inside the finalizer\n"
        "read = []\n"
        "try:\n"
        "    for i, _ in ahead(range(5), lambda i: i):\n"
        "        read.append(i)\n"
        "        if i == 1:\n"
        "            Closing()\n"
        "            gc.collect()\n"
        "except KeyboardInterrupt as exc:\n"
        "    print(type(exc).__name__, read)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert proc.stderr == ""
    assert proc.stdout == "Terminated [0, 1]\n"


@pytest.mark.parametrize("worker", [True, False], ids=["--jobs-worker", "command"])
def test_a_signal_just_after_the_lock_is_taken_leaves_no_lock_file(
    tmp_path: Path, worker: bool
) -> None:
    # Stopping a batch just as a worker started its next input (when the outputs finished so
    # far appear, which is when people press Ctrl-C) could land inside ``__enter__``, the lock
    # taken but its ``with`` not yet entered, so no ``__exit__`` ever let go of it; the worker
    # then ended with ``os._exit`` and the lock file stayed.
    out = tmp_path / "out"
    run = (
        "batch._pool_job(batch.Job(Path(sys.argv[1]), Path(sys.argv[2]), CompressOptions()))"
        if worker
        else "sys.argv[1:] = ['compress', sys.argv[1], '-o', sys.argv[2]]; __main__.main()"
    )
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from obsdelta_cli import __main__, atomic, batch, interrupts\n"
        "from obsdelta_cli.options import CompressOptions\n"
        "interrupts.install()\n"
        "real = atomic.output_lock\n"
        "class SignalledOnEntry:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        self.lock = real(*args, **kwargs)\n"
        "    def __enter__(self):\n"
        "        self.lock.__enter__()\n"
        "        raise interrupts.Terminated\n"
        "    def __exit__(self, *exc):\n"
        "        raise AssertionError('never entered')\n"
        "atomic.output_lock = SignalledOnEntry\n"
        f"{run}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(SAMPLE / "hopper_ted"), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Six TED memmap rollouts of ~50 MB each: long enough to interrupt a batch midway (the
    last four take about 0.5 s once the first output appears; at 25 MB each, 0.24 s)."""
    root = tmp_path_factory.mktemp("batch")
    hopper = load_sample("hopper_ted")
    big = torch.cat([hopper] * 120)
    assert isinstance(big, TensorDict)
    paths = []
    for i in range(6):
        path = root / f"run{i}"
        big.memmap(path)
        paths.append(path)
    return paths


def _batch(inputs: list[Path], out: Path, cwd: Path) -> subprocess.Popen[str]:
    argv = [*ENTRY_POINTS["script"], "compress", *map(str, inputs), "-o", str(out), "-j", "2"]
    return _start(argv, cwd)


def _wait_for_writing(out: Path, proc: subprocess.Popen[str]) -> list[Path]:
    """The temporaries of outputs being written in ``out``, once there are any."""
    deadline = time.monotonic() + 90
    writing: list[Path] = []
    while not writing and proc.poll() is None and time.monotonic() < deadline:
        writing = list(out.glob(".*.obsdelta-tmp-*")) if out.is_dir() else []
        time.sleep(0.005)
    assert writing, "no worker started writing"
    return writing


def _wait_for_output(out: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_dir() and any(not p.name.startswith(".") for p in out.iterdir()):
            return
        time.sleep(0.02)
    pytest.fail("no output appeared")


@pytest.mark.parametrize(
    ("signum", "group", "expected"),
    [(signal.SIGINT, True, 130), (signal.SIGINT, False, 130), (signal.SIGTERM, False, 143)],
    ids=["ctrl-c", "sigint", "sigterm"],
)
def test_interrupt_mid_batch(
    inputs: list[Path], tmp_path: Path, signum: int, group: bool, expected: int
) -> None:
    out = tmp_path / "small"
    proc = _batch(inputs, out, tmp_path)
    _wait_for_output(out, proc)
    if group:
        os.killpg(proc.pid, signum)  # what Ctrl-C in a terminal does
    else:
        proc.send_signal(signum)
    code, _, err = finish(proc)
    assert code == expected, err
    assert "Traceback" not in err, err
    assert "of 6 inputs" in err and "no partial output was left" in err, err
    left = sorted(out.iterdir())
    assert left, "a finished output was removed"
    assert len(left) < len(inputs), "the batch ended before the signal: make the inputs larger"
    assert all(not p.name.startswith(".") for p in left), left  # no temporaries
    for path in left:
        assert verify(path).ok


def test_a_killed_worker_fails_its_inputs_in_one_line_each_and_leaves_nothing(
    inputs: list[Path], tmp_path: Path
) -> None:
    # As the out-of-memory killer would: SIGKILL, which no handler sees, mid-input.
    out = tmp_path / "small"
    proc = _batch(inputs, out, tmp_path)
    writing = _wait_for_writing(out, proc)
    os.kill(int(writing[0].name.rsplit("-", 1)[1]), signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 1, err
    assert "Traceback" not in err, err
    lost = [line for line in err.splitlines() if "a worker process was killed" in line]
    done = sorted(out.iterdir()) if out.exists() else []  # an emptied folder is removed
    assert lost and len(lost) + len(done) == len(inputs), err
    assert all(line.startswith("obsdelta: error: ") for line in lost)
    assert all(not p.name.startswith(".") for p in done), done  # no temporary, no lock file
    for path in done:
        assert verify(path).ok


def test_interrupt_before_any_output_leaves_no_folder(inputs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "small"
    proc = _batch(inputs, out, tmp_path)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out.is_dir()  # the folder is made up front, so that workers can write into it
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130 and "Traceback" not in err, err
    assert not out.exists(), (sorted(p.name for p in out.iterdir()), err)


def test_a_signal_just_as_the_folder_is_made_leaves_no_folder(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moment the test above aims at, made certain: Ctrl-C lands once the output folder
    exists, before the run has noted that it made it."""
    from obsdelta_cli import interrupts

    monkeypatch.setattr(interrupts, "received", [])
    real = Path.mkdir

    def mkdir_then_signal(self: Path, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        interrupts.on_signal(signal.SIGINT, None)

    monkeypatch.setattr(Path, "mkdir", mkdir_then_signal)
    out = tmp_path / "small"
    result = cli("compress", SAMPLE / "hopper_ted", SAMPLE / "hopper_ted.pt", "-o", out, code=130)
    assert "Traceback" not in result.stderr, result.stderr
    assert not out.exists()


def test_a_second_signal_does_not_cut_the_clean_up_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first signal raises; one arriving while its exception unwinds (Ctrl-C pressed
    twice, or the pool stopping every worker when one exits) is only remembered, so the
    clean-up that removes the temporary output runs to the end."""
    from obsdelta_cli import batch, interrupts

    monkeypatch.setattr(interrupts, "received", [])
    with pytest.raises(KeyboardInterrupt):
        interrupts.on_signal(signal.SIGINT, None)
    interrupts.on_signal(signal.SIGINT, None)  # during the clean-up: no exception
    assert interrupts.received == [signal.SIGINT, signal.SIGINT]

    monkeypatch.setattr(interrupts, "received", [])
    monkeypatch.setattr(batch, "_BUSY", True)
    with pytest.raises(interrupts.Terminated):
        batch._worker_sigterm(signal.SIGTERM, None)
    batch._worker_sigterm(signal.SIGTERM, None)
    assert interrupts.received == [signal.SIGTERM, signal.SIGTERM]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                # The fields after the command name, which may hold spaces and parentheses.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may not reap it at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_workers_die_with_their_parent(inputs: list[Path], tmp_path: Path) -> None:
    """``kill -9`` of a ``--jobs 2`` batch: its workers end within 2 s, removing what they were
    writing, and no output appears afterwards. Before, they lived on (their parent PID 1) and
    wrote outputs for a minute."""
    out = tmp_path / "small"
    proc = _batch(inputs, out, tmp_path)
    _wait_for_writing(out, proc)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)  # not communicate(): workers left running hold its pipes open
    killed = time.monotonic()
    try:
        while any(map(_running, workers)) and time.monotonic() - killed < 2:
            time.sleep(0.01)
        assert not any(map(_running, workers)), [w for w in workers if _running(w)]
        left = sorted(p.name for p in out.iterdir())
        time.sleep(3)
        assert sorted(p.name for p in out.iterdir()) == left
    finally:
        for pid in filter(_running, workers):
            os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert len(left) < len(inputs), "the batch ended before the kill: make the inputs larger"
    assert not [name for name in left if ".obsdelta-tmp-" in name], left  # removed, not swapped in
    for name in left:
        if not name.startswith("."):
            assert verify(out / name).ok
