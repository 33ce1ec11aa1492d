"""Judging a dry run's attempts: the training (start, finish, checkpoint, resume), the operations layer, and
the rows each step trained on.
"""
