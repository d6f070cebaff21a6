"""Runs sharded over processes, GPUs and nodes, launched by accelerate.

``accelerate launch --multi_gpu --num_processes N -m contllm run counting ...`` starts N
copies of the command (torchrun underneath sets RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE). :func:`start_processes` reads that environment; without a launcher
(or with one process) it returns a single :class:`Processes` that never touches
accelerate, so a plain ``contllm run`` behaves as it always has.

Launched, every process loads the model on its own device (``cuda:LOCAL_RANK``, or the CPU
with ``cores / processes on this node`` threads), takes its share of the unfinished items
(``split_between_processes`` over a list the main process broadcasts) and writes each
finished item into its own shard of the run directory (``shards/process-<rank>/``). When
every shard is done the main process merges them into ``items/`` and writes the results,
summary, manifest and figures exactly as a single-process run does.

The processes exchange only item lists and short reports, as JSON (never pickles), so
they talk over gloo (TCP) whatever the device: the GPUs are left to the models, a node needs no NCCL set-up, and a
process that spreads its model over several GPUs (``device_map="auto"``) needs no device
of its own for the collectives.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contllm.errors import ExperimentError, ModelLoadError
from contllm.numerals import as_integer

__all__ = [
    "DEVICE_CHOICES",
    "Processes",
    "cpu_threads",
    "device_group",
    "DEVICE_MAPS",
    "check_device_map",
    "device_map_memory",
    "launch_size",
    "check_launch_device",
    "start_processes",
]

T = TypeVar("T")

#: Values of --device that make sense when each process picks its own device.
DEVICE_CHOICES = ("auto", "cpu", "cuda")

# A barrier waits for the slowest shard; on a long sweep that can be hours, and a process
# that dies is noticed by the launcher (which stops the others) rather than by a timeout.
COLLECTIVE_TIMEOUT = _dt.timedelta(hours=48)

_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def _int_from_env(names: Sequence[str], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            number = as_integer(value)
            if number is None:
                raise ExperimentError(f"environment variable {name}={value[:40]!r} is not an integer")
            return number
    return default


def launch_size() -> int:
    """How many processes the launcher started (1 without a launcher)."""
    return _int_from_env(_WORLD_SIZE_VARS, 1)


def cpu_threads(local_world_size: int, cores: int | None = None) -> int:
    """Torch threads for one of ``local_world_size`` processes sharing ``cores`` CPU cores (>= 1).

    cores: None counts the cores this process may run on (its CPU affinity).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


def device_group(local_rank: int, local_world_size: int, n_gpus: int) -> list[int]:
    """The GPU indices one process spreads its model over when every process of a node gets a group.

    The node's ``n_gpus`` GPUs are cut into ``local_world_size`` equal contiguous groups
    (left-over GPUs stay idle); process ``local_rank`` takes group ``local_rank``.
    """
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ExperimentError(f"local rank {local_rank} is outside a node of {local_world_size} processes")
    per_process = n_gpus // local_world_size
    if per_process < 1:
        raise ExperimentError(
            f"{local_world_size} processes on this node but {n_gpus} GPU(s): each process needs at least one; "
            f"launch at most {n_gpus} processes per node"
        )
    return list(range(local_rank * per_process, (local_rank + 1) * per_process))


