"""Sharded runs without a launcher: shard records, their merge, the process arithmetic, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.errors import ExperimentError, ModelLoadError
from contllm.experiments.sweeps import Sweep
from contllm.models import check_device_map
from contllm.rundir import distributed
from contllm.rundir.runs import ITEMS, SHARDS, RunDir

pytestmark = pytest.mark.unit

CONFIG = {"experiment": "counting", "model": "m", "items": "6"}


def sweep(item_id: str, scale: float = 1.0) -> Sweep:
    x = np.array([0.5, 1.0])
    probs = scale * np.array([[0.25, 0.75], [0.5, 0.5]])
    return Sweep(item_id, x, ["1", "2"], probs, truth="2", meta={"n": 2})


class Records(RunDir):
    """A run directory of sweep records, as the runner keeps them for counting."""

    def save_sweep(self, s: Sweep) -> None:
        self.save_record(s.item_id, s.to_dict())

    def finished(self) -> dict[str, Sweep]:  # type: ignore[override]
        return super().finished(Sweep.from_dict)


def opened(path: Path, **kwargs: bool) -> Records:
    return Records(path, CONFIG, **kwargs).open()


# ----------------------------------------------------------------- shards of a run directory


def test_a_shard_holds_its_process_records_and_finished_sees_them(tmp_path: Path) -> None:
    run = opened(tmp_path / "run")
    run.save_sweep(sweep("count-001"))
    assert run.use_shard(1) == tmp_path / "run" / SHARDS / "process-1"
    run.save_sweep(sweep("count-002"))
    assert (tmp_path / "run" / ITEMS / "count-001.json").is_file()
    assert (tmp_path / "run" / SHARDS / "process-1" / "count-002.json").is_file()
    assert not (tmp_path / "run" / ITEMS / "count-002.json").exists()
    assert sorted(run.finished()) == ["count-001", "count-002"]


def test_merge_moves_every_shard_record_once_and_is_idempotent(tmp_path: Path) -> None:
    run = opened(tmp_path / "run")
    # A first launch of three processes, then a second of two: ranks reuse folders.
    for rank, ids in ((0, ["a", "b"]), (1, ["c"]), (2, ["d", "e"]), (0, ["f"])):
        run.use_shard(rank)
        for item_id in ids:
            run.save_sweep(sweep(item_id))
    before = {p.name: p.read_bytes() for p in (tmp_path / "run" / SHARDS).glob("*/*.json")}
    assert run.merge_shards() == 6
    items = tmp_path / "run" / ITEMS
    assert {p.name: p.read_bytes() for p in items.glob("*.json")} == before
    assert not (tmp_path / "run" / SHARDS).exists()
    assert run.merge_shards() == 0
    assert sorted(run.finished()) == ["a", "b", "c", "d", "e", "f"]


def test_merge_after_a_kill_removes_partial_writes_and_keeps_whole_records(tmp_path: Path) -> None:
    run = opened(tmp_path / "run")
    folder = run.use_shard(1)
    run.save_sweep(sweep("a"))
    (folder / ".b.json.x1y2.tmp").write_text('{"item_id": "b", "x": [0.5')  # cut off mid-write
    assert run.merge_shards() == 1
    assert sorted(run.finished()) == ["a"]
    assert not (tmp_path / "run" / SHARDS).exists()


def test_a_record_in_items_wins_over_a_shard_copy_unless_it_is_unreadable(tmp_path: Path) -> None:
    run = opened(tmp_path / "run")
    run.save_sweep(sweep("a"))
    (tmp_path / "run" / ITEMS / "b.json").write_text("{not json")
    kept = (tmp_path / "run" / ITEMS / "a.json").read_bytes()
    run.use_shard(0)
    run.save_sweep(sweep("a", scale=0.5))
    run.save_sweep(sweep("b"))
    assert run.finished()["a"].probs[0, 0] == 0.25  # items/ is read first
    assert run.merge_shards() == 1
    assert (tmp_path / "run" / ITEMS / "a.json").read_bytes() == kept
    assert Sweep.from_dict(json.loads((tmp_path / "run" / ITEMS / "b.json").read_text())["record"]).item_id == "b"
    assert not (tmp_path / "run" / SHARDS).exists()


def test_merge_without_shards_changes_nothing(tmp_path: Path) -> None:
    run = opened(tmp_path / "run")
    run.save_sweep(sweep("a"))
    assert run.merge_shards() == 0
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "config.json", "items"]
    run.close()  # the lock goes with the writer
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json", "items"]


def test_a_negative_rank_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="rank >= 0"):
        opened(tmp_path / "run").use_shard(-1)


# ----------------------------------------------------------------- process arithmetic


@pytest.mark.parametrize(
    ("local_world_size", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (4, 16, 4), (3, 16, 5)]
)
def test_cpu_threads_share_the_cores(local_world_size: int, cores: int, threads: int) -> None:
    assert distributed.cpu_threads(local_world_size, cores) == threads


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "n_gpus", "group"),
    [(0, 1, 1, [0]), (0, 2, 4, [0, 1]), (1, 2, 4, [2, 3]), (1, 2, 5, [2, 3]), (2, 3, 3, [2]), (3, 4, 8, [6, 7])],
)
def test_device_groups_split_a_node(local_rank: int, local_world_size: int, n_gpus: int, group: list[int]) -> None:
    assert distributed.device_group(local_rank, local_world_size, n_gpus) == group


def test_device_groups_cover_each_gpu_at_most_once() -> None:
    groups = [distributed.device_group(r, 3, 8) for r in range(3)]
    flat = [g for group in groups for g in group]
    assert len(flat) == len(set(flat)) == 6


def test_more_processes_than_gpus_is_refused() -> None:
    with pytest.raises(ExperimentError, match="3 processes on this node but 2 GPU"):
        distributed.device_group(0, 3, 2)
    with pytest.raises(ExperimentError, match="outside a node of 2"):
        distributed.device_group(2, 2, 4)


def test_without_a_launcher_everything_is_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.launch_size() == 1
    procs = distributed.start_processes("cuda:3")  # one process keeps the device it is given
    assert not procs.launched and procs.is_main and procs.device is None and procs.threads is None
    assert procs.broadcast("x") == "x" and procs.gather(3) == [3] and procs.share([1, 2, 3]) == [1, 2, 3]
    with procs.main_first():
        procs.barrier()
    monkeypatch.setenv("WORLD_SIZE", "1")  # a launcher with one process is no launch
    assert not distributed.start_processes("auto").launched


def test_launch_size_reads_the_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.launch_size() == 4
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ExperimentError, match="WORLD_SIZE='four' is not an integer"):
        distributed.launch_size()


def test_a_numbered_device_is_refused_under_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ExperimentError, match="--device cuda:1 names one device"):
        distributed.start_processes("cuda:1")


# ----------------------------------------------------------------- device maps and the command line


@pytest.mark.parametrize("value", ["auto", "balanced", "balanced_low_0", "sequential", {"": "cpu"}])
def test_device_maps_accelerate_knows_are_accepted(value: object) -> None:
    check_device_map(value)


def test_bad_device_maps_are_named() -> None:
    with pytest.raises(ModelLoadError, match="unknown device_map 'everywhere'; use one of auto, balanced"):
        check_device_map("everywhere")
    with pytest.raises(ModelLoadError, match="max_memory limits a device map"):
        check_device_map(None, {0: "1GiB"})
    with pytest.raises(ModelLoadError, match="max_memory must map devices to sizes"):
        check_device_map("auto", "1GiB")


def one_line_error(args: list[str], needle: str, env: dict[str, str] | None = None) -> None:
    result = CliRunner().invoke(app, args, env=env)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]


def test_command_line_refuses_what_cannot_be_sharded_or_mapped(tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    one_line_error(["run", "counting", "--device-map", "everywhere", "--out", out], "unknown device_map 'everywhere'")
    one_line_error(["run", "depth", "--device-map", "auto", "--out", out], "option(s) --device-map do not apply to the depth experiment")
    one_line_error(["run", "pde", "--out", out], "pde runs in one process", env={"WORLD_SIZE": "2"})
    one_line_error(
        ["run", "counting", "--device", "cuda:1", "--out", out], "--device cuda:1 names one device", env={"WORLD_SIZE": "2"}
    )
    assert not (tmp_path / "run").exists()
