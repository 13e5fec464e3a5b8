"""Image classification: CIFAR ResNet-20/32 (or torchvision models) on CIFAR-10 or generated CIFAR-shaped data."""
