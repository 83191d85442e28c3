# The torch.distributed backend "tutti".
