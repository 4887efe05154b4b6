"""The benchmark's JSON and chart writers, on rows shaped like the real table (CPU only)."""

import json

from kda_aot import bench

HEADER = ["H", "sequences", "floor ms", "kernels ms", "eager ms", "graph ms", "plan", "FLA ms",
          "FlashKDA ms (published, same H200 kind)", "host us eager / +seq_lens / given buffers"]
ROWS = [[64, "8192", 0.159, 0.762, 0.764, 0.761, "serial", None, 1.214, "41.4 / 42.2 / 37.5"],
        [4, "8192", 0.010, 0.116, 0.116, 0.114, "16 segments (max 32 tiles)", None, 0.816, "42.3 / 44.7 / 44.2"]]


def test_json_has_one_object_per_shape_keyed_by_column(tmp_path):
    path = tmp_path / "bench.json"
    bench.write_json(HEADER, ROWS, str(path))
    data = json.loads(path.read_text())
    assert [d["H"] for d in data] == [64, 4]
    assert data[1]["eager ms"] == 0.116 and data[0]["FLA ms"] is None


def test_png_is_written_or_the_missing_dependency_is_named(tmp_path):
    path = tmp_path / "bench.png"
    line = bench.write_png(HEADER, ROWS, str(path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in line and not path.exists()
        return
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", line
