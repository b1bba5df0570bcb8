"""Framework configuration: the model wrapped in torch.nn.DataParallel (on a CPU-only machine it runs the module
as it is; the wrapper is the finding)."""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(2048, 256), torch.randint(0, 10, (2048,)))
model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=64):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
