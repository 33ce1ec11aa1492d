"""The static checks of a built bundle: files and hashes, the Volcano Job, cross-file consistency, tensor
parallelism, monitoring, linters, the real libraries' reading, and the image.
"""
