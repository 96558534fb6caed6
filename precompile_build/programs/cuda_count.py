"""Prints how many CUDA GPUs torch sees (0 without CUDA): builder/runner.py's probe on a
host with the NVIDIA driver's device files but no nvidia-smi, run as
``python cuda_count.py`` so that the build process creates no CUDA context."""

import torch


def main() -> None:
    print(torch.cuda.device_count() if torch.cuda.is_available() else 0)


if __name__ == "__main__":
    main()
