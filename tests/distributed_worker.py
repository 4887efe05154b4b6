"""One rank of the one-GPU multi-process tests of kda_aot.distributed (tests/gpu/test_distributed.py).

    python distributed_worker.py RANK WORLD INIT_FILE CASES_FILE OUT_DIR

Every rank uses cuda:0 and the gloo backend. The cases (inputs on the CPU) come from CASES_FILE
(torch.save); for every case of this world size the rank runs its slice and saves what it got to
OUT_DIR/<case>.<rank>.pt. Not a test module: the test starts it as a subprocess.
"""

import datetime
import sys

import torch
import torch.distributed as dist


def _poison_allocator():
    """Fill the caching allocator's free blocks with NaN so that anything the call forgets to
    write shows (allocations then reuse these blocks)."""
    x = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MiB
    del x


def main(rank: int, world: int, init_file: str, cases_file: str, out_dir: str) -> None:
    import kda_aot.distributed as kd

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    cases = torch.load(cases_file)
    for name, case in cases.items():
        if case["world"] != world:
            continue
        x = case["inputs"]
        off, t = case["slices"][rank]
        part = {n: x[n][:, off:off + t].cuda().contiguous() for n in ("q", "k", "v", "g", "beta")}
        init = x["initial_state"].cuda() if x["initial_state"] is not None else None
        _poison_allocator()
        out = torch.full((1, t, part["q"].shape[2], 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        res = kd.prefill(**part, A_log=x["A_log"].cuda(), dt_bias=x["dt_bias"].cuda(), lower_bound=x["lower_bound"],
                         initial_state=init, output_final_state=case["final"], token_offset=off,
                         seq_lens=case["lens"] if case["hint"] else None,
                         cu_seqlens=None if case["hint"] else x["cu_seqlens"].cuda(), cp=case["cp"], out=out)
        assert res.o is out
        torch.cuda.synchronize()
        torch.save(dict(o=res.o.cpu(), final_state=None if res.final_state is None else res.final_state.cpu(),
                        final_seqs=list(res.final_seqs), head_len=res.work.head_len, kind=res.work.kind),
                   f"{out_dir}/{name}.{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
