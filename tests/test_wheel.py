"""attnx built as a wheel and installed into a fresh virtual environment works outside the clone.

The fresh environment reuses this environment's dependencies (torch, Lightning, ...) through a ``.pth`` file
instead of installing them again, but sees neither the clone's ``src/`` nor this environment's own
installation of attnx: the folder the ``.pth`` names holds links to every dependency and nothing of attnx.
attnx itself is installed from the wheel by pip, as a user would, and every check runs from a folder
outside the clone with ``PYTHONPATH`` unset.

The ``installed`` fixture is module-scoped so that further tests (a short training from the wheel, say) reuse
one build and one environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters
from tests.conftest import REPO

pytestmark = pytest.mark.slow

# What a build never needs: copying them would only cost time. Folders of the clone's root only (the
# package has its own `data` subpackage).
TOP_LEVEL = {
    ".git",
    ".venv",
    "runs",
    "data",
    "site",
    "lightning_logs",
    "build",
    "dist",
    "docs",
    ".gl",
    ".whl",
}
ANYWHERE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache")


def NOT_COPIED(folder: str, names: list[str]) -> set[str]:  # noqa: N802 (shutil's ignore= callable)
    skipped = set(ANYWHERE(folder, names))
    if Path(folder).resolve() == REPO.resolve():
        skipped |= TOP_LEVEL & set(names)
    return skipped


@dataclass(frozen=True)
class Installed:
    """A fresh virtual environment with attnx installed from a wheel."""

    wheel: Path
    venv: Path
    outside: Path  # an empty working folder outside the clone

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a program of the fresh environment (``python``, ``attnx``) in the folder outside the clone."""
        program, *rest = args
        command = [str(self.venv / "bin" / str(program)), *map(str, rest)]
        return subprocess.run(
            command, cwd=self.outside, env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def python_json(self, code: str) -> object:
        """Run ``code`` in the fresh environment; what it prints on its last line is read as JSON."""
        done = self.run("python", "-c", textwrap.dedent(code))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])


def build_wheel(out: Path, work: Path) -> Path:
    """``pip wheel`` of a copy of the repository: the build writes its egg-info and build/ there, not in the
    clone. Offline and without build isolation, with this environment's setuptools."""
    source = work / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_COPIED)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"building the wheel failed:\n{done.stdout}\n{done.stderr}"
    (wheel,) = out.glob("attnx-*.whl")
    return wheel


def dependencies_view(into: Path) -> Path:
    """A folder of links to everything in this environment's site-packages except attnx's own files (its
    distribution, the editable-install hooks and any attnx plugin distribution) and ``.pth`` files."""
    into.mkdir()
    for site in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
        for entry in Path(site).iterdir():
            skip = entry.name.lower().startswith(("attnx", "__editable__")) or entry.suffix == ".pth"
            if not skip and not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry)
    return into


