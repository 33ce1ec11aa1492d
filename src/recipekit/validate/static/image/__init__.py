"""The ``image.*`` checks: the Dockerfile's pins against torch_npu's compatibility table, the image's stack
against what its libraries declare, and the torch each architecture's image really gets.
"""
