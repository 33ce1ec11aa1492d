"""Checkpoints and resume, as both sides read them: which ``checkpoint-N`` directories are complete, which run wrote
one, and which a restart continues from.

An inner room of the boundary because these two modules are one rule (a checkpoint a run may continue from), read
by the run's session and the volume's writers at run time and by the planner, the dry run's judges and ``rescale``
at build time; like the rest of the boundary, standard library only.
"""
