"""Compute, with an evaluation pass under torch.no_grad() after every fifth training step whose DataLoader is slow
(5 ms a sample): the evaluation is not a training step, so it must not make the training loop look data-bound."""
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowEval(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.randn(512), 0


torch.manual_seed(0)
torch.set_num_threads(1)
train = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)], torch.nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(100):
    for i, (x, y) in enumerate(DataLoader(train, batch_size=256, shuffle=True)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 5 == 4:
            with torch.no_grad():
                for vx, _ in DataLoader(SlowEval(), batch_size=16):
                    model(vx)
