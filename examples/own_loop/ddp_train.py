"""A plain DDP training script: a small CNN with BatchNorm and dropout on generated
images, its own loop with gradient clipping and a scheduler. Run under torchrun:

    torchrun --standalone --nproc-per-node 2 ddp_train.py --steps 100
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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
    dist.init_process_group("gloo")
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    data = make_data()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, args.global_batch // dist.get_world_size(), sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
