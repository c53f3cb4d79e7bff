"""The packaged configs: every YAML file of ``attnx/configs`` is listed by name with its summary, and a name
or a path resolves to the file it means."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attnx.configs
from attnx.configs import ConfigNotFound, available, resolve

PACKAGE = Path(attnx.configs.__file__).parent


def packaged_files() -> dict[str, Path]:
    return {
        p.relative_to(PACKAGE).with_suffix("").as_posix(): p
        for p in PACKAGE.rglob("*.yaml")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(PACKAGE).parts)
    }


def first_comment_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.lstrip("#").strip():
            return line.lstrip("#").strip()
    return ""


def test_every_packaged_yaml_is_available_by_name():
    names = available()
    assert set(names) == set(packaged_files())
    assert {"base", "big", "multi30k_cpu", "tiny"} <= set(names)
    assert {"table3/A_heads1", "table3/C_dmodel1024", "table3/E_learned_positions"} <= set(names)


def test_top_level_configs_come_first_and_numbers_sort_by_value():
    names = list(available())
    assert names[:5] == ["base", "big", "modern_multi30k", "multi30k_cpu", "tiny"]
    heads = [n for n in names if n.startswith("table3/A_heads")]
    assert heads == ["table3/A_heads1", "table3/A_heads4", "table3/A_heads16", "table3/A_heads32"]


@pytest.mark.parametrize("name", sorted(packaged_files()))
def test_summary_is_the_first_comment_line_and_one_whole_sentence(name):
    summary = available()[name]
    assert summary == first_comment_line(packaged_files()[name])
    assert summary, f"{name}.yaml has no comment line to summarize it"
    assert summary.endswith("."), f"{name}.yaml: the first comment line is cut mid-sentence: {summary!r}"
    assert summary.count("(") == summary.count(")"), f"{name}.yaml: unbalanced parentheses in {summary!r}"
    assert len(summary) <= 105, f"{name}.yaml: the summary should fit on one line ({len(summary)} characters)"


def test_summaries_of_the_main_configs_say_what_they_are():
    summaries = available()
    assert "base Transformer" in summaries["base"] and "big Transformer" in summaries["big"]
    assert "Multi30k" in summaries["multi30k_cpu"]
    assert summaries["table3/A_heads1"].startswith("Table 3 (A)")


@pytest.mark.parametrize("asked", ["base", "base.yaml", " base "])
def test_a_packaged_name_resolves_with_or_without_suffix(asked, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no local file of that name
    path = resolve(asked)
    assert path == PACKAGE / "base.yaml"
    assert path.is_file()


def test_nested_names_and_path_objects_resolve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("table3/A_heads1") == PACKAGE / "table3" / "A_heads1.yaml"
    assert resolve(Path("table3") / "C_layers2.yaml") == PACKAGE / "table3" / "C_layers2.yaml"


def test_every_available_name_resolves_to_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = packaged_files()
    for name in available():
        assert resolve(name) == files[name]


def test_an_existing_file_wins_over_a_packaged_name(tmp_path, monkeypatch):
    local = tmp_path / "base.yaml"
    local.write_text("# my own base\nseed_everything: 2\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert resolve("base.yaml") == Path("base.yaml")
    assert resolve("base.yaml").resolve() == local
    assert resolve(str(local)) == local
    assert resolve("base") == PACKAGE / "base.yaml"  # no file called plain "base" here


def test_an_unknown_name_says_what_was_asked_lists_the_names_and_suggests_checking_the_path(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigNotFound) as raised:
        resolve("bsae")
    message = str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert "'bsae'" in message
    assert "check the path" in message
    for name in available():
        assert name in message
    assert "\n" not in message


def test_a_folder_or_a_missing_path_is_not_a_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for asked in ["runs", "table3", str(tmp_path / "missing.yaml"), ""]:
        with pytest.raises(ConfigNotFound, match="not found"):
            resolve(asked)


def test_a_repository_path_outside_the_clone_points_at_the_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigNotFound, match=re.escape("the packaged one is named 'table3/A_heads1'")):
        resolve("configs/table3/A_heads1.yaml")
