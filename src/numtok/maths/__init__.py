"""The Number Token Loss's mathematics: the settings (``LossSpec``), the per-position loss of each
kind (NTL-WAS, NTL-MSE, DEL, SMMD, DIST2), the place weights, and NTIL's terms (``ntil``)."""
