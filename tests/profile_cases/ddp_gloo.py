"""Communication and framework configuration, on 2 gloo processes (torchrun): DDP with find_unused_parameters=True
though every parameter is used, a plain DataLoader without a DistributedSampler (every rank reads everything), and
a manual all-reduce of a large buffer every step (communication that overlaps nothing)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)),
            find_unused_parameters=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
stats = torch.zeros(8_000_000)
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=32, shuffle=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        dist.all_reduce(stats)
        optimizer.step()
dist.destroy_process_group()
