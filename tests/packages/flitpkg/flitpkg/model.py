"""A tiny model: what the capture script captures and the tests serve. Its forward is
the library's public call, routed through the packaged target ``mlp`` where one
serves this host and this call (precompile_runtime.packaged), its own code otherwise."""

import torch

from precompile_runtime import packaged


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    @packaged("mlp")
    def forward(self, x):
        return torch.relu(self.fc(x)) * 2
