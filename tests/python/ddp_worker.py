"""One rank of the distributed tests (test_distributed.py): torch.distributed with Gloo on
loopback; DistributedSampler takes its rank and world size from it.

    python ddp_worker.py OUT_DIR DATA MODE [STOP_AFTER]

MODE "epoch": two epochs; writes rank-R.json with each epoch's batches' indices.
MODE "stop": stops after STOP_AFTER batches of epoch 0 and torch.saves state-R.pt.
MODE "resume": loads state-(R mod old world).pt, writes the rest of that epoch and the next.
"""

import itertools
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import conveyor

out, data, mode = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
ds = conveyor.PatternDataset(int(data), sample_bytes=16)
sampler = conveyor.DistributedSampler(shuffle=True, seed=3)
loader = conveyor.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
assert (sampler.rank, sampler.num_replicas) == (rank, world)

epochs = []
if mode == "stop":
    stop_after = int(sys.argv[4])
    for batch in itertools.islice(loader, stop_after):  # takes exactly stop_after batches
        epochs.append(batch.indices)
        dist.barrier()  # the ranks step together, as in training
    torch.save({"loader": loader.state_dict(), "world": world}, f"{out}/state-{rank}.pt")
    epochs = [[i for b in epochs for i in b]]
else:
    if mode == "resume":
        old_world = int(sys.argv[4])
        saved = torch.load(f"{out}/state-{rank % old_world}.pt", weights_only=True)
        loader.load_state_dict(saved["loader"])
    for epoch in range(2):
        sampler.set_epoch(epoch)
        rows, batches = [], 0
        for batch in loader:
            assert batch.epoch == epoch
            rows += batch.indices
            batches += 1
        gathered = [None] * world
        dist.all_gather_object(gathered, batches)
        assert len(set(gathered)) == 1, f"unequal batch counts {gathered}"
        epochs.append(rows)
with open(f"{out}/{mode}-rank-{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "epochs": epochs, "batches": len(loader)}, f)
dist.destroy_process_group()
