"""The public losses, one function and its module per file: token-level NTL, CE + NTL fused, its
linear form, the number head, the number-level loss, NTIL and Gaussian label smoothing."""
