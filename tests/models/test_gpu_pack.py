"""Splitting a pack into parts that each fit one call to a lent GPU."""

from __future__ import annotations

import json

from pasu.models.gpu_pack import fill_parts


def _staged(tmp_path, sizes):
    staged = tmp_path / "staged"
    staged.mkdir()
    files = []
    for n, size in enumerate(sizes):
        (staged / f"f{n}").write_bytes(b"x" * size)
        files.append((f"f{n}", [{"id": f"u{n}"}]))
    return staged, files


def test_files_go_to_parts_in_order_each_under_the_budget(tmp_path):
    staged, files = _staged(tmp_path, [400_000, 400_000, 400_000, 100_000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0", "f1"], ["f2", "f3"]]
    assert [[r["id"] for r in rows] for rows in parts.values()] == [["u0", "u1"], ["u2", "u3"]]
    row_bytes = len(json.dumps({"id": "u0"})) + 2
    assert all(sum(f.stat().st_size for f in p.iterdir()) + 2 * row_bytes <= 2**20 for p in parts)
    assert not staged.exists()


def test_what_part0_already_holds_counts_against_its_budget(tmp_path):
    staged, files = _staged(tmp_path, [400_000, 400_000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0, part0_bytes=500_000)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0"], ["f1"]]


def test_a_file_over_the_budget_still_gets_a_part_of_its_own(tmp_path):
    staged, files = _staged(tmp_path, [2 * 2**20, 1000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0"], ["f1"]]
