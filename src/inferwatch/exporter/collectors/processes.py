"""The serving processes: CPU time, resident memory and threads of each (psutil).

A process is served when it matches any of: a PID file (``--processes.pid-file``), a regular expression
searched in its name (``--processes.name-pattern``, matched against comm, never the command line), or it
runs on a GPU (``--processes.gpu``). At most ``--processes.max`` get series: PID-file matches first, then
name matches, then GPU processes, each by PID; ``inferwatch_processes_matched`` counts them all. Scanning
every process for the name pattern reads one file per process (about 50 µs each on a busy 2-core VM:
50 ms on a node with 1000 processes), so it is redone every 10 s, not every poll.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from ..options import Option, parse_bool, parse_count, parse_path_list, parse_pattern
from ..proc import process_name
from ..samples import FamilySpec
from .base import HostContext
from .gpu_processes import GpuProcessesCollector
from .registry import Registration, register

log = logging.getLogger(__name__)

_LABELS = ("pid", "comm")
CPU_SECONDS = FamilySpec(
    "inferwatch_process_cpu_seconds_total",
    "counter",
    "CPU time of a serving process, by mode (user, system).",
    (*_LABELS, "mode"),
)
RESIDENT_MEMORY = FamilySpec(
    "inferwatch_process_resident_memory_bytes", "gauge", "Resident memory of a serving process.", _LABELS
)
THREADS = FamilySpec("inferwatch_process_threads", "gauge", "OS threads of a serving process.", _LABELS)
MATCHED = FamilySpec(
    "inferwatch_processes_matched",
    "gauge",
    "Serving processes matched (including those beyond --processes.max, which get no series).",
)

_RESCAN_SECONDS = 10.0


@dataclass(frozen=True)
class ProcessesSettings:
    """The processes collector's options, parsed (their defaults are the options')."""

    max_processes: int  # --processes.max
    pid_files: tuple[str, ...]  # --processes.pid-file
    name_pattern: re.Pattern[str] | None  # --processes.name-pattern
    gpu_processes: bool  # --processes.gpu


@dataclass(frozen=True)
class Selection:
    """The serving processes of one collection: how many matched, and the first ``--processes.max`` of
    them that exist, by PID."""

    matched: int
    processes: dict[int, psutil.Process]


class ServingProcesses:
    """Which processes are serving processes. Chosen once per collection, by whichever collector asks
    first (the processes collector for their series, the Kubernetes one for their pods), so that neither
    reads what the other emitted."""

    def __init__(
        self,
        pid_files: Sequence[str],
        name_pattern: re.Pattern[str] | None,
        include_gpu_processes: bool,
        max_processes: int,
    ) -> None:
        self._pid_files = tuple(pid_files)
        self._name_pattern = name_pattern
        self._include_gpu = include_gpu_processes
        self._max = max_processes
        self._name_matches: list[int] = []
        self._scanned_at = float("-inf")
        self._selection = Selection(0, {})
        self._selected_for: HostContext | None = None

    @classmethod
    def from_settings(cls, settings: ProcessesSettings) -> ServingProcesses:
        return cls(settings.pid_files, settings.name_pattern, settings.gpu_processes, settings.max_processes)

    @property
    def max_processes(self) -> int:
        """How many of them get series at most (``--processes.max``)."""
        return self._max

    def select(self, host: HostContext) -> Selection:
        """The serving processes of ``host``'s collection."""
        if self._selected_for is not host:
            gpu_pids = sorted(host.gpu_processes) if self._include_gpu else []
            found = [*self._pid_file_matches(), *self._pattern_matches(host), *gpu_pids]
            matched = list(dict.fromkeys(found))
            kept = {pid: self._process(pid) for pid in matched[: self._max]}
            processes = {pid: process for pid, process in kept.items() if process is not None}
            self._selection, self._selected_for = Selection(len(matched), processes), host
        return self._selection

    def _process(self, pid: int) -> psutil.Process | None:
        """A psutil handle for ``pid``, kept between polls unless the PID now belongs to another process."""
        process = self._selection.processes.get(pid)
        if process is not None and process.is_running():
            return process
        try:
            return psutil.Process(pid)
        except psutil.Error:
            return None

    def _pid_file_matches(self) -> list[int]:
        pids = []
        for path in self._pid_files:
            try:
                with open(path, encoding="ascii") as pid_file:
                    pids.append(int(pid_file.read().split()[0]))
            except (OSError, ValueError, IndexError):
                log.debug("PID file %s is missing or holds no PID", path)
        return pids

    def _pattern_matches(self, host: HostContext) -> list[int]:
        if self._name_pattern is None:
            return []
        now = host.clock.monotonic()
        if now - self._scanned_at >= _RESCAN_SECONDS:
            self._scanned_at = now
            self._name_matches = [
                pid for pid in psutil.pids() if self._name_pattern.search(process_name(pid))
            ]
        return self._name_matches


class ProcessesCollector:
    name = "processes"

    def __init__(self, serving: ServingProcesses) -> None:
        self._serving = serving

    def collect(self, host: HostContext) -> None:
        selection = self._serving.select(host)
        host.emit(MATCHED, selection.matched)
        for pid, process in selection.processes.items():
            try:
                with process.oneshot():
                    cpu = process.cpu_times()
                    rss = process.memory_info().rss
                    threads = process.num_threads()
            except psutil.Error:
                continue
            labels = (str(pid), process_name(pid))
            host.emit(CPU_SECONDS, cpu.user, *labels, "user")
            host.emit(CPU_SECONDS, cpu.system, *labels, "system")
            host.emit(RESIDENT_MEMORY, rss, *labels)
            host.emit(THREADS, threads, *labels)


register(
    Registration(
        "processes",
        "per-process GPU memory and serving-process CPU, memory and threads",
        gpu=lambda config, settings, shared: [GpuProcessesCollector(settings.max_processes)],
        host=lambda config, settings, shared: [ProcessesCollector(shared.serving)] if shared.serving else [],
        settings=ProcessesSettings,
        options=(
            Option(
                "--processes.max",
                "max_processes",
                parse_count,
                "16",
                "most processes with series: per GPU for GPU memory, in total for serving processes",
                metavar="N",
            ),
            Option(
                "--processes.pid-file",
                "pid_files",
                parse_path_list,
                "",
                "file holding a serving process's PID (repeatable; the variable takes commas)",
                "append",
                metavar="PATH",
            ),
            Option(
                "--processes.name-pattern",
                "name_pattern",
                parse_pattern,
                "",
                "regular expression searched in process names (comm) to find serving processes",
                metavar="REGEX",
            ),
            Option(
                "--processes.gpu",
                "gpu_processes",
                parse_bool,
                "true",
                "count processes that NVML reports on the GPUs as serving processes",
                "bool",
            ),
        ),
    )
)