@dataclass
class Processes:
    """Where this process stands in a launch, and the collectives of its group.

    rank, world_size: this process's index and the number of processes, over all nodes.
    local_rank, local_world_size: the same on this node. device: where this process puts
    its model ("cpu", "cuda:N"; None leaves the choice to the caller). threads: torch
    threads set for this process (None: untouched). The main process is rank 0.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: str | None = None
    threads: int | None = None
    backend: str | None = None
    _state: Any = field(default=None, repr=False)

    @property
    def launched(self) -> bool:
        """Whether this process is one of several started by a launcher."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Wait until every process of the launch reaches this point."""
        if self._state is not None:
            self._state.wait_for_everyone()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Run the body in the main process first, then in the others (a cache filled once)."""
        if self._state is None:
            yield
        else:
            with self._state.main_process_first():
                yield

    def broadcast(self, value: T) -> T:
        """The main process's ``value`` (JSON data: numbers, strings, lists, dicts), in every process."""
        if self._state is None:
            return value
        import torch.distributed as dist

        payload = _to_bytes(value) if self.is_main else b""
        return _from_bytes(_broadcast_bytes(dist, payload))

    def gather(self, value: T) -> list[T]:
        """Every process's ``value`` (JSON data), in rank order, returned in every process."""
        if self._state is None:
            return [value]
        import torch
        import torch.distributed as dist

        data = _to_bytes(value)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.long))
        longest = max(int(n) for n in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        boxes = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(boxes, mine)
        return [_from_bytes(bytes(box[: int(n)].tolist())) for box, n in zip(boxes, sizes)]

    def share(self, items: Sequence[T]) -> list[T]:
        """This process's contiguous share of ``items`` (the same list in every process).

        Shares differ in length by at most one; together they hold every item exactly once.
        """
        if self._state is None:
            return list(items)
        with self._state.split_between_processes(list(items)) as mine:
            return list(mine)

    def describe(self) -> dict[str, Any]:
        """What the manifest records about the processes of this run."""
        return {
            "launcher": "accelerate" if self.launched else None,
            "world_size": self.world_size,
            "backend": self.backend,
            "threads_per_process": self.threads,
        }

    def report(self, items: int) -> dict[str, Any]:
        """This process's line in the manifest: where it ran and how many items it computed."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": platform.node(),
            "device": self.device,
            "threads": self.threads,
            "items": items,
        }


def _to_bytes(value: Any) -> bytes:
    # Control messages are plain JSON, never pickles: a peer on the rendezvous network can
    # send data, not code.
    return json.dumps(value).encode("utf-8")


def _from_bytes(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


def _broadcast_bytes(dist: Any, payload: bytes) -> bytes:
    """``payload`` of rank 0, in every process: its length first, then the bytes (gloo tensors)."""
    import torch

    size = torch.tensor([len(payload)], dtype=torch.long)
    dist.broadcast(size, src=0)
    buffer = torch.zeros(int(size), dtype=torch.uint8)
    if payload:
        buffer[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    dist.broadcast(buffer, src=0)
    return bytes(buffer.tolist())


_started: Processes | None = None


def check_launch_device(device: str | None) -> None:
    """Under a launch (more than one process), refuse a numbered device such as "cuda:1":
    every process would pick the same one. ExperimentError naming the choices; nothing otherwise."""
    if launch_size() > 1 and device is not None and device not in DEVICE_CHOICES:
        raise ExperimentError(
            f"--device {device} names one device, but under a launch every process takes its own "
            f"(cuda:LOCAL_RANK, or the CPU); use --device {', '.join(DEVICE_CHOICES)}"
        )


def start_processes(device: str | None = "auto", *, device_map: str | None = None) -> Processes:
    """This process's place in a launch, setting up the process group on first call.

    device: the --device of the run. Without a launcher (or with one process) this returns
    ``Processes()`` and changes nothing. Under a launch, "auto" and "cuda" give each
    process ``cuda:LOCAL_RANK`` when CUDA is available, and "cpu" (or no CUDA) gives the
    CPU with ``cores // LOCAL_WORLD_SIZE`` torch threads; a numbered device ("cuda:1")
    is refused, since every process would pick the same one. device_map: with a device
    map each process spreads its model over its own group of GPUs (see
    :func:`device_group`), and ``device`` lists that group. Later calls return the first
    answer.
    """
    global _started
    if _started is not None:
        return _started
    if launch_size() <= 1:
        return Processes()
    check_launch_device(device)
    if device is None:
        device = "auto"
    import torch
    from accelerate import PartialState

    use_cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        raise ExperimentError("--device cuda requested but CUDA is not available; use --device cpu or auto")
    # gloo carries the control messages whatever the device (see the module's docstring).
    state = PartialState(cpu=True, timeout=COLLECTIVE_TIMEOUT)
    local_world_size = _int_from_env(_LOCAL_SIZE_VARS, state.num_processes)
    processes = Processes(
        rank=state.process_index,
        world_size=state.num_processes,
        local_rank=state.local_process_index,
        local_world_size=local_world_size,
        backend=state.backend,
        _state=state,
    )
    if use_cuda:
        n_gpus = torch.cuda.device_count()
        group = device_group(processes.local_rank, local_world_size, n_gpus)
        if device_map is None:
            processes.device = f"cuda:{processes.local_rank}"
            torch.cuda.set_device(processes.local_rank)
        else:
            processes.device = ",".join(f"cuda:{i}" for i in group)
            torch.cuda.set_device(group[0])
    else:
        processes.device = "cpu"
        processes.threads = cpu_threads(local_world_size)
        torch.set_num_threads(processes.threads)
    _started = processes
    return processes


#: Placement strategies accelerate accepts for ``device_map`` (a dict of module -> device also works).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map: Any, max_memory: Any = None) -> None:
    """ModelLoadError unless ``device_map`` is None, a dict or one of :data:`DEVICE_MAPS`.

    max_memory (device -> bytes or "20GiB") only means something with a device map.
    """
    if device_map is None:
        if max_memory is not None:
            raise ModelLoadError("max_memory limits a device map; give device_map='auto' with it")
        return
    if isinstance(device_map, Mapping):
        return
    if not isinstance(device_map, str) or device_map not in DEVICE_MAPS:
        raise ModelLoadError(
            f"unknown device_map {device_map!r}; use one of {', '.join(DEVICE_MAPS)} or a dict of module -> device"
        )
    if max_memory is not None and not isinstance(max_memory, Mapping):
        raise ModelLoadError(
            f"max_memory must map devices to sizes (e.g. {{0: '20GiB', 1: '20GiB'}}), got {max_memory!r}"
        )


def device_map_memory(processes: Processes) -> dict[int, int] | None:
    """The ``max_memory`` that keeps a launched process's device map on its own GPU group.

    None without a launch or without CUDA: the device map then uses every device it sees.
    """
    import torch

    if not processes.launched or not torch.cuda.is_available():
        return None
    group = device_group(processes.local_rank, processes.local_world_size, torch.cuda.device_count())
    # A tenth is left for activations, as accelerate does when it picks the sizes itself.
    return {i: int(torch.cuda.mem_get_info(i)[0] * 0.9) for i in group}
