"""Work spread over processes: the results in the items' order, the shared object in every process, progress."""

import operator

import pytest

from pasu.processes import map_in_processes


@pytest.mark.parametrize("jobs", [1, 2])
def test_items_come_back_in_their_order_with_the_shared_object_applied(jobs):
    seen = []
    results = map_in_processes(operator.add, 100, list(range(6)), jobs=jobs,
                               progress=lambda done, total: seen.append((done, total)))
    assert results == [100, 101, 102, 103, 104, 105]
    assert seen == [(i, 6) for i in range(1, 7)]  # counted as they finish


def test_a_failing_item_fails_the_call():
    with pytest.raises(TypeError):
        map_in_processes(operator.add, 100, [1, "two"], jobs=2)
