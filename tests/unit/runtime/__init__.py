"""The runtime shipped in every bundle, piece by piece."""
