"""What a training loop touches: the crop Dataset, samplers, transforms and the DataLoader setup."""
