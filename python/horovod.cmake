# tutti.horovod.torch: Horovod's PyTorch API.
