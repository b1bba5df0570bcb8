"""Launch-bound, on a GPU: a stack of 64 tiny layers (8 features, batch 8) on data already on the device. Each
kernel takes microseconds; the GPU waits for the CPU to launch the next one, so it is busy a small share of the time
while the step never waits for data. (On the GPU host: tests/test_profile.py's GPU test.)"""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(64)]).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(512, 8, device="cuda"), torch.randn(512, 8, device="cuda")
for step in range(100_000):
    i = (step * 8) % 512
    loss = torch.nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
