"""ddp_train.py converted to hetbench: per-rank slices sized to each device's speed, the
gradients the whole global batch's, every step recorded. Run under torchrun:

    torchrun --standalone --nproc-per-node 2 train.py --steps 100

or as a study: hetbench launch study.toml -- train.py --steps 100
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hetbench


def make_data(samples: int = 2048) -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    images = torch.randn(samples, 3, 32, 32, generator=generator)
    labels = (images.mean((2, 3)) @ torch.randn(3, 10, generator=generator)).argmax(1)
    return TensorDataset(images, labels)


def make_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()
    session = hetbench.join(global_batch=args.global_batch, loss_reduction="mean")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    data = make_data()
    model, optimizer, loader = session.prepare(model, optimizer, DataLoader(data))
    loss_fn = nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < args.steps:
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            session.backward(loss)
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    session.finish()


if __name__ == "__main__":
    main()
