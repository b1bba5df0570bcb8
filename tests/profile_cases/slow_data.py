"""Data supply: a Dataset that sleeps 10 ms per sample, read by 2 workers, feeding a tiny model: each batch of 16
takes at least 80 ms to arrive, the model's step well under 10."""
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(64), i % 10


torch.manual_seed(0)
model = torch.nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Slow(), batch_size=16, num_workers=2):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
