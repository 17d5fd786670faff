"""Small jobs for `tests/test_watch_prometheus.py`, run under `gpuwise watch --prometheus`.

    python watch_prometheus_job.py loop STOP_FILE [MAX_S]
    torchrun --nproc_per_node 2 watch_prometheus_job.py ddp STOP_FILE [MAX_S]

`loop` (no torch; timed with `gpuwise.watch()`): each step waits 30 ms for its batch (a
sleeping loader) and computes for about 10 ms, so it is input-bound. `ddp` (torch, gloo, no
gpuwise code: the injection times it): rank 1's loader sleeps 30 ms a batch, so rank 1 is the
straggler. Both run until STOP_FILE exists, or MAX_S seconds (60 by default).
"""

import os
import sys
import time


def batches(stop: str, until: float):
    while not os.path.exists(stop) and time.monotonic() < until:
        time.sleep(0.03)
        yield [0.0] * 4


def loop(stop: str, until: float) -> None:
    import gpuwise

    with gpuwise.watch() as w:
        for batch in w.loader(batches(stop, until)):
            with w.phase("forward"):
                end = time.perf_counter() + 0.01
                while time.perf_counter() < end:
                    sum(batch)
    print("job done", flush=True)


def ddp(stop: str, until: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset

    class Sleepy(IterableDataset):
        def __init__(self, sleep_s: float) -> None:
            self.sleep_s = sleep_s

        def __iter__(self):
            # the same number of batches on every rank: the ranks agree when to stop
            for _ in range(2000):
                if self.sleep_s:
                    time.sleep(self.sleep_s)
                yield torch.randn(16, 64)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    flag = torch.zeros(1)
    for x in DataLoader(Sleepy(0.03 if rank == 1 else 0.0), batch_size=None):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        flag[0] = float(rank == 0 and (os.path.exists(stop) or time.monotonic() > until))
        dist.all_reduce(flag)  # rank 0 decides, every rank stops at the same step
        if flag.item():
            break
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    mode, stop_file = sys.argv[1], sys.argv[2]
    deadline = time.monotonic() + float(sys.argv[3] if len(sys.argv) > 3 else 60)
    (loop if mode == "loop" else ddp)(stop_file, deadline)
