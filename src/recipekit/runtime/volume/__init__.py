"""What a run leaves on the shared volume and who may trust it: signatures, recovery and row records, the
prepared dataset's manifest and its check, and re-sharding a checkpoint.
"""
