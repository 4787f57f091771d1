"""truestep: a PyTorch-native trainer whose promise is correct recovery."""

__version__ = "0.1.0"
