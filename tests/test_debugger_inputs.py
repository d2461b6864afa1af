"""Ordinary input must not crash the debugger or destroy a file (issue 23, "Bad input"):
no data files at all, an output that is one of the inputs, an absurd screen size, a
special file as the script.  Each is refused before anything is read or written."""
from __future__ import annotations

import time
from argparse import Namespace
from pathlib import Path

import pytest

from debugger.cli import InputError, load_session, main, parse_size
from test_debugger_support import LINE_MMC1, here, write_program  # noqa: F401
from test_debugger_ui import log_text, open_app, pilot_test, status_text

# No .host or .weights file: the host memory has no rows and the weights no tiles.
NO_DATA = """\
.config array_size=8, ub_rows=64, acc_rows=32
.ub    x, 4
.acc   sums, 4
    MMC.O x, sums, 4
    HLT
"""


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)])
@pilot_test
async def test_a_program_without_host_or_weights_opens_and_steps(here, size):
    (here / "nodata.tasm").write_text(NO_DATA)
    session = load_session(Namespace(program=Path("nodata.tasm"), host=None, weights=None, config=[]))
    async with open_app(here, session=session, size=size) as (app, pilot):
        app.show_bottom("log")
        for _ in range(40):                  # the log is drawn after a layout pass or two
            await pilot.pause(0.05)
            if "loaded nodata.tasm" in log_text(app):
                break
        assert "loaded nodata.tasm" in log_text(app)
        for tab in ("tab-host", "tab-tile", "tab-ub"):        # the empty memories drawn too
            app.query_one("#memories").active = tab
            await pilot.pause()
        app.execute("continue")
        await app.workers.wait_for_complete()
        await pilot.pause()
        # the MatrixMultiply has no tile: a machine fault, shown, not a crash
        assert app.session.machine.status == "fault" and "fault" in status_text(app)
        assert "internal error" not in log_text(app)


def test_screenshot_onto_an_input_is_refused_before_anything_is_written(here, capsys):
    args = write_program(here)
    (here / "s.tdb").write_text("step 3\n")
    data = ["--host", "host.npy", "--weights", "w.npy"]
    for target in ("small.tasm", "host.npy", "w.npy", "s.tdb"):
        before = (here / target).read_bytes()
        code = main(["small.tasm", *data, "--batch", "s.tdb", "--screenshot", target])
        assert code == 2
        err = capsys.readouterr().err
        assert f"it is the input {target}" in err and "Traceback" not in err
        assert (here / target).read_bytes() == before
    assert main(["small.tasm", *data, "--screenshot", str(here)]) == 2       # a directory
    assert "directory" in capsys.readouterr().err
    assert not list(here.glob("*.svg")) and not list(here.glob(".*.tmp"))


def test_size_is_range_checked_at_once(here, capsys):
    write_program(here)
    started = time.perf_counter()
    for size in ("100000x100000", "10x5", "80x0", "80 by 24", "-80x24"):
        assert main(["small.tasm", "--screenshot", "x.svg", f"--size={size}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --size") and "Traceback" not in err
    assert time.perf_counter() - started < 2
    assert not (here / "x.svg").exists()
    assert parse_size("80x24") == (80, 24) and parse_size(" 200X50 ") == (200, 50)
    with pytest.raises(InputError):
        parse_size("1001x50")


def test_batch_refuses_special_files_and_binary_scripts_at_once(here, capsys):
    write_program(here)
    started = time.perf_counter()
    assert main(["small.tasm", "--batch", "/dev/zero"]) == 2
    assert "character device, not a regular file" in capsys.readouterr().err
    assert main(["small.tasm", "--batch", str(here)]) == 2
    assert "directory" in capsys.readouterr().err
    (here / "bin.tdb").write_bytes(b"step\xff\xfe\n")
    assert main(["small.tasm", "--batch", "bin.tdb"]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main(["small.tasm", "--batch", "missing.tdb"]) == 2
    assert "missing.tdb" in capsys.readouterr().err
    assert time.perf_counter() - started < 2


def test_a_screenshot_is_written_whole(here, capsys):
    args = write_program(here)
    (here / "s.tdb").write_text(f"break {LINE_MMC1}\ncontinue\n")
    (here / "shot.svg").write_text("old")
    assert main(["small.tasm", "--host", "host.npy", "--weights", "w.npy", "--batch", "s.tdb",
                 "--screenshot", "shot.svg", "--size", "80x24"]) == 0, capsys.readouterr()
    svg = (here / "shot.svg").read_text()
    assert svg.startswith("<svg") and "breakpoint&#160;1" in svg
    assert not list(here.glob(".*.tmp"))


def test_a_program_that_is_not_text_is_one_diagnostic(here, capsys):
    # seen in the debug fuzz target: "error: h.npy:0:0: error: cannot read ..." (the
    # assembler's diagnostic prefixed once more)
    (here / "h.npy").write_bytes(b"\x93NUMPY\x01\x00\xff\xfe")
    (here / "s.txt").write_text("step\n")
    assert main(["h.npy", "--batch", "s.txt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("h.npy:0:0: error: cannot read") and err.count("error") == 1, err
