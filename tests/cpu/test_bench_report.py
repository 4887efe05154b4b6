"""The benchmark's JSON and chart writers and its CPU-side helpers, on rows shaped like the real
table (CPU only)."""

import json

from kda_aot.tools import bench

HEADER = ["H", "sequences", "gates", "gate", "floor ms", "kernels ms", "eager ms", "graph ms", "plan", "FLA ms",
          "FlashKDA ms (published, same H200 kind)", "cuDNN graph ms", "error kda-aot",
          "host us eager / +seq_lens / given buffers"]
ROWS = [[64, "8192", "model", "safe", 0.159, 0.762, 0.764, 0.761, "serial", None, None, 2.389, [5.7e-3, 4e-3],
         "41.4 / 42.2 / 37.5"],
        [4, "8192", "random", "safe", 0.010, 0.116, 0.116, 0.114, "16 segments (max 32 tiles)", None, 0.816, 0.086,
         None, "42.3 / 44.7 / 44.2"]]


def test_json_holds_the_run_and_one_object_per_row_keyed_by_column(tmp_path):
    path = tmp_path / "bench.json"
    bench.write_json(HEADER, ROWS, str(path), {"machine": "NVIDIA H200", "date": "2026-12-02", "format": 2})
    data = json.loads(path.read_text())
    assert data["machine"] == "NVIDIA H200" and data["format"] == 2
    assert [d["H"] for d in data["rows"]] == [64, 4]
    assert data["rows"][1]["eager ms"] == 0.116 and data["rows"][0]["FLA ms"] is None
    assert data["rows"][0]["error kda-aot"] == [5.7e-3, 4e-3] and data["rows"][0]["gates"] == "model"


def test_png_is_written_or_the_missing_dependency_is_named(tmp_path):
    path = tmp_path / "bench.png"
    line = bench.write_png(HEADER, ROWS, str(path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in line and not path.exists()
        return
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", line


def test_floor_bytes_counts_an_fp32_gate_twice():
    lens = [100, 28]
    bf16 = bench.floor_bytes(2, lens)
    assert bf16 == 128 * 2 * (5 * 128 * 2 + 2) + 2 * 2 * 2 * 128 * 128 * 2
    assert bench.floor_bytes(2, lens, g_bytes=4) - bf16 == 128 * 2 * 128 * 2


def test_suites_and_gate_choices():
    assert bench.SUITES["peers"] == bench.PEERS_SUITE and (64, bench.UNEVEN6) in bench.PEERS_SUITE
    assert {"model", "random", "long"} == set(bench.GATE_CLASSES)
    assert bench.shape_key(bench.UNEVEN6) == "uneven6" and bench.shape_key([6000, 2192]) == "6000+2192"


def test_the_gate_arguments_of_a_case():
    assert bench.gate_kwargs({"A_log": 1, "dt_bias": 2}) == dict(A_log=1, dt_bias=2, lower_bound=-5.0, gate="safe")
    case = {"A_log": None, "dt_bias": None, "lower_bound": None, "gate": "log_decay"}
    assert bench.gate_kwargs(case) == dict(A_log=None, dt_bias=None, lower_bound=None, gate="log_decay")


def test_without_a_gpu_it_says_so_in_one_line(capsys):
    import pytest

    from kda_aot.tools.cli_checks import gpu_problem, torch_problem
    if not (torch_problem() or gpu_problem()):
        pytest.skip("a GPU is present: the benchmark runs")
    assert bench.main(["--gates", "model", "--gate-forms", "log_decay"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
