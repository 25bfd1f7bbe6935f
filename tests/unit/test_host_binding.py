"""Sharing a host's cores among its ranks: blocks node by node, equal to one core, never overlapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dos.strategies.host_binding import numa_nodes, parse_cpulist, rank_cores


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8-9,12\n") == [0, 1, 2, 3, 8, 9, 12]
    assert parse_cpulist("") == []


def test_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    for node, cpulist in ((1, "4-7"), (0, "0-3"), (10, "8")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpulist)
    (tmp_path / "possible").write_text("0-10")  # not a node folder
    assert numa_nodes(tmp_path) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert len(numa_nodes(tmp_path / "absent")) == 1  # no NUMA information: one node of every core


@pytest.mark.parametrize(
    ("allowed", "nodes", "ranks", "expected"),
    [
        (range(16), [range(8), range(8, 16)], 2, [list(range(8)), list(range(8, 16))]),  # one node each
        (range(16), [range(8), range(8, 16)], 4, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
        # interleaved numbering (node 0 holds the even cores): blocks still stay within a node
        (range(8), [[0, 2, 4, 6], [1, 3, 5, 7]], 2, [[0, 2, 4, 6], [1, 3, 5, 7]]),
        (range(5), [range(5)], 2, [[0, 1, 2], [3, 4]]),  # sizes differ by one at most
        ([2, 3, 9], [range(8), range(8, 16)], 3, [[2], [3], [9]]),  # only the cores this process may use
    ],
)
def test_rank_cores_split_node_by_node(allowed, nodes, ranks: int, expected: list[list[int]]) -> None:
    blocks = [rank_cores(list(allowed), [list(n) for n in nodes], rank, ranks) for rank in range(ranks)]
    assert blocks == expected
    assert sorted(core for block in blocks for core in block) == sorted(allowed)  # disjoint, and every core used


def test_too_few_cores_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="1 cores for 2 ranks on this host.*bind_cores: false"):
        rank_cores([0], [[0]], 0, 2)
    with pytest.raises(ValueError, match="local_rank 2 is outside 0..1"):
        rank_cores([0, 1], [[0, 1]], 2, 2)
