"""Names made from data: no item id, however built, names a file outside the run directory.

:func:`contllm.rundir.files.data_name` turns any text read from data (an item id, a label) into
one file-name component, and :func:`contllm.rundir.files.inside` refuses any path that leaves
its directory. Hypothesis draws ids of every shape (separators, dots, NUL bytes, lone
surrogates, long non-ASCII text) and real files are written with the names they get.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contllm.errors import RunDirectoryError
from contllm.rundir.files import atomic_write_text, data_name, inside

pytestmark = pytest.mark.unit

NAMES = settings(max_examples=400, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

#: Pieces a hostile id is built from, joined in any order, beside any text at all.
PIECES = st.sampled_from(["..", ".", "/", "\\", "../", "/..", "~", "\x00", "\ud800", "\u2215", "\uff0e", " ", "\n",
                          "items", "figures", ".tmp", ".json", "outside", "\u00e9", "\u4e2d" * 90, "\U0001d400" * 70,
                          "x" * 120, "C:", "%2e%2e", "*", "-"])
IDS = st.one_of(st.text(max_size=300), st.lists(PIECES, max_size=12).map("".join),
                st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=10).map("".join))


def _component_is_safe(name: str) -> None:
    assert name and name not in (".", "..") and not name.startswith(".")
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert len(name.encode("utf-8")) <= 221  # room for an extension and a temporary file's additions


@NAMES
@given(item_id=IDS)
def test_no_id_names_a_file_outside_the_run(item_id: str, tmp_path: Path) -> None:
    name = data_name(item_id)
    _component_is_safe(name)
    run = tmp_path / "run"
    for relative in (f"figures/items/{name}.html", f"figures/items/{name}", f"items/{name}.json"):
        path = inside(run, relative)
        assert path.resolve().is_relative_to(run.resolve())
        assert path.parent == run / Path(relative).parent  # no folder made of the id either


@NAMES
@given(first=IDS, second=IDS)
def test_distinct_ids_get_distinct_names(first: str, second: str) -> None:
    if first != second:
        assert data_name(first) != data_name(second)


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(item_id=IDS)
def test_every_name_can_be_written_as_a_file(item_id: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        written = atomic_write_text(inside(run, f"figures/items/{data_name(item_id)}.html"), "x")
        assert written.read_text() == "x"
        assert [p for p in Path(folder).rglob("*") if p.is_file()] == [written]


def test_plain_ids_keep_their_own_names() -> None:
    for plain in ("count-001", "a.b", "A_b-3", "x" * 100):
        assert data_name(plain) == plain
    for other in ("../x", "a/b", ".hidden", "..", ".", "", "x" * 101, "y.tmp", "r.json", "caf\u00e9", "a b"):
        assert data_name(other) != other and "~" in data_name(other)
    assert data_name("../../../outside/pwn_run").startswith("_.._.._outside_pwn_run~")  # as record names always were


def test_the_readable_part_of_a_long_non_ascii_id_fits_a_file_name() -> None:
    name = data_name("\u4e2d" * 80)
    assert len(name.encode("utf-8")) <= 221 and name.startswith("\u4e2d")


@pytest.mark.parametrize("relative", ["../x", "/etc/passwd", "a/../../x", "", ".", "a\x00b"])
def test_inside_refuses_a_path_out_of_its_directory(relative: str, tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="is not inside"):
        inside(tmp_path / "run", relative)


def test_inside_refuses_a_path_through_a_link_out(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "figures").mkdir(parents=True)
    outside.mkdir()
    (run / "figures" / "items").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirectoryError, match="is not inside"):
        inside(run, "figures/items/a.png")
    assert inside(run, "figures/b.png") == run / "figures" / "b.png"
    os.unlink(run / "figures" / "items")
