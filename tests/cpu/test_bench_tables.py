"""ci/bench_tables.py: the README's and docs/benchmarks.md's benchmark tables are what
docs/bench/h200.json gives, and the rendering of both JSON formats (CPU only)."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("bench_tables", REPO / "ci" / "bench_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bt = _module()

RUN = {"format": 2, "machine": "NVIDIA H200", "date": "2026-12-02", "kda_aot": "0.1.0", "torch": "2.11.0",
       "iters": 100, "warmup": 20, "peers": {"FLA": "0.6.0", "flashinfer": "0.7.2.post1", "FlashKDA": None},
       "notes": ["FlashKDA is not importable"],
       "host_cost": [["serial, dense, outputs allocated", 31.25]],
       "rows": [
           {"H": 64, "sequences": "8192", "gates": "model", "gate": "safe", "g dtype": "bfloat16", "floor ms": 0.159,
            "kernels ms": 0.583, "eager ms": 0.59, "eager+seq_lens ms": 0.588, "graph ms": 0.5831, "plan": "serial",
            "FLA ms": 3.1, "FlashKDA ms (this run)": 1.212, "FlashKDA bitwise": "yes",
            "cuDNN graph ms": 2.389, "cuDNN eager ms": 2.41, "cuDNN host us": 612.0,
            "error kda-aot": [5.7e-3, 3.1e-3], "error cuDNN": [5.2e-3, 2.0e-3], "error FLA": [4.9e-3, 1.0e-4]},
           {"H": 64, "sequences": "8192", "gates": "model", "gate": "softplus", "g dtype": "bfloat16",
            "kernels ms": 0.6, "graph ms": 0.61, "cuDNN note": "gate='softplus': not served"},
           {"H": 8, "sequences": "6000+2192", "gates": "random", "gate": "safe", "graph ms": 0.143,
            "FlashKDA ms (published, same H200 kind)": 0.84, "cuDNN eager ms": 0.5},
           {"H": 8, "sequences": "uneven6", "gates": "long", "gate": "log_decay", "g dtype": "float32",
            "graph ms": 0.15},
           {"H": 64, "sequences": "8192", "gates": "correlated", "gate": "safe", "g dtype": "bfloat16",
            "graph ms": 0.584, "FlashKDA ms (this run)": 1.213, "FlashKDA bitwise": "no: earlier recipe",
            "cuDNN graph ms": 2.4, "cuDNN eager ms": 2.42, "error kda-aot": [2.1e-2, 1.5e-2],
            "error FlashKDA": [3.4e-1, 2.2e-1], "error cuDNN": [2.5e-2, 1.8e-2], "error FLA": [2.0e-2, 1.1e-2]}]}


def test_the_repository_matches_its_json():
    assert bt.main(["--check"]) == 0, "run python ci/bench_tables.py after changing docs/bench/h200.json"


def test_readme_block_holds_the_safe_gate_rows_per_class():
    block = bt.readme_block(bt.load_data(RUN))
    lines = block.splitlines()
    assert lines[2] == "| 64 [8192] | model (FLA layer init) | 0.583 | 1.212 | 3.100 | 2.389 |"
    assert lines[3] == "| 8 [6000, 2192] | random, N(0, 1) | 0.143 | 0.840 (published) | - | 0.500 (eager) |"
    assert lines[4] == ("| 64 [8192] | correlated, k = c + 0.05 N(0, 1), beta logit 6 | 0.584 | 1.213 | - "
                        "| 2.400 |")
    assert len([l for l in lines if l.startswith("| ") and "---" not in l]) == 4  # header + the three safe rows
    assert "NVIDIA H200, 2026-12-02, kda-aot 0.1.0" in block and "FLA 0.6.0, flashinfer 0.7.2.post1" in block
    assert "FlashKDA None" not in block


def test_tables_block_holds_every_row_errors_notes_and_host_cost():
    block = bt.tables_block(bt.load_data(RUN))
    assert ("| 64 [8192] | model (FLA layer init) | safe (bfloat16) | 0.159 | 0.583 | 0.590 | 0.588 | 0.583 | serial "
            "| 1.212 (yes) | 3.100 | 2.389 / 2.410 (612) | 5.70e-03 / 3.10e-03 | - | 5.20e-03 / 2.00e-03 "
            "| 4.90e-03 / 1.00e-04 |") in block
    # the correlated class: every implementation's error, FlashKDA's beside kda-aot's
    assert ("| 64 [8192] | correlated, k = c + 0.05 N(0, 1), beta logit 6 | safe (bfloat16) | - | - | - | - | 0.584 "
            "| - | 1.213 (no: earlier recipe) | - | 2.400 / 2.420 | 2.10e-02 / 1.50e-02 | 3.40e-01 / 2.20e-01 "
            "| 2.50e-02 / 1.80e-02 | 2.00e-02 / 1.10e-02 |") in block
    assert "on correlated, k = c + 0.05 N(0, 1), beta logit 6 inputs" in block
    assert "| 8 uneven6 | long, g ~ N(-8, 1) | log_decay (float32) |" in block
    assert "- cuDNN: gate='softplus': not served" in block and "- FlashKDA is not importable" in block
    assert "| serial, dense, outputs allocated | 31.2 |" in block


def test_the_first_json_format_renders_as_random_safe_rows():
    old = [{"H": 4, "sequences": "16384", "graph ms": 0.1597, "FlashKDA ms (this run)": None,
            "FlashKDA ms (published, same H200 kind)": 1.603, "FLA ms": None}]
    data = bt.load_data(old)
    assert data["rows"][0]["gates"] == "random" and data["rows"][0]["gate"] == "safe"
    block = bt.readme_block(data)
    assert "| 4 [16384] | random, N(0, 1) | 0.160 | 1.603 (published) | - | - |" in block
    assert "not recorded" in block


def _repo_copy(tmp_path, data):
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    for name in bt.FILES:
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "docs" / "bench" / "h200.json").write_text(json.dumps(data))
    return tmp_path


def test_check_names_the_first_difference_and_a_rewrite_fixes_it(tmp_path, capsys):
    repo = _repo_copy(tmp_path, RUN)
    assert bt.main(["--check"], repo=str(repo)) == 1
    assert "README.md differs" in capsys.readouterr().err
    before = (repo / "README.md").read_text()
    assert bt.main([], repo=str(repo)) == 0
    after = (repo / "README.md").read_text()
    assert after != before and "| 64 [8192] | model (FLA layer init) | 0.583 |" in after
    assert after.split("<!-- BENCH:README -->")[0] == before.split("<!-- BENCH:README -->")[0]
    assert bt.main(["--check"], repo=str(repo)) == 0


def test_missing_markers_are_an_error(tmp_path, capsys):
    repo = _repo_copy(tmp_path, RUN)
    text = (repo / "docs" / "benchmarks.md").read_text().replace("<!-- /BENCH:TABLES -->", "")
    (repo / "docs" / "benchmarks.md").write_text(text)
    for argv in (["--check"], []):
        assert bt.main(argv, repo=str(repo)) == 1
        assert "benchmarks.md: the markers <!-- BENCH:TABLES --> ... <!-- /BENCH:TABLES --> are missing" in \
            capsys.readouterr().err
    assert (repo / "docs" / "benchmarks.md").read_text() == text


@pytest.mark.parametrize("key, shown", [("8192", "[8192]"), ("8192+2048", "[8192, 2048]"), ("8x1024", "8 x [1024]"),
                                        ("uneven6", "uneven6")])
def test_sequence_names(key, shown):
    assert bt.seqs({"sequences": key}) == shown
