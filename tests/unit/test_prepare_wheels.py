"""tools/prepare_wheels.py: the pip commands it runs (CPython 3.12 manylinux binaries, no
dependencies, into the folder), and its check of a folder."""

from __future__ import annotations

import importlib

prep = importlib.import_module("tools.prepare_wheels")


def test_dry_run_prints_one_pinned_download_per_wheel(capsys, tmp_path):
    assert prep.main(["--dry-run", "--dest", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(prep.WHEELS) == 4
    specs = [line.split()[line.split().index("download") + 1] for line in lines]
    assert specs[0] == "megatron-core==0.16.1" and "liger-kernel==0.8.5" in specs
    assert "cut-cross-entropy==25.1.1" in specs and any(s.startswith("pybind11==") for s in specs)
    for line in lines:
        words = line.split()
        assert "--no-deps" in words and words[words.index("--python-version") + 1] == "3.12"
        assert words[words.index("--dest") + 1] == str(tmp_path)
        assert "manylinux_2_28_x86_64" in words
    assert not list(tmp_path.iterdir())  # nothing downloaded


def test_check_names_each_missing_wheel(tmp_path, capsys):
    assert prep.main(["--check", "--dest", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("no ") == 4
    for name in ("megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.whl",
                 "pybind11-3.1.0-py3-none-any.whl", "liger_kernel-0.8.5-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert [w.spec for w in prep.missing(str(tmp_path))] == ["cut-cross-entropy==25.1.1"]
    (tmp_path / "cut_cross_entropy-25.1.1-py3-none-any.whl").write_bytes(b"")
    assert prep.main(["--check", "--dest", str(tmp_path)]) == 0
