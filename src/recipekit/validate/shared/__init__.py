"""What the static checks and the dry run both stand on: the bundle read once, the results and their
findings, Volcano's job-controller rules, and child Pythons that never import the current directory.
"""
