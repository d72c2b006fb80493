"""bench/cpu_split.py: a host's CPUs split by physical core, siblings kept together."""

from __future__ import annotations

from pathlib import Path

from bench.cpu_split import physical_cores, ranges, split


def _sysfs(root: Path, cpus: dict[int, tuple[int, int]]) -> Path:
    for cpu, (package, core) in cpus.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (root / "cpufreq").mkdir()  # not a CPU
    return root


def test_siblings_i_and_i_plus_n_stay_together(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, {cpu: (0, cpu % 4) for cpu in range(8)})  # 4 cores, 2 threads each
    assert physical_cores(root) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert split(physical_cores(root)) == ("0-1,4-5", "2-3,6-7")


def test_adjacent_siblings_and_two_packages(tmp_path: Path) -> None:
    # Core ids repeat across packages: (package, core) names a core.
    cpus = {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1), 4: (1, 0), 5: (1, 0), 6: (1, 1), 7: (1, 1)}
    assert split(physical_cores(_sysfs(tmp_path, cpus))) == ("0-3", "4-7")


def test_no_hyperthreads_and_ranges() -> None:
    assert split([[c] for c in range(5)]) == ("0-1", "2-4")
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
