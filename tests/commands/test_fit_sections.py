"""What describe reads off a fit config's sections: settings under init_args or not, max_time, capture."""

from __future__ import annotations

from attnx.commands.fit_sections import captures, files_merged, max_time_seconds, section


def test_a_section_is_read_with_or_without_init_args_and_is_empty_when_absent() -> None:
    assert section({"lora": {"rank": 8}}, "lora") == {"rank": 8}
    assert section({"data": {"init_args": {"max_tokens": 512}}}, "data") == {"max_tokens": 512}
    assert section({"data": None}, "data") == {} and section(None, "trainer") == {}


def test_max_time_is_read_as_lightning_reads_it() -> None:
    assert max_time_seconds("00:01:30:00") == 5400.0
    assert max_time_seconds({"minutes": 3}) == 180.0
    assert max_time_seconds(None) is None


def test_steps_are_captured_on_a_gpu_with_shape_buckets_unless_ddp_all_reduces_every_batch() -> None:
    assert captures({}, "h100", 1, 1) and not captures({}, "cpu", 1, 1)
    assert not captures({"cuda_graphs": False}, "h100", 1, 1)
    assert not captures({"data": {"shape_buckets": 0}}, "h100", 1, 1)
    assert captures({"data": {"shape_buckets": 0}, "cuda_graphs": True}, "h100", 1, 1)
    assert not captures({}, "h100", 8, 1) and captures({}, "h100", 8, 2)


def test_files_merge_as_fit_merges_them() -> None:
    first = {"trainer": {"devices": 8, "callbacks": [1, 2]}, "data": {"max_tokens": 3125}}
    later = {"trainer": {"callbacks": [3]}, "lora": {"rank": 8}}
    assert files_merged(first, later) == {
        "trainer": {"devices": 8, "callbacks": [3]},
        "data": {"max_tokens": 3125},
        "lora": {"rank": 8},
    }
    assert files_merged({}, first) == first and files_merged(first, None) is None
