"""One training session, start to end: the Trainer's arguments, the resume choice, the data made ready, the
callbacks, the process group.
"""
