"""The key/value cache: a growing cache appends each step's keys and values, a static one is filled once."""

from __future__ import annotations

import torch

from attnx.model.cache import AttentionCache


class Projection:
    """`project()` for a cache: the next block of keys and values, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        k = torch.full((2, 4, 1, 8), float(self.calls))  # (B, H, S, d): one new position per call
        return k, -k


def test_a_growing_cache_appends_and_gives_the_position_of_the_first_new_query():
    cache, project = AttentionCache(), Projection()
    assert cache.length == 0
    k, v, offset = cache.keys_values(project)
    assert offset == 0 and k.shape == (2, 4, 1, 8) and cache.length == 1
    for step in (2, 3):
        k, v, offset = cache.keys_values(project)
        assert offset == step - 1 and cache.length == step
    assert k[0, 0, :, 0].tolist() == [1.0, 2.0, 3.0]  # oldest position first
    assert torch.equal(v, -k) and k is cache.k and v is cache.v


def test_a_static_cache_projects_once_and_always_answers_from_position_zero():
    cache, project = AttentionCache(static=True), Projection()
    first = cache.keys_values(project)
    again = cache.keys_values(project)
    assert project.calls == 1
    assert again[0] is first[0] and again[1] is first[1]
    assert first[2] == again[2] == 0 and cache.length == 1


def test_reorder_keeps_the_rows_asked_for_in_that_order():
    cache = AttentionCache()
    keys = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 5, 4)
    cache.keys_values(lambda: (keys, keys + 10))
    cache.reorder(torch.tensor([2, 0, 0]))
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 0.0, 0.0]
    assert cache.v[:, 0, 0, 0].tolist() == [12.0, 10.0, 10.0]
    assert cache.length == 5
    empty = AttentionCache()
    empty.reorder(torch.tensor([0]))  # nothing cached yet: nothing to move
    assert empty.k is None and empty.length == 0
