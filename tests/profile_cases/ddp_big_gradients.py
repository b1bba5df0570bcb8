"""Communication inside backward, on 2 gloo processes (torchrun): DDP over a model of 32M parameters with a tiny batch
and one bucket for every gradient (bucket_cap_mb=1024), so its all-reduce (128 MB per step) starts only when backward
has computed them all, overlaps nothing, and backward waits for it at its end. No collective is called from Python:
only DDP's own all-reduce can make this step communication-bound."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 4096), torch.randint(0, 10, (4096,)))
model = DDP(torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 3840),
                                torch.nn.ReLU(), torch.nn.Linear(3840, 10)), bucket_cap_mb=1024)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
sampler = DistributedSampler(data)
for epoch in range(100):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(data, batch_size=4, sampler=sampler):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
