"""The passes over logits or hidden states that compute a loss: the number rows and their sources,
the row algebra, the in-forward and recompute passes, and the kernels behind one dispatch."""
