"""A DDP script (torchrun, gloo) whose learning rate is fixed at 0.01 whatever the world size, unless `--scale`:
profiled at one process and then at two against the first run as the baseline, the global batch doubles and the
learning rate must follow it."""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
lr = 0.01 * (dist.get_world_size() if "--scale" in sys.argv else 1)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
sampler = DistributedSampler(data)
for epoch in range(100):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(data, batch_size=32, sampler=sampler):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
