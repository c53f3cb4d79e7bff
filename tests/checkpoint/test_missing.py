"""A missing checkpoint of a run is answered with what the run holds and how to make the one asked for."""

from __future__ import annotations

import os

from attnx.checkpoint.missing import missing_checkpoint


def folder_with(tmp_path, *names):
    folder = tmp_path / "runs" / "base" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    for age, name in enumerate(reversed(names)):  # the first name is the newest
        (folder / name).touch()
        os.utime(folder / name, (1_000 + age, 1_000 + age))
    return folder


def test_a_missing_averaged_checkpoint_names_attnx_average_and_last_ckpt(tmp_path):
    folder = folder_with(
        tmp_path, "last.ckpt", "step=179.ckpt", "step=150.ckpt", "step=120.ckpt", "step=90.ckpt"
    )
    message = missing_checkpoint(folder / "averaged.ckpt")
    assert message == (
        f"checkpoint {folder / 'averaged.ckpt'} does not exist; {folder} holds last.ckpt, step=179.ckpt, "
        f"step=150.ckpt, step=120.ckpt and 1 more: attnx fit writes {folder / 'averaged.ckpt'} when a run ends; "
        f"for a run that was stopped, make it with `attnx average --dir {folder} --last 5 --output "
        f"{folder / 'averaged.ckpt'}`, or use {folder / 'last.ckpt'}"
    )


def test_a_missing_step_checkpoint_names_the_others_and_a_folder_without_any_says_so(tmp_path):
    folder = folder_with(tmp_path, "step=20.ckpt")
    assert missing_checkpoint(folder / "step=10.ckpt").startswith(
        f"checkpoint {folder / 'step=10.ckpt'} does not exist; {folder} holds step=20.ckpt: use one of those, "
        "or average the newest with `attnx average"
    )
    (folder / "step=20.ckpt").unlink()
    assert "holds no checkpoint" in missing_checkpoint(folder / "averaged.ckpt")
    assert missing_checkpoint(tmp_path / "nowhere" / "averaged.ckpt").endswith(
        f"nor does the folder {tmp_path / 'nowhere'} (attnx fit writes "
        "runs/NAME/version_N/checkpoints/averaged.ckpt when a run ends)"
    )


def test_a_loose_averaged_checkpoint_names_the_newest_run_s_or_the_whole_pattern(tmp_path):
    """`--ckpt_path averaged.ckpt` said "attnx fit writes averaged.ckpt when a run ends", naming no folder."""
    loose = tmp_path / "averaged.ckpt"
    assert missing_checkpoint(loose) == (
        f"checkpoint {loose} does not exist; {tmp_path} holds no checkpoint (attnx fit writes "
        "runs/NAME/version_N/checkpoints/averaged.ckpt when a run ends)"
    )
    newest = folder_with(tmp_path, "averaged.ckpt") / "averaged.ckpt"
    assert missing_checkpoint(loose, newest) == (
        f"checkpoint {loose} does not exist; the newest run of this config has {newest}"
    )
    # inside a run's checkpoints folder, that folder's own file is named, whatever the config's newest
    inside = tmp_path / "runs" / "base" / "version_1" / "checkpoints" / "averaged.ckpt"
    inside.parent.mkdir(parents=True)
    (inside.parent / "last.ckpt").touch()
    assert f"attnx fit writes {inside} when a run ends" in missing_checkpoint(inside, newest)


def test_any_other_missing_file_is_the_plain_line(tmp_path):
    assert (
        missing_checkpoint(tmp_path / "model.ckpt") == f"checkpoint {tmp_path / 'model.ckpt'} does not exist"
    )


def test_a_folder_given_for_a_checkpoint_says_it_is_a_folder_and_names_the_files_inside(tmp_path):
    run = tmp_path / "version_0"
    assert missing_checkpoint(run / "x") == f"checkpoint {run / 'x'} does not exist"
    (run / "checkpoints").mkdir(parents=True)
    assert missing_checkpoint(run) == (
        f"checkpoint {run} is a folder: pass a checkpoint file (.ckpt, written by attnx fit or attnx average); "
        "this folder holds none"
    )
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert missing_checkpoint(run).endswith(f"average), e.g. {run / 'checkpoints' / 'last.ckpt'}")
    # the folder of every run, and of runs chosen with --run_dir, two levels up
    chosen = tmp_path / "runs" / "lora" / "checkpoints"
    chosen.mkdir(parents=True)
    (chosen / "last.ckpt").write_bytes(b"")
    assert missing_checkpoint(tmp_path / "runs").endswith(f"average), e.g. {chosen / 'last.ckpt'}")
