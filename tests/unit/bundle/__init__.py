"""Stage bundle: the documents, the rendered files, the atomic write, sweeps and rescale."""
