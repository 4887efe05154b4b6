"""The measurement and diagnostic tools behind the package's commands (`python -m kda_aot.bench`,
`python -m kda_aot.bench_op`, `python -m kda_aot.profile`; docs/benchmarks.md, docs/testing.md):
not part of the API. Each needs torch and a Hopper GPU and says in one line where it cannot run
(cli_checks.py)."""
