"""docs/backtranslation.md, run as written: every ```bash block of the page, in order, in a fresh directory.

The page starts from parallel text `raw/par.{en,de}` and German monolingual text `raw/mono.de`; this test
writes them from Multi30k's training set (the first 300 pairs, and the German side of 80 later ones), and
`attnx download --from_dir` copies the validation and test sets from `$ATTNX_DATA_DIR`.

The commands run exactly as written, except that the test appends options to four of them, because the page's
runs take half an hour each and this test must take a minute or two: `attnx prepare` a 300-piece vocabulary;
`attnx fit` an override config (`tiny_fit`: a 2+2-layer, d_model 32 model, 6 steps, a checkpoint every
step); `attnx translate` and `attnx test` short outputs. What is asserted is what the commands guarantee —
exit codes, files, the tag as one piece in the synthetic sources only, the upsampled real pairs, fine-tuning
from the forward model's weights — never what a 6-step model says.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnx.data.corpus import PreparedCorpus
from tests.conftest import REPO

PAGE = REPO / "docs" / "backtranslation.md"


def tiny_fit() -> str:
    """The override for `attnx fit`: a tiny model, 6 steps, checkpoints every step, the last 3 averaged."""
    callbacks = [
        {
            "class_path": "attnx.training.checkpointing.PeriodicCheckpoint",
            "init_args": {"minutes": 0, "keep": 3},
        },
        {"class_path": "attnx.training.checkpointing.AverageCheckpoints", "init_args": {"last": 3}},
    ]
    override = {
        "trainer": {
            "max_steps": 6,
            "val_check_interval": 3,
            "limit_val_batches": 1,
            "precision": "32-true",
            "callbacks": callbacks,
        },
        "model": {
            "transformer": {"d_model": 32, "n_heads": 4, "d_ff": 64, "encoder_layers": 2, "decoder_layers": 2}
        },
        "evaluation": {"bleu_samples": 8, "search": {"beam": 1, "max_len_b": 5}},
        "data": {"max_tokens": 512},
    }
    return yaml.safe_dump(override, sort_keys=False)


OVERRIDES: dict[str, str] = {
    "attnx prepare": "--vocab_size 300 --workers 1",
    "attnx fit": "--config tiny_fit.yaml",
    "attnx translate": "--search.max_len_a 0 --search.max_len_b 6",
    "attnx test": "--trainer.limit_test_batches 1 --evaluation.search.beam 1 --evaluation.search.max_len_b 6",
}


def blocks(page: Path = PAGE) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def with_overrides(block: str, applied: list[str]) -> str:
    lines = block.replace("\\\n", " ").splitlines()  # one line per command
    for i, line in enumerate(lines):
        for command, options in OVERRIDES.items():
            if line.startswith(f"{command} "):
                # the page's own value gives way: an option set twice is refused (--config files stack)
                for name in set(re.findall(r"(--[\w.]+) ", options)) - {"--config"}:
                    line = re.sub(rf" {re.escape(name)}(=| +)[^ -]\S*", "", line)
                lines[i] = f"{line} {options}"
                applied.append(command)
    return "\n".join(lines) + "\n"


def test_page_has_every_step_of_the_recipe():
    text = " ".join(block.replace("\\\n", " ") for block in blocks())
    for step in (
        "attnx prepare --src_lang de --tgt_lang en",
        "--config backtranslation/reverse",
        "attnx translate --model runs/bt_reverse/version_0/checkpoints/averaged.ckpt",
        "--search.sampling true",
        '--train_repeat "[2, 1]"',
        '--train_tag \'["", "<BT>"]\'',
        "--config backtranslation/forward",
        "--init_from runs/bt_forward/version_0/checkpoints/averaged.ckpt",
        "attnx test",
    ):
        assert step in text, f"{PAGE.name} lost `{step}`"
    assert all(
        line.startswith("attnx ") for block in blocks() for line in block.replace("\\\n", " ").splitlines()
    )


def multi30k(shared_data: Path, lang: str, start: int, n: int) -> list[str]:
    with gzip.open(shared_data / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[start : start + n]


@pytest.mark.slow
def test_the_recipe_runs_as_written(shared_data: Path, tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        (raw / f"par.{lang}").write_text(
            "\n".join(multi30k(shared_data, lang, 0, 300)) + "\n", encoding="utf-8"
        )
    (raw / "mono.de").write_text("\n".join(multi30k(shared_data, "de", 15000, 80)) + "\n", encoding="utf-8")
    (tmp_path / "tiny_fit.yaml").write_text(tiny_fit(), encoding="utf-8")
    env = os.environ | {
        "ATTNX_DATA_DIR": str(shared_data),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    applied: list[str] = []
    outputs = []
    for block in blocks():
        script = with_overrides(block, applied)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert done.returncode == 0, f"$ {script}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        outputs.append(done.stdout + done.stderr)
    assert sorted(set(applied)) == sorted(OVERRIDES), f"overrides applied to {applied}"

    # step 2: one synthetic English line per German line
    assert len((raw / "mono.en").read_text(encoding="utf-8").splitlines()) == 80
    # step 3: the tag is one piece, in the synthetic sources only; the real pairs are there twice
    forward = PreparedCorpus(tmp_path / "data" / "bt" / "forward")
    sp = forward.tokenizer.sp
    tag = sp.piece_to_id("<BT>")
    assert tag > 3 and sp.id_to_piece(tag) == "<BT>"
    corpora = forward.meta["splits"]["train"]["corpora"]
    real, synthetic = corpora["raw/par"], corpora["raw/mono"]
    assert (real["repeat"], synthetic["repeat"], synthetic["tag"]) == (2, 1, "<BT>") and "tag" not in real
    train = forward.dataset("train")
    tagged = sum(tag in train[i][0].tolist() for i in range(len(train)))
    assert len(train) == 2 * real["pairs"] + synthetic["pairs"] and tagged == synthetic["pairs"] > 0
    assert len(forward.dataset("real")) == 300  # the real pairs alone, for fine-tuning
    # step 4: a new run from the forward model's weights, on the real pairs
    finetune = tmp_path / "runs" / "bt_finetune" / "version_0"
    assert "init_from: the weights of runs/bt_forward/version_0/checkpoints/averaged.ckpt" in outputs[4]
    assert yaml.safe_load((finetune / "config.yaml").read_text())["data"]["train_split"] == "real"
    assert (finetune / "checkpoints" / "averaged.ckpt").is_file()
    # step 5: scored
    assert "sacreBLEU BLEU = " in outputs[5] and "chrF2" in outputs[5]


def test_the_recipes_configs_merge_over_the_model_config(capsys):
    from attnx.cli import main as attnx

    for name, data_dir in (("reverse", "data/bt/reverse"), ("forward", "data/bt/forward"), ("finetune", "")):
        with pytest.raises(SystemExit) as done:
            attnx(
                ["fit", "--config", "multi30k_cpu", "--config", f"backtranslation/{name}", "--print_config"]
            )
        assert done.value.code == 0
        config = yaml.safe_load(capsys.readouterr().out)
        assert config["data"]["data_dir"] == (data_dir or "data/bt/forward")
        assert {logger["init_args"]["name"] for logger in config["trainer"]["logger"]} == {f"bt_{name}"}
        assert config["model"]["transformer"]["d_model"] == 256  # the model config's, untouched
    assert config["data"]["train_split"] == "real" and config["trainer"]["max_time"] == "00:00:05:00"