def fresh_venv(venv: Path, dependencies: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=600)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "_attnx_test_dependencies.pth").write_text(f"{dependencies}\n", encoding="utf-8")
    return site


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    assert not work.resolve().is_relative_to(REPO.resolve()), (
        "the temporary folder must lie outside the clone"
    )
    wheel = build_wheel(work / "dist", work)
    venv = work / "venv"
    fresh_venv(venv, dependencies_view(work / "dependencies"))
    outside = work / "outside"
    outside.mkdir()
    result = Installed(wheel=wheel, venv=venv, outside=outside)
    # pip of this environment, run by the fresh interpreter: it installs into the fresh venv and writes
    # bin/attnx with the fresh interpreter in its first line.
    done = result.run("python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel)
    assert done.returncode == 0, f"installing the wheel failed:\n{done.stdout}\n{done.stderr}"
    return result


def test_installed_attnx_comes_from_the_wheel_not_the_clone(installed):
    where = installed.python_json(
        """
        import json, sys, attnx
        print(json.dumps({"file": attnx.__file__, "path": sys.path}))
        """
    )
    attnx_file = Path(where["file"]).resolve()
    assert attnx_file.is_relative_to(installed.venv.resolve()), attnx_file
    clone_src = str((REPO / "src").resolve())
    assert not any(Path(p).resolve() == Path(clone_src) for p in where["path"] if p), where["path"]


def test_wheel_files_include_the_configs(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    packaged = REPO / "src" / "attnx" / "configs"
    expected = {f"attnx/configs/{p.relative_to(packaged).as_posix()}" for p in packaged.rglob("*.yaml")}
    assert {"attnx/configs/base.yaml", "attnx/configs/table3/A_heads1.yaml"} <= expected
    assert expected - names == set(), f"missing from {installed.wheel.name}: {sorted(expected - names)}"
    assert "attnx/configs/__init__.py" in names


def test_packaged_configs_are_found_by_name(installed):
    found = installed.python_json(
        """
        import json
        from attnx import configs
        names = configs.available()
        print(json.dumps({
            "names": list(names),
            "summaries": names,
            "base": str(configs.resolve("base")),
            "nested": str(configs.resolve("table3/A_heads1.yaml")),
            "package": str(configs.__file__),
        }))
        """
    )
    names = set(found["names"])
    assert {"base", "big", "multi30k_cpu", "tiny"} <= names
    table3 = {p.stem for p in (REPO / "src" / "attnx" / "configs" / "table3").glob("*.yaml")}
    assert {f"table3/{stem}" for stem in table3} <= names
    assert all(found["summaries"].values()), "a packaged config has no summary line"
    package = Path(found["package"]).parent
    assert package.is_relative_to(installed.venv)
    assert Path(found["base"]) == package / "base.yaml"
    assert Path(found["nested"]) == package / "table3" / "A_heads1.yaml"
    assert (package / "base.yaml").read_bytes() == (REPO / "src/attnx/configs/base.yaml").read_bytes()


def test_command_line_runs_from_the_wheel(installed):
    for command in (("python", "-m", "attnx", "--help"), ("attnx", "--help")):
        done = installed.run(*command)
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr}"
        assert "fit" in done.stdout


def test_a_packaged_config_builds_its_model_with_the_installed_components(installed):
    built = installed.python_json(
        """
        import json, yaml
        from attnx import configs
        from attnx.model import TransformerConfig, build_transformer
        from attnx.model.builders import count_parameters
        from attnx.plugins import registry
        section = yaml.safe_load(configs.resolve("tiny").read_text())["model"]["transformer"]
        model = build_transformer(TransformerConfig.from_dict(section | {"vocab_size": 100}))
        print(json.dumps({"params": count_parameters(model), "attention": registry().names("attention")}))
        """
    )
    assert "multihead" in built["attention"]
    # the same model counted in this process from the clone's tiny.yaml
    section = yaml.safe_load((REPO / "src/attnx/configs/tiny.yaml").read_text())["model"]["transformer"]
    assert built["params"] == count_parameters(
        build_transformer(TransformerConfig.from_dict(section | {"vocab_size": 100}))
    )


def test_quickstart_runs_from_the_wheel_outside_the_clone(installed, shared_data):
    """The quickstart's commands, shortened, from the installed wheel in a folder with no configs/ in it:
    download, prepare, fit with a packaged config named on the command line, average, test, translate."""

    def attnx(*args: str | Path, timeout: float = 300) -> str:
        done = installed.run("attnx", *args, timeout=timeout)
        assert done.returncode == 0, f"attnx {' '.join(map(str, args))}:\n{done.stderr[-3000:]}"
        return done.stdout

    attnx("download", "multi30k", "--output", "raw", "--from_dir", shared_data)
    attnx("prepare", "--src_lang", "en", "--tgt_lang", "de", "--train", "raw/multi30k/val", "--valid",
          "raw/multi30k/val", "--test", "raw/multi30k/test_2016_flickr", "--vocab_size", "500", "--output",
          "data/multi30k")  # fmt: skip
    assert not (installed.outside / "configs").exists()
    attnx("fit", "--config", "tiny", "--data.data_dir", "data/multi30k", "--trainer.max_steps", "4",
          "--trainer.val_check_interval", "4", "--evaluation.bleu_samples", "8")  # fmt: skip
    checkpoints = installed.outside / "runs" / "tiny" / "version_0" / "checkpoints"
    assert (checkpoints / "averaged.ckpt").is_file()
    attnx("average", "--dir", checkpoints, "--last", "2", "--output", "model.ckpt")
    out = attnx("test", "--config", "tiny", "--data.data_dir", "data/multi30k", "--ckpt_path", "model.ckpt",
                "--trainer.limit_test_batches", "1", "--evaluation.search.beam", "1")  # fmt: skip
    assert "sacreBLEU BLEU = " in out
    done = subprocess.run(
        [str(installed.venv / "bin" / "attnx"), "translate", "--model", "model.ckpt", "--search.beam", "1",
         "--search.max_len_b", "5"],
        input="A dog runs.\n\nTwo men.\n", cwd=installed.outside, env=installed.env(), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("\n") == 3 and done.stdout.split("\n")[1] == ""
