"""The teacher-labelled synthetic image set (``dblp.train.data.teacher_images``) is learnable: a small
model gets well above chance on held-out images; it has CIFAR's shape and storage and is the same on
every worker."""

from __future__ import annotations

import torch
import torch.nn as nn

from dblp.train import get_workload
from dblp.train.data import teacher_images


def test_a_small_model_learns_the_teacher_labels_well_above_chance():
    train, test = teacher_images(4096, 1024, 10, seed=0)
    assert train.x.shape == (4096, 3, 32, 32) and train.x.dtype == torch.uint8 and len(test) == 1024
    counts = torch.bincount(train.y, minlength=10)
    assert counts.min() > 0.1 * 4096 / 10  # every class present in a fair share, not one class
    torch.manual_seed(0)
    model = nn.Sequential(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(192, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def prep(x: torch.Tensor) -> torch.Tensor:
        return (x.float() / 255 - 0.5) / 0.25

    with torch.no_grad():
        before = float((model(prep(test.x)).argmax(1) == test.y).float().mean())
    for _ in range(10):
        perm = torch.randperm(len(train))
        for i in range(0, len(train), 64):
            idx = perm[i:i + 64]
            x = prep(train.x[idx])
            x = x.flip(-1) if i % 128 else x  # a mirrored image keeps its label (the CIFAR augmentation)
            loss = nn.functional.cross_entropy(model(x), train.y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        after = float((model(prep(test.x)).argmax(1) == test.y).float().mean())
    assert before < 0.2 and after > 0.5, (before, after)  # chance is 0.1


def test_same_seed_same_set_on_every_worker_and_the_workload_says_what_it_is():
    a, _ = teacher_images(256, 64, 100, seed=0)
    b, _ = teacher_images(256, 64, 100, seed=0)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    wl = get_workload("resnet50", data="teacher", data_size=300)
    assert (len(wl.train_set), len(wl.test_set)) == (300, 256) and wl.info["data"] == "teacher"
    assert "not CIFAR" in wl.info["data_limits"] and int(wl.train_set.y.max()) < 100
