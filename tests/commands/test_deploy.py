"""``attnx serve`` as a command: its options and its one-line errors (the service itself: tests/serving)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from attnx.cli import main as attnx_main


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_every_option_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "serve", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for option in (
        "--model",
        "--host",
        "--port",
        "--search.help",
        "--device",
        "--max_tokens",
        "--max_batch_size",
        "--batch_timeout",
        "--max_lines",
        "--max_line_chars",
        "--max_body_bytes",
        "--workers",
        "--threads",
        "--timeout",
    ):
        assert option in result.stdout
    assert "POST /translate" in result.stdout
    search = subprocess.run(
        [sys.executable, "-m", "attnx", "serve", "--search.help", "SearchConfig"],
        capture_output=True,
        text=True,
    )
    assert "Beam size; 1 = greedy search." in search.stdout


def test_serve_offers_every_server_setting_with_the_servers_default():
    import dataclasses
    import inspect

    from attnx.commands.deploy import serve
    from attnx.serving.settings import RequestLimits, ServeSettings

    resolved = ("limits", "compute_type")  # the limits' own fields are options; compute_type is resolved
    defaults = {f.name: f.default for f in dataclasses.fields(ServeSettings) if f.name not in resolved}
    defaults |= {f.name: f.default for f in dataclasses.fields(RequestLimits)}
    options = {
        name: p.default
        for name, p in inspect.signature(serve).parameters.items()
        if name not in ("model", "search")
    }
    assert options == defaults


def test_serve_is_listed_with_the_commands(capsys):
    assert attnx_main(["--help"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["serve", "Serve", "a", "trained", "model", "over", "HTTP:", "POST", "/translate,"] in [
        line[:9] for line in listed
    ]


@pytest.mark.parametrize(
    ("options", "status", "words"),
    [
        (["--host", "localhost"], 2, "--host localhost"),
        (["--port", "80"], 2, "--port 80"),
        (["--device", "cuda:99"], 2, "--device cuda:99"),
        (["--max_lines", "0"], 2, "--max_lines must be at least 1"),
        (["--batch_timeout", "60"], 2, "below --timeout"),
        (["--search.beam", "0"], 2, "search.beam must be at least 1"),
    ],
)
def test_bad_settings_are_one_line_before_anything_starts(checkpoint, capsys, options, status, words):
    assert attnx_main(["serve", "--model", str(checkpoint), "--port", free_port(), *options]) == status
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_or_broken_model_is_one_line_exit_1(tmp_path, capsys):
    assert attnx_main(["serve", "--model", str(tmp_path / "missing.ckpt")]) == 1
    assert "missing.ckpt does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint")
    assert attnx_main(["serve", "--model", str(broken), "--port", free_port()]) == 1
    err = capsys.readouterr().err
    assert "broken.ckpt" in err and len(err.strip().splitlines()) == 1


def test_a_busy_port_is_one_line_exit_1(checkpoint, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert attnx_main(["serve", "--model", str(checkpoint), "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1 port {port}" in capsys.readouterr().err


def test_without_litserve_the_error_says_what_to_install(checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "litserve", None)  # import litserve raises ImportError
    assert attnx_main(["serve", "--model", str(checkpoint)]) == 2
    assert 'pip install "attnx[serve]"' in capsys.readouterr().err


HIDDEN = "import sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','), None)); sys.argv[1:2] = []; " \
    "from attnx.cli import main; sys.exit(main())"  # fmt: skip
"""`attnx ARGS` in a subprocess where the modules named first cannot be imported (an extra not installed)."""


def without(modules: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDDEN, modules, *argv], capture_output=True, text=True)


def test_a_missing_extra_is_one_line_naming_it_in_every_command(checkpoint, tmp_path):
    """export to either format, and translate or serve a CTranslate2 model, without the extra they need: one
    line naming the extra, exit 2, as `serve` without LitServe (it was a 29-line ImportError traceback)."""
    exported = tmp_path / "ct2"
    assert (
        attnx_main(
            ["export", "--ckpt_path", str(checkpoint), "--format", "ctranslate2", "--output", str(exported)]
        )
        == 0
    )
    cases = [
        ("ctranslate2", ["export", "--ckpt_path", str(checkpoint), "--format", "ctranslate2", "--output", str(tmp_path / "a")],
         'attnx export: error: attnx export --format ctranslate2 needs ctranslate2, which is not installed: pip install "attnx[ct2]"'),
        ("transformers", ["export", "--ckpt_path", str(checkpoint), "--format", "huggingface", "--output", str(tmp_path / "b")],
         'attnx export: error: attnx export --format huggingface needs transformers, which is not installed: pip install "attnx[hf]"'),
        ("ctranslate2", ["translate", "--model", str(exported), "--input", str(checkpoint)],
         f'attnx translate: error: attnx translate --model {exported} (a CTranslate2 model) needs ctranslate2, which is not installed: pip install "attnx[ct2]"'),
        ("ctranslate2", ["serve", "--model", str(exported)],
         f'attnx serve: error: attnx serve --model {exported} (a CTranslate2 model) needs ctranslate2, which is not installed: pip install "attnx[ct2]"'),
    ]  # fmt: skip
    for hidden, argv, line in cases:
        done = without(hidden, *argv)
        assert (done.returncode, done.stderr, done.stdout) == (2, line + "\n", ""), (
            argv,
            done.stderr[-2000:],
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # the checkpoint itself needs no extra
    done = without(
        "ctranslate2,transformers", "translate", "--model", str(checkpoint), "--search.max_len_b", "3"
    )
    assert done.returncode == 0, done.stderr


def test_search_options_on_an_export_change_the_settings_stored_with_it(ct2_export, monkeypatch):
    """`attnx serve --model CT2_DIR --beam 2 --nbest 2`: the server decodes with the export's stored settings
    with those two changed, its length penalty (CTranslate2's |Y|^alpha) kept; the search was rebuilt over
    SearchConfig's GNMT default, which CTranslate2 refused."""
    pytest.importorskip("litserve")
    import attnx
    import attnx.serving.server as server

    served = []
    monkeypatch.setattr(
        server,
        "serve",
        lambda model, search, settings: served.append(attnx.load(model, search=search, precision="32-true")),
    )
    argv = ["serve", "--model", str(ct2_export), "--port", free_port(), "--beam", "2", "--nbest", "2"]
    assert attnx_main(argv) == 0
    expected = attnx.load(ct2_export, precision="32-true").with_search(beam=2, nbest=2)
    assert [t.search for t in served] == [expected.search] and expected.search.length_penalty == "fairseq"
