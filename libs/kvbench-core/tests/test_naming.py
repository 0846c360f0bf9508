from __future__ import annotations

from kvbench_core.naming import natural_key


def test_numbered_names_sort_as_people_count() -> None:
    names = ["swp10", "sim-10", "swp2", "sim-9", "swp1", "Ethernet1/10", "Ethernet1/2", "swp1a", "swp01", "gpu"]
    assert sorted(names, key=natural_key) == [
        "Ethernet1/2", "Ethernet1/10", "gpu", "sim-9", "sim-10", "swp01", "swp1", "swp1a", "swp2", "swp10",
    ]  # fmt: skip


def test_names_equal_as_numbers_still_sort_one_way() -> None:
    assert sorted(["n01", "n1"], key=natural_key) == sorted(["n1", "n01"], key=natural_key) == ["n01", "n1"]
