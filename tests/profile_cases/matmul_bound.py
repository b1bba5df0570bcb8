"""Compute: in-memory tensors (no workers, nothing to wait for) through a stack of large matrix products."""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)], torch.nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=256, shuffle=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
