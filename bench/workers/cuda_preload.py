"""A preload that initialises CUDA (bench/gpu_fork_server.py): the fork server must refuse to fork after it."""

import torch

if torch.cuda.is_available():
    torch.zeros(1, device="cuda")
