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
    assert {"model", "random", "long", "correlated"} == set(bench.GATE_CLASSES)


def test_every_gate_class_is_an_input_class_with_a_table_name():
    import importlib.util
    from pathlib import Path

    from kda_aot.references import input_classes

    assert set(bench.GATE_CLASSES) <= set(input_classes.CLASSES)
    spec = importlib.util.spec_from_file_location(
        "bench_tables", Path(__file__).resolve().parents[2] / "ci" / "bench_tables.py")
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    assert set(bench.GATE_CLASSES) <= set(bt.CLASS_NAMES)
    # the correlated label states the class's defaults
    label = bt.CLASS_NAMES["correlated"]
    assert f"{input_classes.CORRELATED_EPS:g} N(0, 1)" in label
    assert f"beta logit {input_classes.CORRELATED_BETA_LOGIT:g}" in label


def test_the_correlated_class_is_a_gates_choice(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:  # an unknown choice would exit 2 before --help
        bench.main(["--gates", "model", "random", "correlated", "--help"])
    assert exit_.value.code == 0 and "correlated" in capsys.readouterr().out


def test_each_gate_class_draws_every_gate_form_as_class_cases_does():
    """class_cases' draws, on the CPU: one draw per class, regated into each form (the device part
    is to_device's cast)."""
    import numpy as np

    from kda_aot.references import input_classes

    lens = [40, 24]
    for cls in bench.GATE_CLASSES:
        base = input_classes.make_class_inputs(cls, 1, sum(lens), 2, gate="safe", seed=0, state="bf16",
                                               n_states=len(lens))
        for form in bench.GATE_FORMS:
            x = input_classes.regate(base, form, seed=0) if form != "safe" else base
            assert x["k"] is base["k"] and x["initial_state"].shape == (2, 2, 128, 128)
            assert np.isfinite(x["g"]).all()
    corr = input_classes.make_class_inputs("correlated", 1, 64, 2, seed=0)
    k = corr["k"][0].astype(np.float64)  # [T, H, D]: nearly parallel along T in each head
    cos = np.einsum("thd,hd->th", k, k[0]) / (np.linalg.norm(k, axis=-1) * np.linalg.norm(k[0], axis=-1))
    assert cos.min() > 0.99 and (corr["beta"] == input_classes.CORRELATED_BETA_LOGIT).all()


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
