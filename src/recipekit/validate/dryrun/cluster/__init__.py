"""The simulated cluster: local processes as Volcano pods, the attempts the controller starts and kills, and
what each attempt was seen to do.
"""
