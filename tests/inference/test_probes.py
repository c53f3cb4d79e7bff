"""A choice measured once per key and said once; a replaced measurement for a block, and what was before after it."""

from __future__ import annotations

from attnx.inference.probes import ProbeCache


def test_a_key_is_measured_once_and_said_once(capsys) -> None:
    measured: list[tuple] = []
    cache = ProbeCache(lambda *args: measured.append(args) or f"choice {args[0]}", lambda c: f"chose {c}")
    assert cache.choice("a", 1, 2, say=False) == "choice 1"
    assert (
        cache.choice("a", 9, say=True) == "choice 1"
    )  # cached: not measured again, said the first time asked
    assert cache.choice("a", 9) == "choice 1"
    assert cache.choice("b", 3) == "choice 3"
    assert measured == [(1, 2), (3,)]
    assert capsys.readouterr().err.splitlines() == ["chose choice 1", "chose choice 3"]


def test_a_replaced_measurement_holds_for_its_block_and_the_earlier_choices_come_back(capsys) -> None:
    cache = ProbeCache(lambda x: f"real {x}", lambda c: c)
    assert cache.choice("k", 1) == "real 1"
    with cache.replaced(lambda x: f"injected {x}", say=False):
        assert cache.choice("k", 2) == "injected 2"  # measured afresh in the block
        assert cache.choice("k", 3) == "injected 2"
    with cache.replaced(lambda x: f"said {x}"):
        assert cache.choice("k", 4) == "said 4"
    assert cache.choice("k", 5) == "real 1"
    assert capsys.readouterr().err.splitlines() == ["real 1", "said 4"]
