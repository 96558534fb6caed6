"""A tiny model: what the capture script captures and the tests serve."""

import torch


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def forward(model, x):
    """The captured call: ``model`` (its weights lifted to inputs) on ``x``."""
    return model(x)
