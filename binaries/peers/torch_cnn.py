"""Part 6's EMNIST CNN in PyTorch, for the peers that train with it (pfl-research's
PyTorch backend, Flower's PyTorch client): the layers of `tasks.emnist.cnn` (Conv 32
3x3, Conv 64 3x3, 2x2 max pooling, Dense 128, Dense 62; ReLUs; no dropout)."""

import numpy as np
import torch


class CNN(torch.nn.Module):
  def __init__(self, classes: int):
    super().__init__()
    self.layers = torch.nn.Sequential(
      torch.nn.Conv2d(1, 32, 3),
      torch.nn.ReLU(),
      torch.nn.Conv2d(32, 64, 3),
      torch.nn.ReLU(),
      torch.nn.MaxPool2d(2),
      torch.nn.Flatten(),
      torch.nn.Linear(64 * 12 * 12, 128),
      torch.nn.ReLU(),
      torch.nn.Linear(128, classes),
    )

  def forward(self, x):
    return self.layers(x)

  def loss(self, x, y, eval=False):  # noqa: A002 (pfl's keyword)
    return torch.nn.functional.cross_entropy(self(x), y)

  def metrics(self, x, y, eval=False):  # noqa: A002 (pfl asks for it; evaluation is off)
    return {}


def tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
  """A client's NHWC images and labels as PyTorch's NCHW float and int64 tensors."""
  return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))), torch.from_numpy(
    y.astype(np.int64)
  )
