"""Stage memory: the estimate, the advice and the operations numbers."""
