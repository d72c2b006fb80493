"""Split this host's CPUs in two by physical core, for a server and its load generator.

`taskset -c 0-15` on a 32-CPU host is half the host only when CPUs 0-15 are 16 physical cores
and their hyperthread siblings are not the load generator's; on many hosts CPU i and i + 16 are
siblings, and a busy load generator on 16-31 halves the speed of every server thread. This
prints two taskset lists: the first half of the physical cores with all their threads, then the
rest (`python -m bench.cpu_split` -> "0-7,16-23 8-15,24-31"). `--core`: the first physical
core with its threads, then every other CPU (`0,16 1-15,17-31`): an engine core of its own.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def physical_cores(root: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """The CPUs of each physical core, cores in order of their first CPU."""
    cores: dict[tuple[str, str], list[int]] = defaultdict(list)
    for topo in root.glob("cpu[0-9]*/topology"):
        cpu = int(topo.parent.name[3:])
        key = ((topo / "physical_package_id").read_text(), (topo / "core_id").read_text())
        cores[key].append(cpu)
    return sorted((sorted(c) for c in cores.values()), key=lambda c: c[0])


def ranges(cpus: list[int]) -> str:
    """A taskset list: 0,1,2,5 -> 0-2,5."""
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and int(out[-1].split("-")[-1]) == cpu - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def split(cores: list[list[int]]) -> tuple[str, str]:
    half = len(cores) // 2
    first = [cpu for core in cores[:half] for cpu in core]
    rest = [cpu for core in cores[half:] for cpu in core]
    return ranges(first), ranges(rest)


def own_core(cores: list[list[int]]) -> tuple[str, str]:
    return ranges(cores[0]), ranges([cpu for core in cores[1:] for cpu in core])


if __name__ == "__main__":
    import sys

    cores = physical_cores()
    print(*(own_core(cores) if "--core" in sys.argv else split(cores)))
